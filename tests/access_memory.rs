//! What a configured access-rule entry costs the running gateway (issue 38: at most 150
//! bytes; about 360 before the rules were compiled): the heap jemalloc counts as
//! allocated for a gateway whose Partner has 100,000 allow and 100,000 deny entries,
//! less that of the same gateway without them, per entry.
#![allow(missing_docs)]

use aipgw::config::Config;
use aipgw::test_util::{flush_thread_cache, heap_stats};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const ENTRIES: usize = 100_000;

/// The `i`th pattern of a kind.
type Entry = fn(usize) -> String;

fn config(dir: &std::path::Path, allow: &[String], deny: &[String]) -> String {
    let d = dir.display();
    let quoted = |l: &[String]| {
        l.iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        r#"
[listener]
bind = "127.0.0.1:1"
cert = "{d}/gateway.pem"
key = "{d}/gateway.key"
client_ca = ["{d}/ca.pem"]
[admin]
bind = ""
[[partner]]
name = "p"
prefix = "/p"
upstreams = ["http://127.0.0.1:9"]
[partner.access]
allow = [{}]
deny = [{}]
"#,
        quoted(allow),
        quoted(deny)
    )
}

/// Bytes a gateway loaded from the config `text` holds (what parsing it allocated on the
/// way is freed by then).
fn held(dir: &std::path::Path, text: &str) -> u64 {
    flush_thread_cache();
    let before = heap_stats().expect("jemalloc statistics").allocated;
    let gateway = aipgw::Gateway::new(Config::parse(text, dir).unwrap()).unwrap();
    flush_thread_cache();
    let during = heap_stats().expect("jemalloc statistics").allocated;
    drop(gateway);
    during.saturating_sub(before)
}

/// Per entry, for lists of these patterns.
fn per_entry(dir: &std::path::Path, allow: Vec<String>, deny: Vec<String>) -> f64 {
    let entries = (allow.len() + deny.len()) as f64;
    let bare = held(dir, &config(dir, &[], &[]));
    let with = held(dir, &config(dir, &allow, &deny));
    (with.saturating_sub(bare)) as f64 / entries
}

fn v1(i: usize) -> String {
    aipgw::identity::Aic::with_check_code(&format!("1000100001{i:020}"))
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "current_thread")]
async fn an_access_entry_costs_at_most_150_bytes() {
    let dir = tempfile::tempdir().unwrap();
    aipgw::devcerts::write_dev_certs(dir.path()).unwrap();
    let kinds: [(&str, Entry); 3] = [
        ("agent serial prefixes (22 characters)", |i| {
            format!("10001000011K9{i:09}*")
        }),
        ("whole v1 AICs", v1),
        ("dotted agent levels", |i| {
            format!("1.2.156.3088.1.34C2.ZZZZ.{:08}*", i + 1)
        }),
    ];
    for (kind, make) in kinds {
        let allow = (0..ENTRIES).map(make).collect();
        let deny = (ENTRIES..2 * ENTRIES).map(make).collect();
        let bytes = per_entry(dir.path(), allow, deny);
        println!("{kind}: {bytes:.1} bytes per entry");
        assert!(bytes <= 150.0, "{kind}: {bytes:.1} bytes per entry");
    }
}
