//! Issue 34, item 3: the audit log. Real refusals from a running gateway over real
//! sockets, each an AMP `audit` record, signed and chained; `aipgw audit verify`'s
//! checks against every kind of tampering (a byte changed, a record removed, two
//! swapped, a forged one inserted, a copy inserted, the file truncated), across a
//! restart, a rotation and a key rotation.

use std::path::{Path, PathBuf};

use aipgw::audit::verify::{load_keys, verify, Breach, Report};
use aipgw::devcerts::CertSpec;
use base64::prelude::*;
use serde_json::Value;

use crate::support::*;

/// An Ed25519 key pair written as PKCS#8 PEM (private) and SPKI PEM (public).
fn keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
    let pair = Ed25519KeyPair::generate().unwrap();
    let pkcs8 = pair.to_pkcs8().unwrap();
    let mut spki = vec![
        0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
    ];
    spki.extend_from_slice(pair.public_key().as_ref());
    let pem = |label: &str, der: &[u8]| {
        let b64 = BASE64_STANDARD.encode(der);
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        format!(
            "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
            lines.join("\n")
        )
    };
    let private = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    std::fs::write(&private, pem("PRIVATE KEY", pkcs8.as_ref())).unwrap();
    std::fs::write(&public, pem("PUBLIC KEY", &spki)).unwrap();
    (private, public)
}

/// A PKI, an echoing Partner, an audit key pair and the audit file's path.
async fn setup() -> (Pki, TestPartner, (PathBuf, PathBuf), PathBuf) {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let pair = keypair(pki.dir.path(), "audit");
    let file = pki.dir.path().join("audit.log");
    (pki, partner, pair, file)
}

fn audit_section(file: &Path, key: &Path, extra: &str) -> String {
    format!(
        "[audit]\nfile = \"{}\"\nkey = \"{}\"\naic = \"{GATEWAY_AIC}\"\n{extra}\n",
        file.display(),
        key.display()
    )
}

/// A gateway config: block list (LEADER_B), a Partner only LEADER_A may call, a quota of
/// one request, and the audit log.
fn config(pki: &Pki, partner: &str, audit: &str) -> String {
    let p = format!(
        "[policy]\nblocked = [\"{LEADER_B}\"]\n[ratelimit]\nrate = 0.01\nburst = 1\n{audit}{}{}",
        partner_block("open", "/open", partner, ""),
        partner_block(
            "closed",
            "/closed",
            partner,
            &format!("[partner.access]\nallow = [\"{}\"]", "10009*")
        ),
    );
    pki.config("", &p)
}

