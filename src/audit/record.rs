//! What each audit event says as an AMP `audit` record (`AuditBody`: actor, action,
//! target, result), and how a record is sealed: its place in the chain
//! (`attributes["audit.seq"]`, `attributes["audit.prevHash"]`), then `integrity`
//! (`alg`, `kid`, `sig`): an Ed25519 signature over the RFC 8785 (JCS) form of the whole
//! record without `integrity.sig`. The line written is the JCS form of the sealed record;
//! the next record's `audit.prevHash` is the SHA-256 (lowercase hex) of that line.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::key::{Signer, ALG};
use crate::amp::{LogRecord, LogType, Severity};

/// `attributes` key of a record's place in the chain (0 for the first record ever).
pub(crate) const SEQ: &str = "audit.seq";
/// `attributes` key of the previous record's line hash (absent on the first record).
pub(crate) const PREV: &str = "audit.prevHash";

/// Which security decision refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Refusal {
    /// No certificate, or one the trust settings (CAs, CRLs, OCSP, AIC checks) reject.
    Identity,
    /// The AIC is on the block list.
    BlockList,
    /// An access rule (allowed AICs, roles, sender checks).
    Access,
    /// Task or stream ownership.
    Ownership,
}

impl Refusal {
    /// `action.name` and `action.type`.
    fn action(self) -> (&'static str, &'static str) {
        match self {
            Refusal::Identity => ("identity.verify", "identity"),
            Refusal::BlockList => ("identity.blocklist", "identity"),
            Refusal::Access => ("policy.access", "authorization"),
            Refusal::Ownership => ("policy.ownership", "authorization"),
        }
    }
}

/// A request refused by a security decision.
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    /// Which decision.
    pub(crate) kind: Refusal,
    /// The caller's AIC, when its certificate gave one.
    pub(crate) aic: Option<String>,
    /// The caller's address.
    pub(crate) ip: IpAddr,
    /// The refusal's reason label (`error.data.reason`).
    pub(crate) reason: &'static str,
    /// The JSON-RPC error code answered.
    pub(crate) code: i32,
    /// The JSON-RPC method, once read.
    pub(crate) method: Option<&'static str>,
    /// The Partner the path names.
    pub(crate) partner: Option<Arc<str>>,
    /// The AIP task, once read.
    pub(crate) task: Option<String>,
    /// The request's trace id.
    pub(crate) trace_id: Option<String>,
    /// For refusals past `audit.repeat_limit`: how many of this kind from this caller in
    /// the interval (this one the last of them), the interval in seconds, and whether
    /// they are of the callers past `audit.quota_max_aics`, together (actor `*`).
    pub(crate) repeated: Option<(u64, u64, bool)>,
}

/// Everything the audit log records.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// The gateway started.
    Start,
    /// The gateway is stopping (after the drain).
    Stop,
    /// A request refused.
    Refused(Box<Refused>),
    /// Quota refusals of one AIC over one interval (`None`: the AICs past
    /// `audit.quota_max_aics`, together).
    Quota {
        /// The AIC.
        aic: Option<String>,
        /// The last refused request's address.
        ip: Option<IpAddr>,
        /// The last refusal's reason label.
        reason: &'static str,
        /// How many.
        count: u64,
        /// The interval, in seconds.
        window_secs: u64,
    },
    /// A config reload, applied or refused.
    Reload {
        /// The config file.
        path: String,
        /// SHA-256 of the file read (hex), when read.
        sha256: Option<String>,
        /// The refusal, if refused.
        error: Option<String>,
    },
    /// An open connection's certificate verdict changed.
    Verdict {
        /// The connection's peer address.
        peer: std::net::SocketAddr,
        /// The AIC before (if it was verified).
        before: Option<String>,
        /// The AIC now (if verified), or the reason it is refused now.
        after: Result<String, &'static str>,
    },
    /// Records were lost: the queue was full.
    Gap {
        /// How many.
        lost: u64,
    },
    /// The signing key changes: this record, signed by the old key, names the new one.
    KeyRotated {
        /// The old key id (`None`: unknown, the previous key is not this process's).
        before: Option<String>,
        /// The new key id.
        after: String,
    },
}

fn actor_agent(aic: Option<&str>, ip: Option<IpAddr>) -> Value {
    let mut a = Map::new();
    match aic {
        Some(aic) => {
            a.insert("id".into(), aic.into());
            a.insert("type".into(), "agent".into());
        }
        // No AIC: the address is all the gateway knows of the caller.
        None => {
            let id = ip.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
            a.insert("id".into(), id.into());
            a.insert("type".into(), "unauthenticated".into());
        }
    }
    if let Some(ip) = ip {
        a.insert("ip".into(), ip.to_string().into());
    }
    Value::Object(a)
}

