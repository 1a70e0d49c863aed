//! The one error type of the request path, and its one mapping to a response.
//!
//! Errors are classified by who caused them (the client, its credential, the Partner, the
//! gateway); [`GatewayError::into_response`] is the only place that turns one into an
//! HTTP status and a JSON-RPC error, and [`GatewayError::reason`] is the label that
//! `error.data.reason`, logs and metrics share. An A2A Partner's caller gets the same
//! errors in A2A's terms ([`GatewayError::into_response_for`], `a2a`).

mod a2a;
pub use a2a::a2a_codes;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::identity::CredentialError;
use crate::jsonrpc::envelope::EnvelopeError;
use crate::jsonrpc::reply::{error_body, ErrorData, RpcId};

/// The HTTP status of the gateway's own JSON-RPC errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ErrorStatus {
    /// Each error keeps its mapped status (401, 403, 400, 429, 502, ...).
    #[default]
    Mapped,
    /// Every JSON-RPC error is answered with HTTP 200, except body-size, method and
    /// body-timeout refusals (413, 405, 408), whose HTTP meaning a client needs.
    Ok,
}

/// JSON-RPC / AIP error codes the gateway uses.
pub mod codes {
    /// Invalid JSON.
    pub const PARSE_ERROR: i32 = -32700;
    /// Not a valid request object.
    pub const INVALID_REQUEST: i32 = -32600;
    /// Unknown method (or no Partner at that path).
    pub const METHOD_NOT_FOUND: i32 = -32601;
    /// Bad parameters.
    pub const INVALID_PARAMS: i32 = -32602;
    /// Gateway or upstream failure.
    pub const INTERNAL_ERROR: i32 = -32603;
    /// AIP: no credential was presented.
    pub const AUTHENTICATION_REQUIRED: i32 = -32008;
    /// AIP: the caller may not do this.
    pub const AUTHORIZATION_FAILED: i32 = -32009;
    /// AIP: the credential presented is invalid.
    pub const INVALID_CREDENTIAL: i32 = -32010;
    /// The gateway's own (AIP defines none): a quota or concurrency limit refused the
    /// request. In the server range, clear of AIP's -32001..-32010; 29 as in HTTP 429.
    pub const RATE_LIMITED: i32 = -32029;
}

