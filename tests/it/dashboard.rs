//! Issue 34, item 4: the Grafana dashboard (`deploy/grafana/aipgw.json`). Every metric
//! its panels query exists in `/metrics` of a running gateway that has seen each kind of
//! traffic (so labelled series exist), and every label its queries group by is on a series
//! of the metrics that query names.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use crate::support::*;

/// Every `expr` of every panel (rows' panels included).
fn exprs(panels: &[Value], out: &mut Vec<String>) {
    for p in panels {
        if let Some(targets) = p["targets"].as_array() {
            out.extend(
                targets
                    .iter()
                    .filter_map(|t| t["expr"].as_str().map(str::to_owned)),
            );
        }
        if let Some(inner) = p["panels"].as_array() {
            exprs(inner, out);
        }
    }
}

/// `aipgw_...` names in a query.
fn names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("aipgw_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// Labels a query groups by (`by (a, b)`), Prometheus's own `instance` aside.
fn grouped_by(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for part in expr.split("by (").skip(1) {
        let list = part.split(')').next().unwrap();
        out.extend(list.split(',').map(|l| l.trim().to_owned()));
    }
    out.remove("instance");
    out
}

/// Series name -> the labels seen on it, from a `/metrics` page.
fn series(text: &str) -> HashMap<String, BTreeSet<String>> {
    let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let head = line.rsplit_once(' ').unwrap().0;
        let (name, labels) = match head.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (head, ""),
        };
        let set = out.entry(name.to_owned()).or_default();
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            set.insert(
                pair.split('=')
                    .next()
                    .unwrap()
                    .trim_start_matches(',')
                    .to_owned(),
            );
        }
    }
    out
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_on_a_running_gateways_metrics_page() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/grafana/aipgw.json"
    ))
    .unwrap();
    let dash: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(dash["uid"], "aipgw-overview");
    let panels = dash["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let mut queries = Vec::new();
    exprs(panels, &mut queries);
    assert!(queries.len() >= 15, "{} queries", queries.len());

    // A gateway that has seen each kind of traffic.
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let key = pki.write("audit.key", &crate::amp::pkcs8_pem());
    let audit = pki.dir.path().join("audit.log");
    let cfg = |rate: &str| {
        pki.config(
            "",
            &format!(
                "[ratelimit]\nrate = {rate}\nburst = 3\n[audit]\nfile = \"{}\"\nkey = \"{}\"\naic = \"{GATEWAY_AIC}\"\n{}{}{}",
                audit.display(),
                key.display(),
                partner_block("p", "/p", &partner.url(), ""),
                partner_block("closed", "/closed", &partner.url(), "[partner.access]\nallow = [\"10009*\"]"),
                // Nothing listens there: the Partner fails.
                partner_block("down", "/down", "http://127.0.0.1:9", ""),
            ),
        )
    };
    let path = pki.write("gw.toml", &cfg("0.01"));
    let gw = start_gateway_from_file(&path).await;
    let a = pki.leader(LEADER_A, false);
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t1"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let r = a
        .post(gw.addr, "/down/rpc", &rpc_start("1", LEADER_A, "t2"))
        .await
        .unwrap();
    assert_eq!(r.status, 502);
    let r = a
        .post(gw.addr, "/closed/rpc", &rpc_start("1", LEADER_A, "t3"))
        .await
        .unwrap();
    assert_eq!(r.error().0, -32009);
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t4"))
        .await
        .unwrap();
    assert_eq!(r.error().0, -32029);
    let anonymous = Leader::new(&pki, None, false);
    let r = anonymous
        .post(gw.addr, "/p/rpc", &rpc_start("1", LEADER_A, "t5"))
        .await
        .unwrap();
    assert_eq!(r.error().0, -32008);
    // A handshake that fails: not TLS at all.
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let _ = tcp.read(&mut [0u8; 64]).await;
    }
    replace_file(&path, &cfg("0.02"));
    wait_reloads(&gw, "ok", 1).await;

    let wanted: BTreeSet<String> = queries.iter().flat_map(|q| names(q)).collect();
    // Waits (10 s at most) for every series to be there: some are counted as connections
    // close.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let page = loop {
        let page = series(&gw.admin_get("/metrics").await.1);
        let missing: Vec<&String> = wanted.iter().filter(|n| !page.contains_key(*n)).collect();
        if missing.is_empty() {
            break page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dashboard queries metrics /metrics does not have: {missing:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for q in &queries {
        let labels: BTreeSet<String> = names(q)
            .iter()
            .flat_map(|n| page[n].iter().cloned())
            .collect();
        for l in grouped_by(q) {
            assert!(
                labels.contains(&l),
                "{q}: no series of it has the label {l:?}"
            );
        }
    }
}