fn gateway_actor(gateway: &str) -> Value {
    json!({"id": gateway, "type": "service", "name": "aipgw"})
}

fn result(ok: bool, reason: Option<&str>, code: Option<String>) -> Value {
    let mut r = Map::new();
    r.insert(
        "status".into(),
        if ok { "success" } else { "failure" }.into(),
    );
    if let Some(reason) = reason {
        r.insert("reason".into(), reason.into());
    }
    if let Some(code) = code {
        r.insert("errorCode".into(), code.into());
    }
    Value::Object(r)
}

/// The record an event becomes (unsealed), from the gateway `gateway` (its AIC).
pub(crate) fn record(gateway: &str, event: &Event) -> LogRecord {
    let (severity, body, attributes) = match event {
        Event::Start | Event::Stop => {
            let name = if matches!(event, Event::Start) {
                "gateway.start"
            } else {
                "gateway.stop"
            };
            let body = json!({
                "actor": gateway_actor(gateway),
                "action": {"name": name, "type": "lifecycle"},
                "target": {"type": "gateway", "id": gateway},
                "result": result(true, None, None),
            });
            (Severity::Info, body, Map::new())
        }
        Event::Refused(r) => return refused(gateway, r),
        Event::Quota {
            aic,
            ip,
            reason,
            count,
            window_secs,
        } => {
            let actor = match aic {
                Some(a) => actor_agent(Some(a), *ip),
                None => json!({"id": "*", "type": "aggregate"}),
            };
            let body = json!({
                "actor": actor,
                "action": {"name": "quota.limit", "type": "ratelimit"},
                "target": {"type": "gateway", "id": gateway},
                "result": result(false, Some(reason), Some(crate::error::codes::RATE_LIMITED.to_string())),
            });
            let mut attrs = Map::new();
            attrs.insert("audit.count".into(), (*count).into());
            attrs.insert("audit.windowSeconds".into(), (*window_secs).into());
            (Severity::Warn, body, attrs)
        }
        Event::Reload {
            path,
            sha256,
            error,
        } => {
            let mut target = Map::new();
            target.insert("type".into(), "config".into());
            target.insert("id".into(), path.as_str().into());
            if let Some(d) = sha256 {
                target.insert("after".into(), json!({ "sha256": d }));
            }
            let body = json!({
                "actor": gateway_actor(gateway),
                "action": {"name": "config.reload", "type": "config"},
                "target": target,
                "result": result(error.is_none(), error.as_deref(), None),
            });
            let sev = if error.is_none() {
                Severity::Info
            } else {
                Severity::Error
            };
            (sev, body, Map::new())
        }
        Event::Verdict {
            peer,
            before,
            after,
        } => {
            let aic = after.as_ref().ok().or(before.as_ref());
            let mut target = Map::new();
            target.insert("type".into(), "connection".into());
            target.insert("id".into(), peer.to_string().into());
            target.insert("before".into(), verdict_value(before.as_deref().ok_or("")));
            target.insert(
                "after".into(),
                verdict_value(after.as_ref().map(String::as_str).map_err(|r| *r)),
            );
            let (ok, reason) = match after {
                Ok(_) => (true, None),
                Err(r) => (false, Some(*r)),
            };
            let body = json!({
                "actor": actor_agent(aic.map(String::as_str), Some(peer.ip())),
                "action": {"name": "identity.reverify", "type": "identity"},
                "target": target,
                "result": result(ok, reason, None),
            });
            let sev = if ok { Severity::Info } else { Severity::Warn };
            (sev, body, Map::new())
        }
        Event::Gap { lost } => {
            let body = json!({
                "actor": gateway_actor(gateway),
                "action": {"name": "audit.gap", "type": "audit"},
                "target": {"type": "audit_log", "id": gateway},
                "result": {"status": "unknown", "reason": format!("{lost} audit records lost: the audit queue was full")},
            });
            let mut attrs = Map::new();
            attrs.insert("audit.lost".into(), (*lost).into());
            (Severity::Error, body, attrs)
        }
        Event::KeyRotated { before, after } => {
            let mut target = Map::new();
            target.insert("type".into(), "audit_key".into());
            target.insert("id".into(), after.as_str().into());
            if let Some(b) = before {
                target.insert("before".into(), json!({ "kid": b }));
            }
            target.insert("after".into(), json!({ "kid": after }));
            let body = json!({
                "actor": gateway_actor(gateway),
                "action": {"name": "audit.key_rotate", "type": "audit"},
                "target": target,
                "result": result(true, None, None),
            });
            (Severity::Info, body, Map::new())
        }
    };
    let mut rec = LogRecord::new(gateway, LogType::Audit, severity);
    rec.body = Some(body);
    rec.attributes = attributes;
    rec
}