/// Everything that can go wrong with one request.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No client certificate on the connection.
    #[error("a client certificate is required")]
    AuthenticationRequired,
    /// The client certificate was rejected.
    #[error("{0}")]
    InvalidCredential(CredentialError),
    /// The caller is known but may not do this.
    #[error("{detail}")]
    Forbidden {
        /// Short label.
        reason: &'static str,
        /// Human detail.
        detail: String,
    },
    /// The envelope is invalid.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
    /// The body is larger than `limits.max_body_bytes`.
    #[error("request body exceeds {limit} bytes")]
    BodyTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The body did not arrive within `listener.body_read_timeout`.
    #[error("request body was not received in time")]
    BodyTimeout,
    /// The body could not be read (client reset, protocol error).
    #[error("request body could not be read")]
    BodyRead,
    /// The body is not declared as what the gateway reads it as (`application/json` in
    /// UTF-8, no content coding), so a Partner honouring the declaration could read it
    /// otherwise.
    #[error("{detail}")]
    UnsupportedMedia {
        /// Short label: `unsupported_media_type`, `unsupported_charset`,
        /// `unsupported_encoding`.
        reason: &'static str,
        /// Human detail.
        detail: String,
    },
    /// Only POST carries JSON-RPC.
    #[error("HTTP method {0} is not allowed; use POST")]
    HttpMethod(http::Method),
    /// An HTTP/1.1 request head refused before any request was made of it: framing two
    /// readers could read differently, or a head over the listener's bounds (431).
    #[error("malformed HTTP request: {reason}")]
    MalformedHttp {
        /// 400, or 431 for a head over `listener.max_head_bytes` / `max_headers`.
        status: StatusCode,
        /// Short label: `bad_content_length`, `bare_lf`, `head_too_large`, ...
        reason: &'static str,
    },
    /// No Partner serves this host and path.
    #[error("no Partner at {0}")]
    NoRoute(String),
    /// The path names one method and the body another.
    #[error("path is for {path:?} but the body's method is {body:?}")]
    MethodPathMismatch {
        /// Method named by the path.
        path: &'static str,
        /// Method named by the body.
        body: String,
    },
    /// The Partner could not be reached or refused the connection.
    #[error("Partner {partner} is unavailable: {detail}")]
    UpstreamUnavailable {
        /// Partner name.
        partner: String,
        /// What failed.
        detail: String,
    },
    /// The Partner's TLS identity was refused (CA, name or AIC).
    #[error("Partner {partner} failed TLS verification: {detail}")]
    UpstreamTls {
        /// Partner name.
        partner: String,
        /// What failed.
        detail: String,
    },
    /// The Partner did not answer within `upstream.response_timeout`.
    #[error("Partner {partner} did not answer in time")]
    UpstreamTimeout {
        /// Partner name.
        partner: String,
    },
    /// A quota or concurrency limit refused the request.
    #[error("too many requests ({reason}); retry after {} ms", retry_after.as_millis())]
    RateLimited {
        /// Which limit.
        reason: &'static str,
        /// When to try again.
        retry_after: std::time::Duration,
        /// The request body was left unread: the HTTP/1 connection must close.
        body_unread: bool,
    },
    /// The Partner answered something other than a JSON-RPC response: a non-2xx status or
    /// a content type that is neither JSON nor an event stream, with a body that is not a
    /// JSON-RPC response (an HTML error page, an empty 500). See `answer`.
    #[error("Partner {partner} answered HTTP {status} without a JSON-RPC response: {detail}")]
    UpstreamBadResponse {
        /// Partner name.
        partner: String,
        /// The Partner's HTTP status.
        status: u16,
        /// What was wrong.
        detail: String,
    },
    /// The gateway's own failure: a step panicked, an embedding handler failed, or the
    /// request path was assembled without a step a later one needs.
    #[error("internal error ({reason})")]
    Internal {
        /// Short label: `panic` or `handler_error`.
        reason: &'static str,
    },
    /// A `re-stream` of a stream the process this one took over from buffered in its own
    /// memory (no shared replay): its events did not come over (`sse::handed`).
    #[error("task {task:?}'s stream was buffered by the gateway process this one took over from (pid {pid}); its events do not survive an upgrade without a replay shared in Redis (cluster.replay): get the task's state with `get`, or start a new stream")]
    ReplayNotHandedOver {
        /// The task's id.
        task: String,
        /// The old process.
        pid: u32,
    },
    /// A push-notification URL handed to an A2A agent breaks the Partner's policy
    /// (`[partner.a2a.push]`, see `a2a::push`): the request is not forwarded.
    #[error("push notification URL {url:?} at {field} refused: {problem}")]
    PushUrlRefused {
        /// Where in the body (`params.url`, ...).
        field: &'static str,
        /// The URL (empty when the config could not be read).
        url: String,
        /// Why.
        problem: String,
    },
    /// The Partner's answer broke the HTTP protocol.
    #[error("Partner {partner} failed: {detail}")]
    UpstreamProtocol {
        /// Partner name.
        partner: String,
        /// What failed.
        detail: String,
    },
}

impl GatewayError {
    /// A concurrency limit (`reason`) is full: try again in a second.
    pub fn busy(reason: &'static str) -> GatewayError {
        GatewayError::RateLimited {
            reason,
            retry_after: std::time::Duration::from_secs(1),
            body_unread: false,
        }
    }

