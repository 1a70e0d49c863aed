//! The access log: what a request's line and its metrics say, filled along the pipeline
//! ([`RequestLog`]) and written once, when the response body ends ([`AccessLog`]'s drop),
//! so a stream's line has its whole duration, events, bytes and outcome.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

use crate::body::BoxError;
use crate::relay_body::RelayError;

use crate::identity::Aic;
use crate::jsonrpc::Command;
use crate::outcome::{Ending, StreamTally};
use crate::trace::TraceContext;

/// A string of the request body kept for the access log: a slice of the body (no copy),
/// or, for a string the JSON escaped, its unescaped copy.
#[derive(Debug, Default)]
pub(crate) struct LogText(Bytes);

impl LogText {
    pub(crate) fn of(body: &Bytes, text: &str) -> LogText {
        LogText(crate::body::share_or_copy(body, text.as_bytes()))
    }

    /// The text (valid UTF-8: it came from a validated body or a `str`).
    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

/// What the access log and the request metrics say of a request; filled along the
/// pipeline, written when the response body ends. Never message contents or tokens.
#[derive(Debug, Default)]
pub(crate) struct RequestLog {
    /// The caller's verified AIC.
    pub aic: Option<Aic>,
    /// The Partner, once routed.
    pub partner: Option<Arc<str>>,
    /// The JSON-RPC method's wire name, once validated (AIP's, or A2A's own names).
    pub method: Option<&'static str>,
    /// `params.message.command`.
    pub command: Option<Command>,
    /// The task.
    pub task_id: Option<LogText>,
    /// The session.
    pub session_id: Option<LogText>,
    /// An A2A request's `contextId`.
    pub context_id: Option<LogText>,
    /// The JSON-RPC error code the gateway answered with.
    pub code: Option<i32>,
    /// Its reason.
    pub reason: Option<&'static str>,
    /// Request body bytes.
    pub bytes_in: u64,
    /// Time to the Partner's response headers.
    pub upstream: Option<Duration>,
    /// The request id and trace id.
    pub trace: Option<TraceContext>,
    /// An event stream's tally: the Partner's events relayed to the Leader (not the
    /// gateway's own error event) and how the stream ended.
    pub stream: Option<Arc<StreamTally>>,
}

/// A finished request's line and metrics, written on drop.
pub(crate) struct AccessLog {
    pub(crate) log: RequestLog,
    pub(crate) peer: SocketAddr,
    /// The client's address as text, made once per connection (the `x-forwarded-for`
    /// value): a request's span names it without formatting it again.
    pub(crate) peer_ip: http::HeaderValue,
    /// The connection's key exchange group and cipher suite.
    pub(crate) tls: crate::tls::provider::Negotiated,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    pub(crate) started: Instant,
    pub(crate) status: u16,
    /// Bytes of the body handed on to the Leader's connection.
    pub(crate) bytes_out: u64,
    /// The answer is an event stream (its outcome is logged and counted).
    pub(crate) streamed: bool,
    /// How a plain body ended early, read from its error frame.
    pub(crate) cut: Option<Ending>,
    /// With `[log] format = "amp"`: the AMP writer and the request's path; the access
    /// record is written there instead of the line.
    pub(crate) amp: Option<(Arc<crate::amp::sink::AmpLog>, Box<str>)>,
    /// With spans exported: the exporter, and the JSON-RPC id for the spans.
    pub(crate) tracer: Option<(Arc<crate::otel::Tracer>, crate::jsonrpc::RpcId)>,
}

impl AccessLog {
    /// How the body ended after its head was sent, if that is known.
    pub(crate) fn ending(&self) -> Option<Ending> {
        self.cut
            .or_else(|| self.log.stream.as_ref().and_then(|t| t.ending()))
    }
}

impl AccessLog {
    /// Queues the request's spans (`crate::otel`) when the head sampled it or it ended in
    /// an error (`code`, a status of 500 or more, a stream or body that `failed`).
    fn spans<'a>(
        &'a self,
        tracer: &crate::otel::Tracer,
        id: &crate::jsonrpc::RpcId,
        (code, reason): (i32, &'static str),
        failed: bool,
        total: Duration,
    ) {
        let l = &self.log;
        let Some(ids) = l.trace.as_ref().and_then(|t| t.spans.as_ref()) else {
            return;
        };
        let error = code != 0 || self.status >= 500 || failed;
        if !(ids.sampled || error) {
            return;
        }
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        let end = nanos(now.unwrap_or_default());
        let start = end.saturating_sub(nanos(total));
        let max = tracer.max_attribute_bytes;
        let text = |t: Option<&'a LogText>| t.map(|t| crate::otel::cut(t.as_str(), max));
        tracer.record(&crate::otel::Finished {
            trace: ids.trace,
            parent: ids.parent,
            server: ids.server,
            sampled: ids.sampled,
            // The client span's start from the request's (no clock read of its own).
            client: ids.client.map(|(c, at)| {
                (
                    c,
                    start.saturating_add(nanos(at.saturating_duration_since(self.started))),
                )
            }),
            start,
            end,
            method: l.method,
            command: l.command.map(|c| c.name()),
            rpc_id: Some(crate::otel::Finished::id_text(id.as_bytes(), max)),
            request_id: l.trace.as_ref().map(|t| t.request_id()),
            aic: l.aic.as_ref().map(|a| a.as_str()),
            partner: l.partner.as_deref(),
            task_id: text(l.task_id.as_ref()),
            session_id: text(l.session_id.as_ref()),
            peer: self.peer_ip.to_str().unwrap_or(""),
            status: self.status,
            code,
            reason,
            stream: l
                .stream
                .as_ref()
                .filter(|_| self.streamed)
                .map(|t| crate::otel::StreamEnd {
                    events: t.events(),
                    outcome: t
                        .ending()
                        .map_or(crate::outcome::CLIENT_CLOSED, |e| e.reason),
                }),
            error,
        });
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        let tracer = self.tracer.take();
        let l = &self.log;
        let total = self.started.elapsed();
        let ending = self.ending();
        // A failure after the head: the status stands, the code and reason tell.
        let (mut code, mut reason) = (l.code.unwrap_or(0), l.reason.unwrap_or(""));
        if let Some(e) = ending.filter(|e| e.failed() && code == 0) {
            (code, reason) = (crate::error::codes::INTERNAL_ERROR, e.reason);
        }
        if let Some((amp, path)) = &self.amp {
            amp.access(&crate::amp::sink::Access {
                duration: total,
                method: l.method,
                path: Some(path),
                bytes_in: l.bytes_in,
                status: self.status,
                bytes_out: self.bytes_out,
                caller_aic: l.aic.as_ref().map(|a| a.as_str()),
                caller_ip: self.peer.ip(),
                partner: l.partner.as_deref(),
                code,
                reason,
                trace_id: l.trace.as_ref().map(|t| t.trace_id()),
                task: l.task_id.as_ref().map(|t| t.as_str()),
                session: l.session_id.as_ref().map(|t| t.as_str()),
                command: l.command.map(|c| c.name()),
                request_id: l.trace.as_ref().map(|t| t.request_id()),
                events: l.stream.as_ref().map(|t| t.events()),
            });
        } else {
            self.line(total, code, reason);
        }
        if let Some((tracer, id)) = tracer {
            let failed = ending.is_some_and(|e| e.failed());
            self.spans(&tracer, &id, (code, reason), failed, total);
        }
        self.count(total, code, ending);
    }
}

impl AccessLog {
    /// The access log line (the `pretty` and `json` formats).
    fn line(&self, total: Duration, code: i32, reason: &str) {
        let l = &self.log;
        let partner = l.partner.as_deref().unwrap_or("");
        let method = l.method.unwrap_or("");
        let aic = l.aic.as_ref().map_or("", |a| a.as_str());
        let events = l.stream.as_ref().map_or(0, |t| t.events());
        tracing::info!(
            target: "aipgw::access",
            peer = %self.peer,
            tls_group = self.tls.group,
            tls_suite = self.tls.suite,
            aic = %aic,
            partner,
            method,
            command = l.command.map_or("", |c| c.name()),
            task_id = l.task_id.as_ref().map_or("", |t| t.as_str()),
            session_id = l.session_id.as_ref().map_or("", |t| t.as_str()),
            context_id = l.context_id.as_ref().map_or("", |t| t.as_str()),
            status = self.status,
            code,
            reason,
            bytes_in = l.bytes_in,
            bytes_out = self.bytes_out,
            events,
            upstream_ms = l.upstream.map_or(0.0, |d| d.as_secs_f64() * 1000.0),
            total_ms = total.as_secs_f64() * 1000.0,
            request_id = l.trace.as_ref().map_or("", |t| t.request_id()),
            trace_id = l.trace.as_ref().map_or("", |t| t.trace_id()),
            "request"
        );
    }