fn records(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn action(r: &Value) -> &str {
    r["body"]["action"]["name"].as_str().unwrap()
}

/// The actions of the file's records, in order.
fn actions(file: &Path) -> Vec<String> {
    records(file).iter().map(|r| action(r).to_owned()).collect()
}

/// Makes one refusal of each kind and stops the gateway (its stop record written).
async fn refusals(pki: &Pki, cfg: &str) {
    let mut gw = start_gateway(cfg).await;
    let a = pki.leader(LEADER_A, false);
    let b = pki.leader(LEADER_B, false);
    let anonymous = Leader::new(pki, None, false);
    // No certificate: identity.
    let r = anonymous
        .post(gw.addr, "/open/rpc", &rpc_start("1", LEADER_A, "t0"))
        .await
        .unwrap();
    assert_eq!(r.error().0, -32008);
    // Blocked.
    let r = b
        .post(gw.addr, "/open/rpc", &rpc_start("1", LEADER_B, "t1"))
        .await
        .unwrap();
    assert_eq!(r.error(), (-32010, "blocked".into()));
    // Access rule.
    let r = a
        .post(gw.addr, "/closed/rpc", &rpc_start("1", LEADER_A, "t2"))
        .await
        .unwrap();
    assert_eq!(r.error().0, -32009);
    // Quota (the one request allowed went to `closed`): refusals, one aggregated record.
    for i in 0..3 {
        let r = a
            .post(
                gw.addr,
                "/open/rpc",
                &rpc_start("1", LEADER_A, &format!("q{i}")),
            )
            .await
            .unwrap();
        assert_eq!(r.error().0, -32029, "request {i}");
    }
    gw.shutdown().await.unwrap().unwrap();
}

fn check(files: &[&Path], keys: &[&Path]) -> Report {
    let keys = keys
        .iter()
        .map(|k| k.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let files: Vec<PathBuf> = files.iter().map(|f| f.to_path_buf()).collect();
    verify(&files, &load_keys(&keys).unwrap()).unwrap()
}

fn breach(report: &Report) -> (Breach, usize) {
    let p = report.problem.as_ref().expect("a problem found");
    (p.breach, p.line)
}

#[tokio::test]
async fn refusals_become_signed_chained_audit_records() {
    let (pki, partner, (key, public), file) = setup().await;
    refusals(
        &pki,
        &config(&pki, &partner.url(), &audit_section(&file, &key, "")),
    )
    .await;
    let recs = records(&file);
    let actions: Vec<&str> = recs.iter().map(action).collect();
    assert_eq!(
        actions,
        [
            "gateway.start",
            "identity.verify",
            "identity.blocklist",
            "policy.access",
            "quota.limit",
            "gateway.stop"
        ]
    );
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r["logType"], "audit");
        assert_eq!(r["aic"], GATEWAY_AIC);
        assert_eq!(r["integrity"]["alg"], "EdDSA");
        assert_eq!(r["attributes"]["audit.seq"], i as u64);
        assert_eq!(r["attributes"].get("audit.prevHash").is_some(), i > 0);
    }
    let blocked = &recs[2]["body"];
    assert_eq!(blocked["actor"]["id"], LEADER_B);
    assert_eq!(blocked["actor"]["ip"], "127.0.0.1");
    assert_eq!(blocked["result"]["status"], "failure");
    assert_eq!(blocked["result"]["reason"], "blocked");
    assert_eq!(recs[1]["body"]["actor"]["type"], "unauthenticated");
    assert_eq!(
        recs[3]["body"]["target"],
        serde_json::json!({"type": "partner", "id": "closed"})
    );
    // Three quota refusals of one AIC: one record with their count.
    assert_eq!(recs[4]["body"]["actor"]["id"], LEADER_A);
    assert_eq!(recs[4]["attributes"]["audit.count"], 3);
    let report = check(&[&file], &[&public]);
    assert!(report.problem.is_none(), "{:?}", report.problem);
    assert_eq!(report.records, 6);
    // Another key does not verify them.
    let (_, stranger) = keypair(pki.dir.path(), "stranger");
    assert_eq!(breach(&check(&[&file], &[&stranger])), (Breach::Changed, 1));
}

/// Rewrites `file` with its lines passed through `f`.
fn tamper(file: &Path, out: &Path, f: impl FnOnce(&mut Vec<String>)) {
    let text = std::fs::read_to_string(file).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    f(&mut lines);
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(out, text).unwrap();
}

#[tokio::test]
async fn every_kind_of_tampering_is_named_where_it_happened() {
    let (pki, partner, (key, public), file) = setup().await;
    refusals(
        &pki,
        &config(&pki, &partner.url(), &audit_section(&file, &key, "")),
    )
    .await;
    let t = pki.dir.path().join("tampered.log");
    let run = |f: &dyn Fn(&mut Vec<String>)| {
        tamper(&file, &t, f);
        breach(&check(&[&t], &[&public]))
    };
    // A byte changed in a record's body: its signature fails.
    assert_eq!(
        run(&|l| l[2] = l[2].replace("\"blocked\"", "\"bl0cked\"")),
        (Breach::Changed, 3)
    );
    // Whitespace added: the signature (over the canonical form) still holds, the hash
    // the next record carries does not.
    assert_eq!(
        run(&|l| l[2] = l[2].replacen('{', "{ ", 1)),
        (Breach::Changed, 3)
    );
    // A record removed.
    assert_eq!(run(&|l| drop(l.remove(2))), (Breach::Removed, 3));
    // Two swapped.
    assert_eq!(run(&|l| l.swap(2, 3)), (Breach::Reordered, 3));
    // A copy of a genuine record inserted.
    assert_eq!(
        run(&|l| {
            let copy = l[1].clone();
            l.insert(4, copy)
        }),
        (Breach::Inserted, 5)
    );
    // A forged record inserted between two that still chain.
    assert_eq!(
        run(&|l| {
            let forged = l[2].replace("\"blocked\"", "\"forged\"");
            l.insert(2, forged)
        }),
        (Breach::Inserted, 3)
    );
    // Truncated in the middle of a line.
    let text = std::fs::read(&file).unwrap();
    std::fs::write(&t, &text[..text.len() - 40]).unwrap();
    assert_eq!(breach(&check(&[&t], &[&public])), (Breach::Truncated, 6));
    // Untouched: it holds.
    assert!(check(&[&file], &[&public]).problem.is_none());
}

