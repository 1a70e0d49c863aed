//! ACPs AMP (Agent Monitoring Protocol, v02.01) records: the one `LogRecord` envelope
//! every record the gateway writes in that format shares, field names and formats as
//! the spec writes them (`acps-specs/09-ACPs-spec-AMP`). A value the gateway does not
//! know is left out, never invented.
//!
//! Used by the audit log (`crate::audit`: `logType` `audit`, signed and chained) and by
//! `[log] format = "amp"` ([`sink`]: access, heartbeat and system records).

pub mod sink;

use serde::Serialize;
use serde_json::{Map, Value};

/// `schemaVersion` of every record: AMP v02.01 as a `Major.Minor.Patch` version.
pub(crate) const SCHEMA_VERSION: &str = "2.1.0";

/// `logType` (the spec's `ACPsLogType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogType {
    /// The gateway is alive.
    Heartbeat,
    /// One request through the gateway.
    Access,
    /// A security decision (signed, chained).
    Audit,
    /// Start, stop, reload.
    System,
}

/// `severityText` and `severityNumber` (the spec's base levels, OpenTelemetry's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Severity {
    /// 9.
    Info,
    /// 13.
    Warn,
    /// 17.
    Error,
}

impl Severity {
    /// The text and the number.
    pub(crate) fn parts(self) -> (&'static str, u8) {
        match self {
            Severity::Info => ("INFO", 9),
            Severity::Warn => ("WARN", 13),
            Severity::Error => ("ERROR", 17),
        }
    }
}

/// One `LogRecord` (the spec's interface; `integrity` is added by the signer).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LogRecord {
    /// [`SCHEMA_VERSION`].
    pub(crate) schema_version: &'static str,
    /// When it happened (ISO 8601 with zone, [`timestamp`]).
    pub(crate) timestamp: String,
    /// The gateway's own AIC.
    pub(crate) aic: String,
    /// What kind of record.
    pub(crate) log_type: LogType,
    /// The request's W3C trace id (32 hex), when it came with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) trace_id: Option<String>,
    /// Business correlation (the AIP task id), when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) correlation_id: Option<String>,
    /// `severityText`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) severity_text: Option<&'static str>,
    /// `severityNumber`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) severity_number: Option<u8>,
    /// The type-specific body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) body: Option<Value>,
    /// Where the record comes from ([`resource`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) resource: Option<Value>,
    /// More context.
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub(crate) attributes: Map<String, Value>,
}

impl LogRecord {
    /// A record of `log_type` from `aic`, timed now, at `severity`.
    pub(crate) fn new(aic: &str, log_type: LogType, severity: Severity) -> LogRecord {
        let (text, number) = severity.parts();
        LogRecord {
            schema_version: SCHEMA_VERSION,
            timestamp: timestamp(std::time::SystemTime::now()),
            aic: aic.to_owned(),
            log_type,
            trace_id: None,
            correlation_id: None,
            severity_text: Some(text),
            severity_number: Some(number),
            body: None,
            resource: Some(resource()),
            attributes: Map::new(),
        }
    }
}

/// The `resource` of every record: the gateway as a service (`service.name`,
/// `service.version`) and its process (`process.pid`, `process.executable.name`).
pub(crate) fn resource() -> Value {
    serde_json::json!({
        "service.name": "aipgw",
        "service.version": env!("CARGO_PKG_VERSION"),
        "process.pid": std::process::id(),
        "process.executable.name": "aipgw",
    })
}

/// `t` as ISO 8601 / RFC 3339 in UTC with milliseconds (`2026-11-26T08:45:40.123Z`).
pub(crate) fn timestamp(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let at =
        time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_millis() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_764_146_740_123);
        assert_eq!(timestamp(t), "2025-11-26T08:45:40.123Z");
        assert_eq!(timestamp(std::time::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn unknown_values_are_left_out() {
        let r = LogRecord::new("AIC", LogType::Audit, Severity::Info);
        let v = serde_json::to_value(&r).unwrap();
        let o = v.as_object().unwrap();
        for absent in ["traceId", "spanId", "correlationId", "body", "attributes"] {
            assert!(!o.contains_key(absent), "{absent} written without a value");
        }
        assert_eq!(o["schemaVersion"], "2.1.0");
        assert_eq!(o["logType"], "audit");
        assert_eq!(o["severityNumber"], 9);
    }
}