    /// The request's metrics.
    fn count(&self, total: Duration, code: i32, ending: Option<Ending>) {
        let l = &self.log;
        let partner = l.partner.as_deref().unwrap_or("");
        let method = l.method.unwrap_or("");
        let m = &self.metrics;
        // The Partner's own series, or `other` beyond `admin.partner_metrics`.
        let label = m.partner_label(l.partner.as_deref());
        m.count_request(&crate::metrics::Finished {
            partner: &label,
            method,
            status: self.status,
            code,
            total: total.as_secs_f64(),
            upstream: l.upstream.map(|up| up.as_secs_f64()),
        });
        if let Some(e) = ending.filter(|e| e.count_upstream) {
            m.upstream_error(partner, e.reason);
        }
        if self.streamed {
            let outcome = ending.map_or(crate::outcome::CLIENT_CLOSED, |e| e.reason);
            let ended = crate::metrics::StreamOutcomeLabels {
                partner: label.clone(),
                outcome,
            };
            m.partner_series(&m.streams_ended, &label, &ended, |c| {
                c.inc();
            });
        }
    }
}

/// A response body that counts what it sends and writes the access log line and the
/// request metrics when it ends or is dropped (so a stream's line has its whole
/// duration, events, bytes and outcome).
pub struct Logged {
    pub(crate) body: crate::reply_body::ReplyBody,
    pub(crate) access: AccessLog,
}

impl Body for Logged {
    type Data = Bytes;
    type Error = BoxError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.access.bytes_out += data.len() as u64;
                }
            }
            Poll::Ready(Some(Err(e))) => {
                self.access.cut = Some(match e.downcast_ref::<RelayError>() {
                    Some(why) => why.ending(),
                    None => Ending {
                        reason: "body_error",
                        count_upstream: false,
                    },
                });
            }
            _ => {}
        }
        polled
    }
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
