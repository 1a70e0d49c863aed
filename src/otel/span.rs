//! What the request path hands the exporter ([`Finished`]: plain fields, no OTLP types),
//! (the exporter's `encode` writes its OTLP spans, on its own thread, off the request path).
//!
//! Attribute names: the OpenTelemetry JSON-RPC conventions (`rpc.system = "jsonrpc"`,
//! `rpc.method`, `rpc.jsonrpc.version`, `rpc.jsonrpc.request_id`,
//! `rpc.jsonrpc.error_code`, `rpc.jsonrpc.error_message`), HTTP's
//! `http.response.status_code`, `client.address`, and the gateway's own under `aip.`:
//! `aip.caller.aic`, `aip.partner`, `aip.command`, `aip.task_id`, `aip.session_id`,
//! `aip.request_id` (the `x-request-id`), `aip.stream.events`, `aip.stream.outcome`.

#[cfg(test)]
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
#[cfg(test)]
use opentelemetry_proto::tonic::trace::v1::{span::SpanKind, status::StatusCode, Span, Status};

/// A request's span ids, made when it arrives (`TraceStep`) and carried with its trace
/// context.
#[derive(Debug, Clone)]
pub(crate) struct SpanIds {
    /// The trace id (the client's, or made here).
    pub(crate) trace: [u8; 16],
    /// The client's span: the server span's parent.
    pub(crate) parent: Option<[u8; 8]>,
    /// The server span.
    pub(crate) server: [u8; 8],
    /// The head decision.
    pub(crate) sampled: bool,
    /// The client span, once the Partner exchange started: its id and start.
    pub(crate) client: Option<([u8; 8], tokio::time::Instant)>,
}

/// How an event stream ended, for its spans.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamEnd {
    /// The Partner's events relayed to the Leader.
    pub(crate) events: u64,
    /// `completed`, or the failure's reason.
    pub(crate) outcome: &'static str,
}

/// A finished request's spans as the request path hands them to the tracer: plain
/// fields borrowed from the request's log (strings cut to `tracing.max_attribute_bytes`),
/// written at once into the export request's bytes (`encode`): nothing is copied or
/// allocated for a span on its own.
#[derive(Debug)]
pub(crate) struct Finished<'a> {
    pub(crate) trace: [u8; 16],
    pub(crate) parent: Option<[u8; 8]>,
    pub(crate) server: [u8; 8],
    pub(crate) sampled: bool,
    /// The client span's id and start (Unix nanoseconds).
    pub(crate) client: Option<([u8; 8], u64)>,
    /// The server span's start and both spans' end (Unix nanoseconds).
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) method: Option<&'static str>,
    pub(crate) command: Option<&'static str>,
    /// The JSON-RPC id as text (a string's contents, a number's digits, `""` for null).
    pub(crate) rpc_id: Option<&'a str>,
    pub(crate) request_id: Option<&'a str>,
    pub(crate) aic: Option<&'a str>,
    pub(crate) partner: Option<&'a str>,
    pub(crate) task_id: Option<&'a str>,
    pub(crate) session_id: Option<&'a str>,
    /// The client's address as text.
    pub(crate) peer: &'a str,
    pub(crate) status: u16,
    /// The gateway's JSON-RPC error code (`0`: none) and its reason.
    pub(crate) code: i32,
    pub(crate) reason: &'static str,
    pub(crate) stream: Option<StreamEnd>,
    /// Whether the request ended in an error (exported whatever the head decision).
    pub(crate) error: bool,
}