#[tokio::test]
async fn the_chain_goes_on_across_a_restart_and_a_tampered_past_is_found() {
    let (pki, partner, (key, public), file) = setup().await;
    let cfg = config(&pki, &partner.url(), &audit_section(&file, &key, ""));
    refusals(&pki, &cfg).await;
    let first_run = records(&file).len();
    refusals(&pki, &cfg).await;
    let recs = records(&file);
    assert_eq!(recs.len(), 2 * first_run);
    assert_eq!(action(&recs[first_run]), "gateway.start");
    assert_eq!(recs[first_run]["attributes"]["audit.seq"], first_run as u64);
    let report = check(&[&file], &[&public]);
    assert!(report.problem.is_none(), "{:?}", report.problem);
    // The first run's last record (its stop) removed while the gateway was down: the
    // second run's start names the gap.
    let t = pki.dir.path().join("tampered.log");
    tamper(&file, &t, |l| drop(l.remove(first_run - 1)));
    assert_eq!(
        breach(&check(&[&t], &[&public])),
        (Breach::Removed, first_run)
    );
}

#[tokio::test]
async fn rotated_files_make_one_chain() {
    let (pki, partner, (key, public), file) = setup().await;
    let extra = "max_file_bytes = 4096\nmax_files = 20";
    let cfg = config(&pki, &partner.url(), &audit_section(&file, &key, extra));
    for _ in 0..3 {
        refusals(&pki, &cfg).await;
    }
    let mut files = vec![];
    let mut n = 1;
    loop {
        let f = PathBuf::from(format!("{}.{n}", file.display()));
        if !f.exists() {
            break;
        }
        files.insert(0, f);
        n += 1;
    }
    assert!(files.len() >= 2, "rotated into {} files", files.len());
    files.push(file.clone());
    for f in &files {
        assert!(std::fs::metadata(f).unwrap().len() <= 4096);
    }
    let all: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let report = check(&all, &[&public]);
    assert!(report.problem.is_none(), "{:?}", report.problem);
    assert_eq!(report.records, 18);
    // A rotated file left out: the next file's first record names the gap.
    let mut without = all.clone();
    without.remove(1);
    assert_eq!(breach(&check(&without, &[&public])).0, Breach::Removed);
    // Files out of order.
    let mut swapped = all.clone();
    swapped.swap(0, 1);
    assert!(check(&swapped, &[&public]).problem.is_some());
}

