//! `aipgw audit verify FILE... --key PUBKEY[,PUBKEY2]`: every record's signature under
//! one of the keys, and the chain through the files in the order given (rotated files
//! first: `FILE.2 FILE.1 FILE`). The first record that breaks it is named, with what
//! happened to it: changed (its signature, or the hash the next record carries, no longer
//! matches), removed (a gap in `audit.seq`), inserted (a record that does not belong
//! between its neighbours, or a copy of one), reordered (a record found out of its
//! place), truncated (a line cut short), or signed by a key no rotation record named.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::key::Verifier;
use super::record::{canonical, PREV, SEQ};

/// What happened to the first record that breaks the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breach {
    /// Its bytes were changed.
    Changed,
    /// Records before it are missing.
    Removed,
    /// It does not belong there.
    Inserted,
    /// It is out of its place.
    Reordered,
    /// Its line is cut short.
    Truncated,
    /// Signed by a key that no rotation record introduced.
    UnannouncedKey,
}

impl fmt::Display for Breach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Breach::Changed => "changed",
            Breach::Removed => "removed",
            Breach::Inserted => "inserted",
            Breach::Reordered => "reordered",
            Breach::Truncated => "truncated",
            Breach::UnannouncedKey => "unannounced key",
        })
    }
}

/// Where and what.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The file.
    pub file: PathBuf,
    /// The line (from 1).
    pub line: usize,
    /// The record's `audit.seq`, when it could be read.
    pub seq: Option<u64>,
    /// What happened.
    pub breach: Breach,
    /// In words.
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if let Some(s) = self.seq {
            write!(f, "record {s}: ")?;
        }
        write!(f, "{}: {}", self.breach, self.detail)
    }
}

/// What a verification found.
#[derive(Debug, Clone)]
pub struct Report {
    /// Records checked (up to the first problem).
    pub records: u64,
    /// The first `audit.seq` and the last one checked.
    pub seqs: Option<(u64, u64)>,
    /// Key ids seen, in order.
    pub kids: Vec<String>,
    /// The first problem, if any.
    pub problem: Option<Problem>,
}

/// One line of one file.
struct Entry<'a> {
    file: &'a Path,
    line: usize,
    bytes: &'a [u8],
    /// Followed by a newline.
    complete: bool,
}

/// A line read as a record.
#[derive(Clone)]
struct Parsed {
    seq: u64,
    prev: Option<String>,
    kid: String,
    /// `after.kid` of a key rotation record.
    rotates_to: Option<String>,
}

/// Loads the public keys named (comma-separated paths).
pub fn load_keys(list: &str) -> anyhow::Result<Vec<KeyHandle>> {
    list.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| Verifier::load(Path::new(p)).map(KeyHandle))
        .collect()
}

/// A public key `verify` accepts.
#[derive(Debug, Clone)]
pub struct KeyHandle(pub(crate) Verifier);

/// Verifies `files` (in chain order) under `keys`.
pub fn verify(files: &[PathBuf], keys: &[KeyHandle]) -> anyhow::Result<Report> {
    let texts = files
        .iter()
        .map(|f| std::fs::read(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display())))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut entries = Vec::new();
    for (file, text) in files.iter().zip(&texts) {
        let mut rest: &[u8] = text;
        let mut line = 0;
        while !rest.is_empty() {
            line += 1;
            let (bytes, complete, next) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], true, &rest[i + 1..]),
                None => (rest, false, &rest[rest.len()..]),
            };
            entries.push(Entry {
                file,
                line,
                bytes,
                complete,
            });
            rest = next;
        }
    }
    let verdicts = signatures(&entries, keys);
    Ok(check(&entries, &verdicts))
}

/// Each complete line parsed and its signature checked, on every core the process may
/// use (the signatures are independent; Ed25519 verification is most of the work).
fn signatures(entries: &[Entry<'_>], keys: &[KeyHandle]) -> Vec<Result<Parsed, String>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = entries.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = entries
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|e| parse_and_verify(e.bytes, keys))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts
            .into_iter()
            .flat_map(|h| h.join().expect("a verifying thread does not panic"))
            .collect()
    })
}

