//! `aipgw audit verify`: the audit log's signatures and chain checked (`crate::audit::verify`).

use std::path::PathBuf;

use super::shared::{failed, usage, Failure};

/// Verifies `files` under the keys in `keys` (comma-separated paths); prints what it
/// checked and how long it took, or the first record that breaks the chain (exit 1).
pub(super) fn verify(files: &[PathBuf], keys: &str) -> Result<(), Failure> {
    let keys = crate::audit::verify::load_keys(keys).map_err(usage)?;
    let started = tokio::time::Instant::now();
    let report = crate::audit::verify::verify(files, &keys).map_err(usage)?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let per_thousand = if report.records == 0 {
        0.0
    } else {
        ms * 1000.0 / report.records as f64
    };
    let seqs = report
        .seqs
        .map_or(String::new(), |(a, b)| format!(", records {a}..={b}"));
    let kids = report.kids.join(", ");
    match report.problem {
        None => {
            println!(
                "ok: {} records in {} file(s){seqs}, keys {kids}; {ms:.1} ms ({per_thousand:.2} ms per 1000 records)",
                report.records,
                files.len()
            );
            Ok(())
        }
        Some(p) => {
            println!("{p}");
            Err(failed(anyhow::anyhow!(
                "the audit chain is broken at {}:{} ({} records before it hold)",
                p.file.display(),
                p.line,
                report.records
            )))
        }
    }
}