#[tokio::test]
async fn a_key_rotated_by_reload_is_announced_by_the_old_key() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let (old_key, old_pub) = keypair(pki.dir.path(), "old");
    let (new_key, new_pub) = keypair(pki.dir.path(), "new");
    let file = pki.dir.path().join("audit.log");
    let path = pki.write(
        "gw.toml",
        &config(&pki, &partner.url(), &audit_section(&file, &old_key, "")),
    );
    let mut gw = start_gateway_from_file(&path).await;
    let b = pki.leader(LEADER_B, false);
    let r = b
        .post(gw.addr, "/open/rpc", &rpc_start("1", LEADER_B, "t1"))
        .await
        .unwrap();
    assert_eq!(r.error().1, "blocked");
    replace_file(
        &path,
        &config(&pki, &partner.url(), &audit_section(&file, &new_key, "")),
    );
    wait_reloads(&gw, "ok", 1).await;
    let r = b
        .post(gw.addr, "/open/rpc", &rpc_start("1", LEADER_B, "t2"))
        .await
        .unwrap();
    assert_eq!(r.error().1, "blocked");
    gw.shutdown().await.unwrap().unwrap();
    let recs = records(&file);
    assert_eq!(
        actions(&file),
        [
            "gateway.start",
            "identity.blocklist",
            "config.reload",
            "audit.key_rotate",
            "identity.blocklist",
            "gateway.stop"
        ]
    );
    // The reload record carries the new file's digest.
    let digest = aipgw::identity::sha256_hex(&std::fs::read(&path).unwrap());
    assert_eq!(
        recs[2]["body"]["target"]["after"]["sha256"],
        digest.as_str()
    );
    // The rotation is signed by the old key, what follows by the new one.
    let (old_kid, new_kid) = (
        recs[0]["integrity"]["kid"].as_str().unwrap(),
        recs[4]["integrity"]["kid"].as_str().unwrap(),
    );
    assert_ne!(old_kid, new_kid);
    assert_eq!(recs[3]["integrity"]["kid"], old_kid);
    assert_eq!(recs[3]["body"]["target"]["after"]["kid"], new_kid);
    let report = check(&[&file], &[&old_pub, &new_pub]);
    assert!(report.problem.is_none(), "{:?}", report.problem);
    assert_eq!(report.kids, [old_kid, new_kid]);
    // Without the new key, the first record it signed fails.
    assert_eq!(breach(&check(&[&file], &[&old_pub])), (Breach::Changed, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_turned_over_on_an_open_connection_is_recorded() {
    use crate::revocation::{crl, wait_fetches, CrlServer};
    let (pki, partner, (key, public), file) = setup().await;
    let server = CrlServer::start(crl(&pki.ca, &[])).await;
    let url = server.url();
    let revocation = format!(
        "[revocation]\ncrl_urls = [\"{url}\"]\nrefresh_interval = \"200ms\"\nretry_interval = \"50ms\"\nfetch_timeout = \"2s\"\n"
    );
    let cfg = pki.config(
        "",
        &format!(
            "{revocation}{}{}",
            audit_section(&file, &key, ""),
            partner_block("p", "/p", &partner.url(), "")
        ),
    );
    let mut gw = start_gateway(&cfg).await;
    wait_fetches(&gw, &url, "ok", 0.0).await;
    let mut spec = CertSpec::leader_v2(LEADER_A);
    spec.serial = Some(0xC0FFEE);
    let leader = Leader::new(&pki, Some(&pki.issue(&spec)), true);
    let (mut conn, _) = leader.h2_connection(gw.addr).await;
    let body = rpc_start("1", LEADER_A, "t");
    assert_eq!(send_on(&mut conn, "/p/rpc", &body).await.status, 200);
    server.serve(crl(&pki.ca, &[0xC0FFEE]));
    let r = refused_on(&mut conn, &body).await;
    assert_eq!(r.error(), (-32010, "revoked".into()));
    gw.shutdown().await.unwrap().unwrap();
    let recs = records(&file);
    let actions: Vec<&str> = recs.iter().map(action).collect();
    assert_eq!(
        actions,
        [
            "gateway.start",
            "identity.reverify",
            "identity.verify",
            "gateway.stop"
        ]
    );
    let turned = &recs[1]["body"];
    assert_eq!(turned["actor"]["id"], LEADER_A);
    assert_eq!(turned["target"]["type"], "connection");
    assert_eq!(
        turned["target"]["before"],
        serde_json::json!({ "aic": LEADER_A })
    );
    assert_eq!(
        turned["target"]["after"],
        serde_json::json!({ "refused": "revoked" })
    );
    assert_eq!(turned["result"]["reason"], "revoked");
    assert!(check(&[&file], &[&public]).problem.is_none());
}

/// Two processes on one audit file (a take-over's new one while the old one drains, or a
/// second instance pointed at it): the second waits for the first to let go of the file
/// before it reads where the chain stands, its records queued meanwhile, so the file
/// holds one chain: the first's records and stop, then the second's start and records.
/// Before, both appended from the same chain state: two records of each sequence number
/// from then on, and `verify` found the chain forked.
#[tokio::test]
async fn a_second_process_on_the_same_audit_file_waits_for_it_and_the_chain_stays_one() {
    let (pki, partner, (key, public), file) = setup().await;
    let cfg = config(&pki, &partner.url(), &audit_section(&file, &key, ""));
    let blocked = pki.leader(LEADER_B, false);
    let refuse = |addr| {
        let blocked = &blocked;
        async move {
            let r = blocked
                .post(addr, "/open/rpc", &rpc_start("1", LEADER_B, "t1"))
                .await
                .unwrap();
            assert_eq!(r.error(), (-32010, "blocked".into()));
        }
    };

    let mut first = start_gateway(&cfg).await;
    refuse(first.addr).await;
    metric(&first, "aipgw_audit_records_total", 2.0).await;
    let mut second = start_gateway(&cfg).await;
    metric(&second, "aipgw_audit_waiting", 1.0).await;
    // Both refuse while the first holds the file; the second's record waits.
    refuse(second.addr).await;
    refuse(first.addr).await;
    metric(&first, "aipgw_audit_records_total", 3.0).await;
    first.shutdown().await.unwrap().unwrap();
    // The first let go: the second takes the file, writes its start and what waited.
    metric(&second, "aipgw_audit_waiting", 0.0).await;
    metric(&second, "aipgw_audit_records_total", 2.0).await;
    second.shutdown().await.unwrap().unwrap();

    assert_eq!(
        actions(&file),
        [
            "gateway.start",
            "identity.blocklist",
            "identity.blocklist",
            "gateway.stop",
            "gateway.start",
            "identity.blocklist",
            "gateway.stop"
        ]
    );
    let report = check(&[&file], &[&public]);
    assert!(report.problem.is_none(), "{:?}", report.problem);
    assert_eq!(report.records, 7);
}
