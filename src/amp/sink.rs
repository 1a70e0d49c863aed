//! `[log] format = "amp"`: access records, a heartbeat and system records (start, stop,
//! reload) as AMP `LogRecord` JSON lines, to standard output or `log.amp_file`.
//!
//! An access record is written when the request's body ends, where the access log line is
//! otherwise written, and in the same way: one line, written at once, by the thread that
//! served the request. Values the gateway does not know (a refused caller's AIC, a
//! Partner's AIC not configured) are left out.

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use serde_json::{json, Map, Value};

use super::{LogRecord, LogType, Severity};

/// `[log]` with `format = "amp"`, validated (see `config::raw::RawLog`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmpSettings {
    /// Where the records go (`None`: standard output).
    pub file: Option<PathBuf>,
    /// The gateway's AIC, each record's `aic`.
    pub aic: String,
    /// A heartbeat record this often (`None`: none).
    pub heartbeat: Option<Duration>,
}

/// The AMP record writer (shared by every snapshot).
pub struct AmpLog {
    aic: String,
    heartbeat: Option<Duration>,
    out: Mutex<Box<dyn Write + Send>>,
    /// Each Partner's AIC by name, as the current config names them.
    callees: ArcSwap<HashMap<Arc<str>, String, ahash::RandomState>>,
    started: std::time::SystemTime,
}

/// What an access record says: the request's facts, borrowed from its access log.
#[derive(Debug)]
pub(crate) struct Access<'a> {
    /// Total time.
    pub(crate) duration: Duration,
    /// The JSON-RPC method.
    pub(crate) method: Option<&'a str>,
    /// The request path.
    pub(crate) path: Option<&'a str>,
    /// Request body bytes.
    pub(crate) bytes_in: u64,
    /// The HTTP status.
    pub(crate) status: u16,
    /// Response body bytes.
    pub(crate) bytes_out: u64,
    /// The caller's verified AIC.
    pub(crate) caller_aic: Option<&'a str>,
    /// Its address.
    pub(crate) caller_ip: IpAddr,
    /// The Partner.
    pub(crate) partner: Option<&'a str>,
    /// The JSON-RPC error code and reason the gateway answered with (0 and "": none).
    pub(crate) code: i32,
    /// Its reason label.
    pub(crate) reason: &'a str,
    /// The W3C trace id.
    pub(crate) trace_id: Option<&'a str>,
    /// The AIP task.
    pub(crate) task: Option<&'a str>,
    /// The AIP session.
    pub(crate) session: Option<&'a str>,
    /// The AIP command.
    pub(crate) command: Option<&'a str>,
    /// The request id.
    pub(crate) request_id: Option<&'a str>,
    /// Events relayed (a stream).
    pub(crate) events: Option<u64>,
}

impl AmpLog {
    /// Opens the output.
    pub fn open(s: &AmpSettings) -> anyhow::Result<AmpLog> {
        let out: Box<dyn Write + Send> = match &s.file {
            Some(p) => Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| anyhow::anyhow!("log.amp_file {}: {e}", p.display()))?,
            ),
            None => Box::new(std::io::stdout()),
        };
        Ok(AmpLog {
            aic: s.aic.clone(),
            heartbeat: s.heartbeat,
            out: Mutex::new(out),
            callees: ArcSwap::default(),
            started: std::time::SystemTime::now(),
        })
    }

    /// The Partners' AICs as the current config names them.
    pub(crate) fn set_callees<'a>(
        &self,
        partners: impl Iterator<Item = (&'a str, Option<&'a str>)>,
    ) {
        let map = partners
            .filter_map(|(name, aic)| aic.map(|a| (Arc::from(name), a.to_owned())))
            .collect();
        self.callees.store(Arc::new(map));
    }

    fn write(&self, record: &LogRecord) {
        let Ok(mut line) = serde_json::to_vec(record) else {
            return;
        };
        line.push(b'\n');
        let mut out = crate::sync::lock(&self.out);
        // Like the access log's own lines: a failed write is not the request's failure.
        let _ = out.write_all(&line).and_then(|()| out.flush());
    }

    /// One request's access record.
    pub(crate) fn access(&self, a: &Access<'_>) {
        let severity = match a.status {
            500.. => Severity::Error,
            400.. => Severity::Warn,
            _ => Severity::Info,
        };
        let mut rec = LogRecord::new(&self.aic, LogType::Access, severity);
        rec.trace_id = a.trace_id.filter(|t| t.len() == 32).map(str::to_owned);
        rec.correlation_id = a.task.map(str::to_owned);
        let mut request = Map::new();
        if let Some(m) = a.method {
            request.insert("method".into(), m.into());
        }
        if let Some(p) = a.path {
            request.insert("url".into(), p.into());
        }
        request.insert("bodySizeBytes".into(), a.bytes_in.into());
        let mut caller = Map::new();
        if let Some(aic) = a.caller_aic {
            caller.insert("aic".into(), aic.into());
        }
        caller.insert("ip".into(), a.caller_ip.to_string().into());
        let mut callee = Map::new();
        if let Some(p) = a.partner {
            if let Some(aic) = self.callees.load().get(p) {
                callee.insert("aic".into(), aic.as_str().into());
            }
            callee.insert("serviceName".into(), p.into());
        }
        let ms = (a.duration.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0;
        let mut body = Map::new();
        body.insert("durationMs".into(), ms.into());
        body.insert("request".into(), Value::Object(request));
        body.insert(
            "response".into(),
            json!({"statusCode": a.status, "bodySizeBytes": a.bytes_out}),
        );
        body.insert("caller".into(), Value::Object(caller));
        if !callee.is_empty() {
            body.insert("callee".into(), Value::Object(callee));
        }
        if a.code != 0 {
            body.insert("error".into(), json!({"code": a.code, "message": a.reason}));
        }
        rec.body = Some(Value::Object(body));
        let attrs = &mut rec.attributes;
        // The gateway is the service in between: the caller above, the Partner below.
        attrs.insert("aipgw.role".into(), "gateway".into());
        for (k, v) in [
            ("aip.command", a.command),
            ("aip.sessionId", a.session),
            ("aipgw.requestId", a.request_id),
        ] {
            if let Some(v) = v.filter(|v| !v.is_empty()) {
                attrs.insert(k.into(), v.into());
            }
        }
        if let Some(n) = a.events {
            attrs.insert("aipgw.events".into(), n.into());
        }
        self.write(&rec);
    }

    /// A system record: `event` (`start`, `stop`, `reload`) with more `detail`.
    pub(crate) fn system(&self, event: &str, ok: bool, detail: Map<String, Value>) {
        let severity = if ok { Severity::Info } else { Severity::Error };
        let mut rec = LogRecord::new(&self.aic, LogType::System, severity);
        let mut body = detail;
        body.insert("event".into(), event.into());
        rec.body = Some(Value::Object(body));
        self.write(&rec);
    }

    /// Writes a heartbeat record every `log.heartbeat_interval` (forever; run by
    /// `background`).
    pub(crate) async fn heartbeats(self: Arc<Self>) {
        let Some(every) = self.heartbeat else {
            return std::future::pending().await;
        };
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tick.tick().await;
            let uptime = self.started.elapsed().unwrap_or_default().as_secs();
            let mut rec = LogRecord::new(&self.aic, LogType::Heartbeat, Severity::Info);
            rec.body = Some(json!({ "uptimeSeconds": uptime }));
            self.write(&rec);
        }
    }
}