fn check(entries: &[Entry<'_>], verdicts: &[Result<Parsed, String>]) -> Report {
    let mut report = Report {
        records: 0,
        seqs: None,
        kids: Vec::new(),
        problem: None,
    };
    let mut prev_hash: Option<String> = None;
    let mut expected: Option<u64> = None;
    let mut kid: Option<String> = None;
    let mut announced: Option<String> = None;
    let mut seen = std::collections::HashSet::new();
    for (i, e) in entries.iter().enumerate() {
        let problem = |breach, seq, detail: String| Problem {
            file: e.file.to_path_buf(),
            line: e.line,
            seq,
            breach,
            detail,
        };
        if !e.complete {
            report.problem = Some(problem(
                Breach::Truncated,
                None,
                "the last line is cut short (no newline)".into(),
            ));
            return report;
        }
        let p = match &verdicts[i] {
            Ok(p) => p.clone(),
            Err(why) => {
                let why = why.clone();
                // A forged line between two records that still chain to each other was
                // inserted; otherwise this record's bytes changed.
                let next_chains = entries
                    .get(i + 1)
                    .and_then(|n| serde_json::from_slice::<Value>(n.bytes).ok())
                    .and_then(|v| v["attributes"][PREV].as_str().map(str::to_owned));
                let breach = if next_chains.is_some() && next_chains == prev_hash {
                    Breach::Inserted
                } else {
                    Breach::Changed
                };
                report.problem = Some(problem(breach, None, why));
                return report;
            }
        };
        if let Some(want) = expected {
            if p.seq > want {
                let later = entries[i + 1..]
                    .iter()
                    .filter_map(|n| serde_json::from_slice::<Value>(n.bytes).ok())
                    .any(|v| v["attributes"][SEQ].as_u64() == Some(want));
                report.problem = Some(if later {
                    problem(
                        Breach::Reordered,
                        Some(p.seq),
                        format!("record {want} was expected here; it comes later"),
                    )
                } else {
                    let n = p.seq - want;
                    problem(
                        Breach::Removed,
                        Some(p.seq),
                        format!(
                            "{n} record(s) before it are missing (records {want}..{})",
                            p.seq - 1
                        ),
                    )
                });
                return report;
            }
            if p.seq < want {
                report.problem = Some(if seen.contains(&p.seq) {
                    problem(
                        Breach::Inserted,
                        Some(p.seq),
                        format!("a second record {} (record {want} was expected)", p.seq),
                    )
                } else {
                    problem(
                        Breach::Reordered,
                        Some(p.seq),
                        format!("record {want} was expected here"),
                    )
                });
                return report;
            }
            if p.prev != prev_hash {
                let before = &entries[i - 1];
                report.problem = Some(Problem {
                    file: before.file.to_path_buf(),
                    line: before.line,
                    seq: Some(want - 1),
                    breach: Breach::Changed,
                    detail: format!("its line no longer hashes to what record {} carries", p.seq),
                });
                return report;
            }
        }
        if let Some(k) = &kid {
            let rotation_here = p.rotates_to.as_deref() == Some(p.kid.as_str());
            if *k != p.kid && announced.as_deref() != Some(p.kid.as_str()) && !rotation_here {
                report.problem = Some(problem(
                    Breach::UnannouncedKey,
                    Some(p.seq),
                    format!(
                        "signed by {} after {k}, with no rotation record naming it",
                        p.kid
                    ),
                ));
                return report;
            }
        }
        if !report.kids.contains(&p.kid) {
            report.kids.push(p.kid.clone());
        }
        announced = p.rotates_to.clone();
        kid = Some(p.kid);
        seen.insert(p.seq);
        expected = Some(p.seq + 1);
        prev_hash = Some(crate::identity::sha256_hex(e.bytes));
        report.records += 1;
        report.seqs = Some(report.seqs.map_or((p.seq, p.seq), |(a, _)| (a, p.seq)));
    }
    report
}

/// The record on a line, its signature checked.
fn parse_and_verify(bytes: &[u8], keys: &[KeyHandle]) -> Result<Parsed, String> {
    let mut v: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not a JSON record ({e})"))?;
    let integrity = v
        .get_mut("integrity")
        .and_then(Value::as_object_mut)
        .ok_or("no integrity")?;
    let sig = match integrity.remove("sig") {
        Some(Value::String(s)) => s,
        _ => return Err("no integrity.sig".into()),
    };
    let kid = integrity
        .get("kid")
        .and_then(Value::as_str)
        .ok_or("no integrity.kid")?
        .to_owned();
    let message = canonical(&v);
    // The key whose derived id is the record's first, then every other.
    let mut order: Vec<&KeyHandle> = keys.iter().filter(|k| k.0.derived_kid == kid).collect();
    order.extend(keys.iter().filter(|k| k.0.derived_kid != kid));
    if !order.iter().any(|k| k.0.verifies(&message, &sig)) {
        return Err(format!(
            "its signature (kid {kid}) does not verify under any key given"
        ));
    }
    let seq = v["attributes"][SEQ]
        .as_u64()
        .ok_or_else(|| format!("no attributes.{SEQ}"))?;
    let prev = v["attributes"][PREV].as_str().map(str::to_owned);
    let rotates_to = (v["body"]["action"]["name"] == "audit.key_rotate")
        .then(|| {
            v["body"]["target"]["after"]["kid"]
                .as_str()
                .map(str::to_owned)
        })
        .flatten();
    Ok(Parsed {
        seq,
        prev,
        kid,
        rotates_to,
    })
}
