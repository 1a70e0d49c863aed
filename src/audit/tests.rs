//! The writer's own behaviour, with the tokio clock paused where time matters: a full
//! queue's gap record, quota refusals aggregated per AIC per interval and bounded.

use std::sync::Arc;
use std::time::Duration;

use aws_lc_rs::signature::Ed25519KeyPair;
use base64::prelude::*;
use serde_json::Value;

use super::record::Event;
use super::{Audit, AuditSettings, Caller};
use crate::metrics::Metrics;

fn settings(dir: &std::path::Path, queue: usize, quota_max_aics: usize) -> AuditSettings {
    let pkcs8 = Ed25519KeyPair::generate().unwrap().to_pkcs8().unwrap();
    let pem = format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        BASE64_STANDARD.encode(pkcs8.as_ref())
    );
    let key = dir.join("audit.key");
    std::fs::write(&key, pem).unwrap();
    AuditSettings {
        file: dir.join("audit.log"),
        key,
        kid: Some("test-key".into()),
        aic: "GATEWAY".into(),
        queue,
        max_file_bytes: 1 << 20,
        max_files: 2,
        quota_interval: Duration::from_secs(10),
        quota_max_aics,
        repeat_limit: 10,
    }
}

fn records(s: &AuditSettings) -> Vec<Value> {
    std::fs::read_to_string(&s.file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn action(r: &Value) -> &str {
    r["body"]["action"]["name"].as_str().unwrap()
}

fn reload() -> Event {
    Event::Reload {
        path: "gw.toml".into(),
        sha256: None,
        error: None,
    }
}

#[tokio::test]
async fn a_full_queue_loses_records_counts_them_and_says_so_in_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path(), 2, 10);
    let metrics = Arc::new(Metrics::new());
    let audit = Audit::open(Some(&s), metrics.clone()).unwrap();
    // The writer is not running yet: two fit, five are lost.
    for _ in 0..7 {
        audit.record(reload());
    }
    assert_eq!(metrics.audit.dropped.get(), 5);
    let writer = tokio::spawn(audit.writer().unwrap());
    audit.stop(Duration::from_secs(10)).await;
    writer.await.unwrap();
    let recs = records(&s);
    let actions: Vec<&str> = recs.iter().map(action).collect();
    assert_eq!(
        actions,
        [
            "gateway.start",
            "audit.gap",
            "config.reload",
            "config.reload",
            "gateway.stop"
        ]
    );
    assert_eq!(recs[1]["attributes"]["audit.lost"], 5);
    assert_eq!(recs[1]["body"]["result"]["status"], "unknown");
    assert_eq!(metrics.audit.records.get(), 5);
}

fn caller(aic: &str) -> Caller {
    Caller {
        aic: Some(aic.into()),
        ip: "192.0.2.7".parse().unwrap(),
        method: Some("rpc"),
        partner: None,
        task: None,
        trace_id: None,
    }
}

#[tokio::test(start_paused = true)]
async fn quota_refusals_are_one_record_per_aic_per_interval_within_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path(), 16, 2);
    let metrics = Arc::new(Metrics::new());
    let audit = Audit::open(Some(&s), metrics.clone()).unwrap();
    let writer = tokio::spawn(audit.writer().unwrap());
    let limited = crate::error::GatewayError::RateLimited {
        reason: "aic_rate",
        retry_after: Duration::from_secs(1),
        body_unread: false,
    };
    // A flood from two AICs, and a few from AICs past `quota_max_aics` (2).
    for (aic, n) in [("A", 1000), ("B", 50), ("C", 3), ("D", 4)] {
        for _ in 0..n {
            audit.refused(&limited, caller(aic));
        }
    }
    // Nothing queued per refusal: only the start record so far.
    assert_eq!(metrics.audit.dropped.get(), 0);
    // One interval later (the paused clock moves on when everything waits), one record
    // per AIC and one for the rest.
    while metrics.audit.records.get() < 4 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    audit.stop(Duration::from_secs(10)).await;
    writer.await.unwrap();
    let recs = records(&s);
    let mut counts: Vec<(String, u64)> = recs
        .iter()
        .filter(|r| action(r) == "quota.limit")
        .map(|r| {
            let who = r["body"]["actor"]["id"].as_str().unwrap().to_owned();
            (who, r["attributes"]["audit.count"].as_u64().unwrap())
        })
        .collect();
    counts.sort();
    assert_eq!(
        counts,
        [("*".into(), 7), ("A".into(), 1000), ("B".into(), 50)]
    );
    assert_eq!(recs.len(), 5, "start, three quota records, stop");
    let quota = recs
        .iter()
        .find(|r| r["body"]["actor"]["id"] == "A")
        .unwrap();
    assert_eq!(quota["attributes"]["audit.windowSeconds"], 10);
    assert_eq!(quota["body"]["actor"]["ip"], "192.0.2.7");
}