impl Finished<'_> {
    /// 2 with a client span, else 1.
    #[cfg(test)]
    pub(crate) fn span_count(&self) -> u64 {
        1 + u64::from(self.client.is_some())
    }

    /// The JSON-RPC id's text from its JSON (`"a"` -> `a`, `null` -> ``), cut to `max`.
    pub(crate) fn id_text(json: &[u8], max: usize) -> &str {
        let text = std::str::from_utf8(json).unwrap_or("");
        let text = match text {
            "null" => "",
            t if t.len() >= 2 && t.starts_with('"') && t.ends_with('"') => &t[1..t.len() - 1],
            t => t,
        };
        cut(text, max)
    }

    /// The OTLP spans as prost structs: the client span if the request reached a Partner,
    /// then the server span. Only the differential test of `encode` uses it (the exporter
    /// writes the bytes by hand, see there).
    #[cfg(test)]
    pub(crate) fn struct_spans(&self, out: &mut Vec<Span>) {
        let status = self.error.then(|| Status {
            code: StatusCode::Error as i32,
            message: self.reason.to_owned(),
        });
        let name = self.method.unwrap_or("aip.request").to_owned();
        let flags = u32::from(self.sampled);
        let mut server = Vec::with_capacity(16);
        self.common(&mut server);
        kv_str(&mut server, "client.address", self.peer);
        if let Some(aic) = self.aic {
            kv_str(&mut server, "aip.caller.aic", aic);
        }
        if let Some(s) = self.session_id {
            kv_str(&mut server, "aip.session_id", s);
        }
        if let Some(r) = self.request_id {
            kv_str(&mut server, "aip.request_id", r);
        }
        kv_int(
            &mut server,
            "http.response.status_code",
            i64::from(self.status),
        );
        if let Some((id, start)) = self.client {
            let mut attrs = Vec::with_capacity(10);
            self.common(&mut attrs);
            out.push(Span {
                trace_id: self.trace.to_vec(),
                span_id: id.to_vec(),
                parent_span_id: self.server.to_vec(),
                flags,
                name: name.clone(),
                kind: SpanKind::Client as i32,
                start_time_unix_nano: start,
                end_time_unix_nano: self.end,
                attributes: attrs,
                status: status.clone(),
                ..Span::default()
            });
        }
        out.push(Span {
            trace_id: self.trace.to_vec(),
            span_id: self.server.to_vec(),
            parent_span_id: self.parent.map(|p| p.to_vec()).unwrap_or_default(),
            flags,
            name,
            kind: SpanKind::Server as i32,
            start_time_unix_nano: self.start,
            end_time_unix_nano: self.end,
            attributes: server,
            status,
            ..Span::default()
        });
    }

    /// The attributes both spans carry.
    #[cfg(test)]
    fn common(&self, a: &mut Vec<KeyValue>) {
        kv_str(a, "rpc.system", "jsonrpc");
        kv_str(a, "rpc.jsonrpc.version", "2.0");
        if let Some(m) = self.method {
            kv_str(a, "rpc.method", m);
        }
        if let Some(id) = self.rpc_id {
            kv_str(a, "rpc.jsonrpc.request_id", id);
        }
        if self.code != 0 {
            kv_int(a, "rpc.jsonrpc.error_code", i64::from(self.code));
            kv_str(a, "rpc.jsonrpc.error_message", self.reason);
        }
        if let Some(p) = self.partner {
            kv_str(a, "aip.partner", p);
        }
        if let Some(c) = self.command {
            kv_str(a, "aip.command", c);
        }
        if let Some(t) = self.task_id {
            kv_str(a, "aip.task_id", t);
        }
        if let Some(s) = self.stream {
            kv_int(
                a,
                "aip.stream.events",
                i64::try_from(s.events).unwrap_or(i64::MAX),
            );
            kv_str(a, "aip.stream.outcome", s.outcome);
        }
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
fn kv(a: &mut Vec<KeyValue>, key: &str, value: any_value::Value) {
    a.push(KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    });
}

#[cfg(test)]
fn kv_str(a: &mut Vec<KeyValue>, key: &str, value: &str) {
    kv(a, key, any_value::Value::StringValue(value.to_owned()));
}

#[cfg(test)]
fn kv_int(a: &mut Vec<KeyValue>, key: &str, value: i64) {
    kv(a, key, any_value::Value::IntValue(value));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_cuts() {
        assert_eq!(Finished::id_text(br#""abc""#, 10), "abc");
        assert_eq!(Finished::id_text(b"42", 10), "42");
        assert_eq!(Finished::id_text(b"null", 10), "");
        assert_eq!(Finished::id_text(br#""abcdef""#, 3), "abc");
        // Never inside a character.
        assert_eq!(cut("aé", 2), "a");
    }
}