    /// HTTP status, JSON-RPC code and reason label: the whole mapping.
    pub fn classify(&self) -> (StatusCode, i32, &'static str) {
        use codes::*;
        match self {
            GatewayError::AuthenticationRequired => (
                StatusCode::UNAUTHORIZED,
                AUTHENTICATION_REQUIRED,
                "no_client_certificate",
            ),
            GatewayError::InvalidCredential(c) => {
                (StatusCode::UNAUTHORIZED, INVALID_CREDENTIAL, c.reason())
            }
            GatewayError::Forbidden { reason, .. } => {
                (StatusCode::FORBIDDEN, AUTHORIZATION_FAILED, reason)
            }
            GatewayError::Envelope(e) => match e {
                EnvelopeError::Parse(_) => (StatusCode::BAD_REQUEST, PARSE_ERROR, "parse_error"),
                EnvelopeError::Invalid { reason, .. } => {
                    (StatusCode::BAD_REQUEST, INVALID_REQUEST, reason)
                }
                EnvelopeError::MethodNotFound(_) => {
                    (StatusCode::BAD_REQUEST, METHOD_NOT_FOUND, "unknown_method")
                }
                EnvelopeError::InvalidParams { .. } => {
                    (StatusCode::BAD_REQUEST, INVALID_PARAMS, "invalid_params")
                }
            },
            GatewayError::BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                INVALID_REQUEST,
                "body_too_large",
            ),
            GatewayError::BodyTimeout => {
                (StatusCode::REQUEST_TIMEOUT, INVALID_REQUEST, "body_timeout")
            }
            GatewayError::BodyRead => (StatusCode::BAD_REQUEST, INVALID_REQUEST, "body_read"),
            GatewayError::UnsupportedMedia { reason, .. } => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, INVALID_REQUEST, reason)
            }
            GatewayError::HttpMethod(_) => (
                StatusCode::METHOD_NOT_ALLOWED,
                INVALID_REQUEST,
                "http_method",
            ),
            GatewayError::MalformedHttp { status, reason } => (*status, INVALID_REQUEST, reason),
            GatewayError::NoRoute(_) => (StatusCode::NOT_FOUND, METHOD_NOT_FOUND, "no_route"),
            GatewayError::MethodPathMismatch { .. } => (
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                "method_path_mismatch",
            ),
            GatewayError::UpstreamUnavailable { .. } => (
                StatusCode::BAD_GATEWAY,
                INTERNAL_ERROR,
                "upstream_unavailable",
            ),
            GatewayError::UpstreamTls { .. } => {
                (StatusCode::BAD_GATEWAY, INTERNAL_ERROR, "upstream_tls")
            }
            GatewayError::UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                INTERNAL_ERROR,
                "upstream_timeout",
            ),
            GatewayError::UpstreamProtocol { .. } => {
                (StatusCode::BAD_GATEWAY, INTERNAL_ERROR, "upstream_protocol")
            }
            GatewayError::UpstreamBadResponse { .. } => (
                StatusCode::BAD_GATEWAY,
                INTERNAL_ERROR,
                "upstream_bad_response",
            ),
            GatewayError::RateLimited { reason, .. } => {
                (StatusCode::TOO_MANY_REQUESTS, RATE_LIMITED, reason)
            }
            GatewayError::PushUrlRefused { .. } => {
                (StatusCode::FORBIDDEN, INVALID_REQUEST, "push_url_refused")
            }
            GatewayError::Internal { reason } => {
                (StatusCode::INTERNAL_SERVER_ERROR, INTERNAL_ERROR, reason)
            }
            // Gone for good: asking again gets the same answer.
            GatewayError::ReplayNotHandedOver { .. } => {
                (StatusCode::GONE, INTERNAL_ERROR, "replay_not_handed_over")
            }
        }
    }

    /// The short reason label (`error.data.reason`, logs, metrics).
    pub fn reason(&self) -> &'static str {
        self.classify().2
    }

    /// Whether the connection should be closed after this reply (the request body may be
    /// partly unread, so the HTTP/1 framing can no longer be trusted).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            GatewayError::BodyTooLarge { .. }
                | GatewayError::BodyTimeout
                | GatewayError::BodyRead
                | GatewayError::MalformedHttp { .. }
                | GatewayError::RateLimited {
                    body_unread: true,
                    ..
                }
        )
    }

    fn message(code: i32) -> &'static str {
        match code {
            codes::PARSE_ERROR => "Parse error",
            codes::INVALID_REQUEST => "Invalid Request",
            codes::METHOD_NOT_FOUND => "Method not found",
            codes::INVALID_PARAMS => "Invalid params",
            codes::AUTHENTICATION_REQUIRED => "Authentication required",
            codes::AUTHORIZATION_FAILED => "Authorization failed",
            codes::INVALID_CREDENTIAL => "Invalid credential",
            codes::RATE_LIMITED => "Too many requests",
            _ => "Internal error",
        }
    }

    fn data(&self) -> ErrorData {
        let (_, _, reason) = self.classify();
        let partner = match self {
            GatewayError::UpstreamUnavailable { partner, .. }
            | GatewayError::UpstreamTls { partner, .. }
            | GatewayError::UpstreamTimeout { partner }
            | GatewayError::UpstreamProtocol { partner, .. }
            | GatewayError::UpstreamBadResponse { partner, .. } => Some(partner.clone()),
            _ => None,
        };
        let field = match self {
            GatewayError::Envelope(EnvelopeError::InvalidParams { field, .. })
            | GatewayError::PushUrlRefused { field, .. } => Some(*field),
            _ => None,
        };
        let retry_after_ms = match self {
            GatewayError::RateLimited { retry_after, .. } => {
                Some(retry_after.as_millis().min(u128::from(u64::MAX)) as u64)
            }
            _ => None,
        };
        let upstream_status = match self {
            GatewayError::UpstreamBadResponse { status, .. } => Some(*status),
            _ => None,
        };
        ErrorData {
            reason,
            field,
            upstream_status,
            detail: Some(self.to_string()),
            partner,
            retry_after_ms,
            ..Default::default()
        }
    }

    /// Whether the HTTP status itself carries meaning a client needs (the body was too
    /// large, the wrong HTTP method, the body too slow), so it stands even under
    /// `listener.error_status = "ok"`.
    fn status_is_semantic(&self) -> bool {
        matches!(
            self,
            GatewayError::BodyTooLarge { .. }
                | GatewayError::HttpMethod(_)
                | GatewayError::BodyTimeout
                | GatewayError::MalformedHttp { .. }
        )
    }

    /// The response: the mapped status (or `200`, under `ErrorStatus::Ok`, for every error
    /// whose status is not semantic) and a JSON-RPC error echoing `id`.
    pub fn into_response(self, id: &RpcId, mode: ErrorStatus) -> Response<Bytes> {
        let (mut status, code, _) = self.classify();
        if mode == ErrorStatus::Ok && !self.status_is_semantic() {
            status = StatusCode::OK;
        }
        let body = error_body(id, code, Self::message(code), &self.data());
        let mut resp = Response::new(body);
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if self.closes_connection() {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let GatewayError::RateLimited { retry_after, .. } = &self {
            let secs = retry_after.as_millis().div_ceil(1000).max(1);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                headers.insert(header::RETRY_AFTER, v);
            }
        }
        if let GatewayError::HttpMethod(_) = self {
            headers.insert(header::ALLOW, HeaderValue::from_static("POST"));
        }
        if matches!(
            self,
            GatewayError::AuthenticationRequired | GatewayError::InvalidCredential(_)
        ) {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("mutual-tls"),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn body(resp: &Response<Bytes>) -> serde_json::Value {
        serde_json::from_slice(resp.body()).unwrap()
    }

    /// The table in the README, row by row: the status, the code and the reason each
    /// error is answered with, and the headers that go with some.
    #[test]
    fn each_error_is_answered_as_the_readme_says() {
        let forbidden = GatewayError::Forbidden {
            reason: "not_task_owner",
            detail: "x".into(),
        };
        let limited = GatewayError::RateLimited {
            reason: "aic_rate",
            retry_after: Duration::from_millis(1500),
            body_unread: true,
        };
        let unavailable = GatewayError::UpstreamUnavailable {
            partner: "p".into(),
            detail: "refused".into(),
        };
        for (e, status, code, reason) in [
            (
                GatewayError::AuthenticationRequired,
                401,
                codes::AUTHENTICATION_REQUIRED,
                "no_client_certificate",
            ),
            (
                forbidden,
                403,
                codes::AUTHORIZATION_FAILED,
                "not_task_owner",
            ),
            (limited, 429, codes::RATE_LIMITED, "aic_rate"),
            (
                GatewayError::MalformedHttp {
                    status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                    reason: "head_too_large",
                },
                431,
                codes::INVALID_REQUEST,
                "head_too_large",
            ),
            (
                unavailable,
                502,
                codes::INTERNAL_ERROR,
                "upstream_unavailable",
            ),
        ] {
            let (s, c, r) = e.classify();
            assert_eq!((s.as_u16(), c, r), (status, code, reason), "{e}");
            let resp = e.into_response(&RpcId::null(), ErrorStatus::Mapped);
            assert_eq!(resp.status().as_u16(), status);
            let v = body(&resp);
            assert_eq!(v["error"]["code"], code);
            assert_eq!(v["error"]["data"]["reason"], reason);
            assert_eq!(v["id"], serde_json::Value::Null);
        }
        let limited = GatewayError::busy("partner_in_flight");
        let resp = limited.into_response(&RpcId::null(), ErrorStatus::Mapped);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
        assert_eq!(body(&resp)["error"]["data"]["retryAfterMs"], 1000);
        let resp =
            GatewayError::AuthenticationRequired.into_response(&RpcId::null(), ErrorStatus::Mapped);
        assert_eq!(resp.headers()[header::WWW_AUTHENTICATE], "mutual-tls");
    }

    /// Under `error_status = "ok"` every error is HTTP 200 but those whose status a client
    /// needs; a refusal that leaves the body unread closes the connection.
    #[test]
    fn ok_mode_keeps_only_semantic_statuses() {
        let forbidden = || GatewayError::Forbidden {
            reason: "sender_mismatch",
            detail: "x".into(),
        };
        let resp = forbidden().into_response(&RpcId::null(), ErrorStatus::Ok);
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(body(&resp)["error"]["code"], codes::AUTHORIZATION_FAILED);
        let resp = GatewayError::BodyTimeout.into_response(&RpcId::null(), ErrorStatus::Ok);
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(resp.headers()[header::CONNECTION], "close");
        assert!(!forbidden().closes_connection());
    }
}
