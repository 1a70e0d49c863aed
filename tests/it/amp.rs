//! Issue 34, item 2: `[log] format = "amp"`. A running gateway's access, heartbeat and
//! system records (and its audit records) checked against the AMP v02.01 field list
//! (`acps-specs/09-ACPs-spec-AMP`): the `LogRecord` envelope's fields, their types and
//! enum values, and the `HeartbeatBody`, `AccessBody` and `AuditBody` structures; no
//! field the spec does not name.

use std::path::Path;

use serde_json::{Map, Value};

use crate::support::*;

type Obj = Map<String, Value>;

/// A field list: name, required, check.
type Fields = &'static [(&'static str, bool, fn(&Value) -> Result<(), String>)];

fn string(v: &Value) -> Result<(), String> {
    v.is_string()
        .then_some(())
        .ok_or(format!("{v} is not a string"))
}

fn number(v: &Value) -> Result<(), String> {
    v.is_number()
        .then_some(())
        .ok_or(format!("{v} is not a number"))
}

fn any(_: &Value) -> Result<(), String> {
    Ok(())
}

fn hex(v: &Value, n: usize) -> Result<(), String> {
    let s = v.as_str().ok_or(format!("{v} is not a string"))?;
    (s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then_some(())
        .ok_or(format!("{s:?} is not {n} hex digits"))
}

fn timestamp(v: &Value) -> Result<(), String> {
    let s = v.as_str().ok_or("not a string")?;
    // ISO 8601 with a zone: date, `T`, time, then `Z` or an offset.
    let ok = s.len() >= 20
        && s.as_bytes()[10] == b'T'
        && (s.ends_with('Z') || s[19..].contains('+') || s[19..].contains('-'))
        && s[..4].bytes().all(|b| b.is_ascii_digit());
    ok.then_some(())
        .ok_or(format!("{s:?} is not ISO 8601 with a zone"))
}

fn semver(v: &Value) -> Result<(), String> {
    let s = v.as_str().ok_or("not a string")?;
    let parts: Vec<&str> = s.split('.').collect();
    (parts.len() == 3 && parts.iter().all(|p| p.parse::<u64>().is_ok()))
        .then_some(())
        .ok_or(format!("{s:?} is not Major.Minor.Patch"))
}

fn object(v: &Value, fields: Fields) -> Result<&Obj, String> {
    let o = v.as_object().ok_or(format!("{v} is not an object"))?;
    for (k, _) in o {
        if !fields.iter().any(|(name, _, _)| name == k) {
            return Err(format!("{k:?} is not a field of the spec"));
        }
    }
    for (name, required, check) in fields {
        match o.get(*name) {
            Some(v) => check(v).map_err(|e| format!("{name}: {e}"))?,
            None if *required => return Err(format!("{name}: required, missing")),
            None => {}
        }
    }
    Ok(o)
}

fn peer(v: &Value) -> Result<(), String> {
    object(
        v,
        &[
            ("aic", false, string),
            ("serviceName", false, string),
            ("ip", false, string),
        ],
    )
    .map(drop)
}

fn headers(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    o.values().try_for_each(string)
}

fn access_body(v: &Value) -> Result<(), String> {
    object(
        v,
        &[
            ("durationMs", false, number),
            ("request", false, |v| {
                object(
                    v,
                    &[
                        ("method", false, string),
                        ("url", false, string),
                        ("headers", false, headers),
                        ("bodySizeBytes", false, number),
                    ],
                )
                .map(drop)
            }),
            ("response", false, |v| {
                object(
                    v,
                    &[
                        ("statusCode", false, number),
                        ("headers", false, headers),
                        ("bodySizeBytes", false, number),
                    ],
                )
                .map(drop)
            }),
            ("caller", false, peer),
            ("callee", false, peer),
            ("error", false, |v| {
                object(
                    v,
                    &[
                        ("code", false, |v| {
                            (v.is_number() || v.is_string())
                                .then_some(())
                                .ok_or("not number|string".into())
                        }),
                        ("message", false, string),
                        ("data", false, any),
                        ("stackTrace", false, string),
                    ],
                )
                .map(drop)
            }),
        ],
    )
    .map(drop)
}

fn audit_body(v: &Value) -> Result<(), String> {
    object(
        v,
        &[
            ("actor", true, |v| {
                object(
                    v,
                    &[
                        ("id", true, string),
                        ("type", true, string),
                        ("name", false, string),
                        ("role", false, string),
                        ("ip", false, string),
                        ("userAgent", false, string),
                    ],
                )
                .map(drop)
            }),
            ("action", true, |v| {
                object(
                    v,
                    &[
                        ("name", true, string),
                        ("type", true, string),
                        ("method", false, string),
                    ],
                )
                .map(drop)
            }),
            ("target", true, |v| {
                object(
                    v,
                    &[
                        ("type", true, string),
                        ("id", true, string),
                        ("name", false, string),
                        ("before", false, any),
                        ("after", false, any),
                    ],
                )
                .map(drop)
            }),
            ("result", true, |v| {
                object(
                    v,
                    &[
                        ("status", true, |v| match v.as_str() {
                            Some("success" | "failure" | "unknown") => Ok(()),
                            _ => Err(format!("{v} is not success|failure|unknown")),
                        }),
                        ("reason", false, string),
                        ("errorCode", false, string),
                    ],
                )
                .map(drop)
            }),
        ],
    )
    .map(drop)
}

fn heartbeat_body(v: &Value) -> Result<(), String> {
    object(v, &[("uptimeSeconds", false, number)]).map(drop)
}

fn resource(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    string(
        o.get("service.name")
            .ok_or("service.name: required, missing")?,
    )?;
    for k in [
        "service.namespace",
        "service.instance.id",
        "service.version",
        "host.name",
        "process.executable.name",
    ] {
        o.get(k)
            .map_or(Ok(()), string)
            .map_err(|e| format!("{k}: {e}"))?;
    }
    o.get("process.pid").map_or(Ok(()), number)
}

/// Checks one record against the spec's `LogRecord` and its body's structure.
pub fn validate(r: &Value) -> Result<(), String> {
    let o = object(
        r,
        &[
            ("schemaVersion", true, semver),
            ("timestamp", true, timestamp),
            ("observedTimestamp", false, timestamp),
            ("aic", true, string),
            ("logType", true, |v| match v.as_str() {
                Some("heartbeat" | "access" | "metrics" | "audit" | "message" | "system") => Ok(()),
                _ => Err(format!("{v} is not an ACPsLogType")),
            }),
            ("traceId", false, |v| hex(v, 32)),
            ("spanId", false, |v| hex(v, 16)),
            ("parentSpanId", false, |v| hex(v, 16)),
            ("correlationId", false, string),
            ("severityText", false, string),
            ("severityNumber", false, |v| match v.as_u64() {
                Some(0..=24) => Ok(()),
                _ => Err(format!("{v} is not a SeverityNumber")),
            }),
            ("body", false, any),
            ("resource", false, resource),
            ("attributes", false, |v| {
                v.is_object().then_some(()).ok_or("not an object".into())
            }),
            ("integrity", false, |v| {
                object(
                    v,
                    &[
                        ("alg", true, string),
                        ("kid", true, string),
                        ("sig", true, string),
                    ],
                )
                .map(drop)
            }),
        ],
    )?;
    // The text and the number agree (OpenTelemetry's ranges).
    if let (Some(t), Some(n)) = (o.get("severityText"), o.get("severityNumber")) {
        let want = match n.as_u64().unwrap() {
            1..=4 => "TRACE",
            5..=8 => "DEBUG",
            9..=12 => "INFO",
            13..=16 => "WARN",
            17..=20 => "ERROR",
            21..=24 => "FATAL",
            _ => "",
        };
        if t != want {
            return Err(format!("severityText {t} with severityNumber {n}"));
        }
    }
    let body = o.get("body").unwrap_or(&Value::Null);
    match o["logType"].as_str().unwrap() {
        "access" => access_body(body).map_err(|e| format!("body: {e}")),
        "audit" => {
            if o.get("integrity").is_none() {
                return Err("an audit record must be signed".into());
            }
            audit_body(body).map_err(|e| format!("body: {e}"))
        }
        "heartbeat" => heartbeat_body(body).map_err(|e| format!("body: {e}")),
        // System bodies are free-form.
        _ => Ok(()),
    }
}

fn lines(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn the_validator_refuses_what_the_spec_does_not_allow() {
    let good = serde_json::json!({
        "schemaVersion": "2.1.0", "timestamp": "2026-01-01T00:00:00.000Z", "aic": "A",
        "logType": "heartbeat", "body": {"uptimeSeconds": 3}
    });
    assert_eq!(validate(&good), Ok(()));
    let mut bad = good.clone();
    bad["logType"] = "trace".into();
    assert!(validate(&bad).is_err());
    let mut bad = good.clone();
    bad["traceid"] = "x".into();
    assert!(validate(&bad).is_err());
    let mut bad = good.clone();
    bad.as_object_mut().unwrap().remove("aic");
    assert!(validate(&bad).is_err());
    let mut bad = good.clone();
    bad["timestamp"] = "2026-01-01 00:00:00".into();
    assert!(validate(&bad).is_err());
    let mut bad = good.clone();
    bad["body"]["uptime"] = 3.into();
    assert!(validate(&bad).is_err());
}

#[tokio::test]
async fn access_heartbeat_and_system_records_follow_the_amp_field_list() {
    let pki = Pki::new();
    let partner = TestPartner::start(Behaviour::Echo).await;
    let amp = pki.dir.path().join("amp.log");
    let audit_log = pki.dir.path().join("audit.log");
    let key = pki.write("audit.key", &pkcs8_pem());
    let cfg = |beat: &str| {
        pki.config(
            "",
            &format!(
                "[log]\nformat = \"amp\"\namp_file = \"{}\"\nheartbeat_interval = \"{beat}\"\naic = \"{GATEWAY_AIC}\"\n\
                 [audit]\nfile = \"{}\"\nkey = \"{}\"\naic = \"{GATEWAY_AIC}\"\n{}",
                amp.display(),
                audit_log.display(),
                key.display(),
                partner_block("p", "/p", &partner.url(), &format!("aic = \"{PARTNER_AIC}\"")),
            ),
        )
    };
    let path = pki.write("gw.toml", &cfg("50ms"));
    let mut gw = start_gateway_from_file(&path).await;
    let a = pki.leader(LEADER_A, false);
    let r = a
        .post(gw.addr, "/p/rpc", &rpc_start("7", LEADER_A, "task-1"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let anonymous = Leader::new(&pki, None, false);
    let r = anonymous
        .post(gw.addr, "/p/rpc", &rpc_start("8", LEADER_A, "task-2"))
        .await
        .unwrap();
    assert_eq!(r.error().0, -32008);
    replace_file(&path, &cfg("60ms"));
    wait_reloads(&gw, "ok", 1).await;
    // A heartbeat comes on its interval: waited for in the file.
    within(10, async {
        while !lines(&amp).iter().any(|r| r["logType"] == "heartbeat") {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    gw.shutdown().await.unwrap().unwrap();
    let recs = lines(&amp);
    for r in recs.iter().chain(lines(&audit_log).iter()) {
        validate(r).unwrap_or_else(|e| panic!("{e}: {r}"));
    }
    let system: Vec<&str> = recs
        .iter()
        .filter(|r| r["logType"] == "system")
        .map(|r| r["body"]["event"].as_str().unwrap())
        .collect();
    assert_eq!(system, ["start", "reload", "stop"]);
    let access: Vec<&Value> = recs.iter().filter(|r| r["logType"] == "access").collect();
    assert_eq!(access.len(), 2);
    let ok = &access[0];
    assert_eq!(ok["aic"], GATEWAY_AIC);
    assert_eq!(ok["correlationId"], "task-1");
    assert_eq!(ok["severityText"], "INFO");
    let b = &ok["body"];
    assert_eq!(
        b["caller"],
        serde_json::json!({"aic": LEADER_A, "ip": "127.0.0.1"})
    );
    assert_eq!(
        b["callee"],
        serde_json::json!({"aic": PARTNER_AIC, "serviceName": "p"})
    );
    assert_eq!(b["request"]["method"], "rpc");
    assert_eq!(b["request"]["url"], "/p/rpc");
    assert_eq!(b["response"]["statusCode"], 200);
    assert!(b.get("error").is_none());
    assert_eq!(ok["attributes"]["aip.command"], "start");
    // The refused caller has no AIC: none is written.
    let refused = &access[1]["body"];
    assert_eq!(refused["caller"], serde_json::json!({"ip": "127.0.0.1"}));
    assert_eq!(refused["error"]["code"], -32008);
    assert_eq!(access[1]["severityText"], "WARN");
    let beat = recs.iter().find(|r| r["logType"] == "heartbeat").unwrap();
    assert!(beat["body"]["uptimeSeconds"].is_u64());
}

/// An Ed25519 key, PKCS#8 PEM.
pub fn pkcs8_pem() -> String {
    use base64::prelude::*;
    let pkcs8 = aws_lc_rs::signature::Ed25519KeyPair::generate()
        .unwrap()
        .to_pkcs8()
        .unwrap();
    format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        BASE64_STANDARD.encode(pkcs8.as_ref())
    )
}