/// A verdict as a snapshot (`target.before`/`after`): `{"aic": ...}` or
/// `{"refused": reason}` (an empty reason: there was no verdict).
fn verdict_value(v: Result<&str, &str>) -> Value {
    match v {
        Ok(aic) => json!({ "aic": aic }),
        Err("") => Value::Null,
        Err(reason) => json!({ "refused": reason }),
    }
}

fn refused(gateway: &str, r: &Refused) -> LogRecord {
    let (name, kind) = r.kind.action();
    let mut action = Map::new();
    action.insert("name".into(), name.into());
    action.insert("type".into(), kind.into());
    if let Some(m) = r.method {
        action.insert("method".into(), m.into());
    }
    let mut target = Map::new();
    match (&r.task, &r.partner) {
        (Some(task), partner) if r.kind == Refusal::Ownership => {
            target.insert("type".into(), "task".into());
            target.insert("id".into(), task.as_str().into());
            if let Some(p) = partner {
                target.insert("name".into(), (**p).into());
            }
        }
        (_, Some(p)) => {
            target.insert("type".into(), "partner".into());
            target.insert("id".into(), (**p).into());
        }
        (_, None) => {
            target.insert("type".into(), "gateway".into());
            target.insert("id".into(), gateway.into());
        }
    }
    let actor = match r.repeated {
        Some((_, _, true)) => json!({"id": "*", "type": "aggregate"}),
        _ => actor_agent(r.aic.as_deref(), Some(r.ip)),
    };
    let body = json!({
        "actor": actor,
        "action": action,
        "target": target,
        "result": result(false, Some(r.reason), Some(r.code.to_string())),
    });
    let mut rec = LogRecord::new(gateway, LogType::Audit, Severity::Warn);
    rec.trace_id = r.trace_id.clone();
    rec.correlation_id = r.task.clone();
    rec.body = Some(body);
    if let Some((count, window_secs, _)) = r.repeated {
        rec.attributes.insert("audit.count".into(), count.into());
        rec.attributes
            .insert("audit.windowSeconds".into(), window_secs.into());
    }
    rec
}

/// Where the chain stands: the next record's place and the last line's hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Chain {
    /// The next record's `audit.seq`.
    pub(crate) seq: u64,
    /// The SHA-256 (hex) of the last line written, if any.
    pub(crate) prev: Option<String>,
    /// The key id of the last record, if any.
    pub(crate) kid: Option<String>,
}

/// `rec` sealed into the chain and signed: the line to write (without its newline).
pub(crate) fn seal(mut rec: LogRecord, signer: &Signer, chain: &mut Chain) -> String {
    rec.attributes.insert(SEQ.into(), chain.seq.into());
    if let Some(prev) = &chain.prev {
        rec.attributes.insert(PREV.into(), prev.as_str().into());
    }
    let mut v = serde_json::to_value(&rec).expect("a record is JSON");
    v["integrity"] = json!({"alg": ALG, "kid": signer.kid()});
    let signed = canonical(&v);
    let sig = signer.sign(&signed);
    let line = match with_sig(&signed, signer.kid(), &sig) {
        Some(line) => line,
        None => {
            v["integrity"]["sig"] = sig.into();
            canonical(&v)
        }
    };
    let line = String::from_utf8(line).expect("JSON is UTF-8");
    chain.seq += 1;
    chain.prev = Some(crate::identity::sha256_hex(line.as_bytes()));
    chain.kid = Some(signer.kid().to_owned());
    line
}

/// The JCS form of the sealed record made from the signed one without canonicalizing it
/// again: `"sig"` sorts after `"alg"` and `"kid"`, so it goes last in `integrity`, and a
/// Base64 string needs no escaping. `None` if `integrity` is not found exactly once.
pub(super) fn with_sig(signed: &[u8], kid: &str, sig: &str) -> Option<Vec<u8>> {
    let mut end = Vec::with_capacity(64);
    end.extend_from_slice(br#""integrity":{"alg":"EdDSA","kid":"#);
    end.extend_from_slice(&canonical(&Value::from(kid)));
    let mut found = memchr::memmem::find_iter(signed, &end);
    let at = found.next()? + end.len();
    if found.next().is_some() || signed.get(at) != Some(&b'}') {
        return None;
    }
    let mut line = Vec::with_capacity(signed.len() + sig.len() + 8);
    line.extend_from_slice(&signed[..at]);
    line.extend_from_slice(br#","sig":""#);
    line.extend_from_slice(sig.as_bytes());
    line.push(b'"');
    line.extend_from_slice(&signed[at..]);
    Some(line)
}

/// The RFC 8785 form of a JSON value.
pub(crate) fn canonical(v: &Value) -> Vec<u8> {
    serde_json_canonicalizer::to_vec(v).expect("a JSON value canonicalizes")
}