fn anonymous(ip: &str) -> Caller {
    Caller {
        aic: None,
        ip: ip.parse().unwrap(),
        method: None,
        partner: None,
        task: None,
        trace_id: None,
    }
}

/// A flood of refusals that need no certificate (identity) or come from one AIC (block
/// list): past `audit.repeat_limit` per kind and caller they are counted and written as
/// one record per interval, callers past `quota_max_aics` together, so a flood cannot
/// rotate the trail away. Before, every refusal was a record of its own.
#[tokio::test(start_paused = true)]
async fn repeated_refusals_past_the_limit_are_one_record_per_kind_and_caller_per_interval() {
    use crate::error::GatewayError;
    use crate::identity::CredentialError;
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path(), 64, 2);
    s.repeat_limit = 3;
    let metrics = Arc::new(Metrics::new());
    let audit = Audit::open(Some(&s), metrics.clone()).unwrap();
    let writer = tokio::spawn(audit.writer().unwrap());
    let blocked = GatewayError::InvalidCredential(CredentialError::Blocked);
    for _ in 0..100 {
        audit.refused(
            &GatewayError::AuthenticationRequired,
            anonymous("198.51.100.1"),
        );
    }
    for _ in 0..5 {
        audit.refused(&blocked, caller("B"));
    }
    // Two more callers, past the bound of two counted apart.
    for ip in ["198.51.100.2", "198.51.100.3"] {
        audit.refused(&GatewayError::AuthenticationRequired, anonymous(ip));
    }
    // The start, three of each kind in full, then at the interval's end one record per
    // kind and caller past the limit and one for the callers past the bound.
    while metrics.audit.records.get() < 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    audit.stop(Duration::from_secs(10)).await;
    writer.await.unwrap();
    let recs = records(&s);
    assert_eq!(recs.len(), 11, "start, 6 in full, 3 counted, stop");
    let full: Vec<&str> = recs[1..7].iter().map(action).collect();
    assert_eq!(
        full,
        ["identity.verify"; 3]
            .into_iter()
            .chain(["identity.blocklist"; 3])
            .collect::<Vec<_>>()
    );
    assert!(recs[1..7]
        .iter()
        .all(|r| r["attributes"].get("audit.count").is_none()));
    let mut counted: Vec<(String, String, u64)> = recs[7..10]
        .iter()
        .map(|r| {
            assert_eq!(r["attributes"]["audit.windowSeconds"], 10);
            (
                action(r).to_owned(),
                r["body"]["actor"]["id"].as_str().unwrap_or("").to_owned(),
                r["attributes"]["audit.count"].as_u64().unwrap(),
            )
        })
        .collect();
    counted.sort();
    assert_eq!(
        counted,
        [
            ("identity.blocklist".into(), "B".into(), 2),
            ("identity.verify".into(), "*".into(), 2),
            ("identity.verify".into(), "198.51.100.1".into(), 97),
        ]
    );
}

#[test]
fn the_signed_form_is_rfc_8785() {
    // RFC 8785's own number examples (section 3.2.2.3) and key order (UTF-16 code units).
    let v: Value = serde_json::from_str(
        r#"{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001,-0.0,1.0],
            "b":"\u20ac","a":{"z":true,"é":null,"A":"x"}}"#,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(super::record::canonical(&v)).unwrap(),
        r#"{"a":{"A":"x","z":true,"é":null},"b":"€","numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27,0,1]}"#
    );
}

#[test]
fn a_sealed_line_is_the_jcs_form_of_the_signed_record() {
    let dir = tempfile::tempdir().unwrap();
    let s = settings(dir.path(), 1, 1);
    let signer = super::key::Signer::load(&s.key, Some("kid \"quoted\" é")).unwrap();
    let mut chain = super::record::Chain::default();
    for event in [Event::Start, reload(), Event::Gap { lost: 3 }] {
        let rec = super::record::record("GATEWAY", &event);
        let line = super::record::seal(rec, &signer, &mut chain);
        let v: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(line.as_bytes(), super::record::canonical(&v), "{line}");
        assert_eq!(v["integrity"]["kid"], "kid \"quoted\" é");
        // Made by splicing the signature in, not by a second canonical pass.
        let mut unsigned = v.clone();
        let sig = unsigned["integrity"]
            .as_object_mut()
            .unwrap()
            .remove("sig")
            .unwrap();
        let signed = super::record::canonical(&unsigned);
        let spliced = super::record::with_sig(&signed, signer.kid(), sig.as_str().unwrap());
        assert_eq!(spliced.as_deref(), Some(line.as_bytes()));
    }
}
