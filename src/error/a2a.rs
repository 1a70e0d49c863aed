//! The gateway's errors as an A2A caller gets them (a Partner with `protocol = "a2a"`).
//!
//! A2A gives -32007, -32008 and -32009 other meanings (extended card not configured,
//! extension support required, version not supported) than AIP does (group not
//! supported, authentication required, authorization failed), and reserves -32001..-32099
//! for its own errors, where the gateway's -32029 lies. So an A2A caller never gets one
//! of those from the gateway:
//! - identity (no certificate, a rejected or blocked one), authorization (access rules,
//!   an unscoped `ListTasks`) and quotas: -32000 (JSON-RPC's implementation-defined
//!   server error, outside A2A's range), with their HTTP status (401, 403, 429), as A2A
//!   asks of authentication and authorization errors (section 3.3.2);
//! - a task or context another AIC owns (or one without a known owner under
//!   `policy.tasks.unknown = "refuse"`): -32001 `TaskNotFoundError` with HTTP 200, the
//!   very answer an A2A agent gives for a task that does not exist: A2A's servers "MUST
//!   NOT reveal the existence of resources the client is not authorized to access". The
//!   caller's answer names no owner; the access log and metrics keep the real reason;
//! - every other error keeps its code (-32700, -32600, -32601, -32602, -32603 mean the
//!   same in A2A) and status.
//!
//! `error.data` is what A2A v1.0 asks for (section 9.5): an array holding one
//! `google.rpc.ErrorInfo` (`reason` in capitals, `domain` `aipgw`), whose `metadata`
//! carries the gateway's usual fields as strings (`reason`, `detail`, `field`,
//! `retryAfterMs`, ...). The SDKs read that metadata as the error's data.

use bytes::Bytes;
use http::StatusCode;

use super::{codes, ErrorStatus, GatewayError};
use crate::config::PartnerProtocol;
use crate::jsonrpc::reply::RpcId;

/// A2A codes the gateway answers with.
pub mod a2a_codes {
    /// JSON-RPC's implementation-defined server error, outside A2A's -32001..-32099:
    /// identity, authorization and quota refusals.
    pub const SERVER_ERROR: i32 = -32000;
    /// A2A's `TaskNotFoundError`: a task (or context) the caller does not own.
    pub const TASK_NOT_FOUND: i32 = -32001;
}

/// Ownership refusals, answered as a task that does not exist.
fn hides_a_task(reason: &str) -> bool {
    matches!(
        reason,
        "not_task_owner" | "unknown_task" | "not_context_owner" | "unknown_context"
    )
}

impl GatewayError {
    /// HTTP status, JSON-RPC code and reason label for a caller of a Partner speaking
    /// `protocol` (the reason is what logs and metrics say).
    pub fn classify_for(&self, protocol: PartnerProtocol) -> (StatusCode, i32, &'static str) {
        let (status, code, reason) = self.classify();
        if protocol == PartnerProtocol::Aip {
            return (status, code, reason);
        }
        match code {
            codes::AUTHORIZATION_FAILED if hides_a_task(reason) => {
                (StatusCode::OK, a2a_codes::TASK_NOT_FOUND, reason)
            }
            codes::AUTHENTICATION_REQUIRED
            | codes::INVALID_CREDENTIAL
            | codes::AUTHORIZATION_FAILED
            | codes::RATE_LIMITED => (status, a2a_codes::SERVER_ERROR, reason),
            _ => (status, code, reason),
        }
    }

    /// The response for a caller of a Partner speaking `protocol`: AIP's as
    /// [`GatewayError::into_response`] makes it; A2A's with the code, status and `data`
    /// described in this module (the headers, `Retry-After` and the rest, as for AIP).
    pub fn into_response_for(
        self,
        id: &RpcId,
        mode: ErrorStatus,
        protocol: PartnerProtocol,
    ) -> http::Response<Bytes> {
        if protocol == PartnerProtocol::Aip {
            return self.into_response(id, mode);
        }
        let (mut status, code, reason) = self.classify_for(protocol);
        if mode == ErrorStatus::Ok && !self.status_is_semantic() {
            status = StatusCode::OK;
        }
        let body = a2a_body(id, code, &self.a2a_metadata(reason));
        let mut resp = self.into_response(id, mode);
        *resp.status_mut() = status;
        *resp.body_mut() = body;
        resp
    }

    /// `ErrorInfo.metadata`: the gateway's `error.data`, every value a string; for a
    /// hidden task, nothing but that it was not found.
    fn a2a_metadata(&self, reason: &'static str) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::Value;
        if hides_a_task(reason) {
            let mut m = serde_json::Map::new();
            m.insert("reason".into(), Value::from("task_not_found"));
            m.insert("detail".into(), Value::from("task not found"));
            return m;
        }
        let data = serde_json::to_value(self.data()).unwrap_or_default();
        let Value::Object(fields) = data else {
            return serde_json::Map::new();
        };
        fields
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| match v {
                Value::String(s) => (k, Value::String(s)),
                other => (k, Value::String(other.to_string())),
            })
            .collect()
    }
}

/// The message A2A's tables give each code the gateway answers with.
fn message(code: i32) -> &'static str {
    match code {
        a2a_codes::SERVER_ERROR => "Server error",
        a2a_codes::TASK_NOT_FOUND => "Task not found",
        codes::PARSE_ERROR => "Invalid JSON payload",
        codes::INVALID_REQUEST => "Request payload validation error",
        codes::METHOD_NOT_FOUND => "Method not found",
        codes::INVALID_PARAMS => "Invalid parameters",
        _ => "Internal error",
    }
}

/// A JSON-RPC error response in A2A's form, the id spliced in byte for byte.
fn a2a_body(id: &RpcId, code: i32, metadata: &serde_json::Map<String, serde_json::Value>) -> Bytes {
    let reason = metadata
        .get("reason")
        .and_then(|r| r.as_str())
        .unwrap_or("internal")
        .to_ascii_uppercase();
    let error = serde_json::json!({
        "code": code,
        "message": message(code),
        "data": [{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": reason,
            "domain": "aipgw",
            "metadata": metadata,
        }],
    });
    let error = serde_json::to_vec(&error).unwrap_or_default();
    crate::jsonrpc::reply::with_error(id, &error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn body(resp: &http::Response<Bytes>) -> serde_json::Value {
        serde_json::from_slice(resp.body()).unwrap()
    }

    /// The README's A2A error table, row by row: no A2A caller gets an AIP code that
    /// means something else in A2A.
    #[test]
    fn an_a2a_caller_gets_a2a_codes() {
        let forbidden = |reason| GatewayError::Forbidden {
            reason,
            detail: "task \"t\" belongs to 10001000011K912345E789ABCDEF2353, not someone".into(),
        };
        let limited = GatewayError::RateLimited {
            reason: "aic_rate",
            retry_after: Duration::from_millis(1500),
            body_unread: false,
        };
        for (e, status, code, reason) in [
            (
                GatewayError::AuthenticationRequired,
                401,
                -32000,
                "no_client_certificate",
            ),
            (forbidden("aic_denied"), 403, -32000, "aic_denied"),
            (
                forbidden("list_tasks_unscoped"),
                403,
                -32000,
                "list_tasks_unscoped",
            ),
            (forbidden("not_task_owner"), 200, -32001, "task_not_found"),
            (
                forbidden("not_context_owner"),
                200,
                -32001,
                "task_not_found",
            ),
            (forbidden("unknown_task"), 200, -32001, "task_not_found"),
            (limited, 429, -32000, "aic_rate"),
            (GatewayError::NoRoute("/x".into()), 404, -32601, "no_route"),
        ] {
            let text = e.to_string();
            let resp =
                e.into_response_for(&RpcId::null(), ErrorStatus::Mapped, PartnerProtocol::A2a);
            assert_eq!(resp.status().as_u16(), status, "{text}");
            let v = body(&resp);
            assert_eq!(v["error"]["code"], code, "{v}");
            let info = &v["error"]["data"][0];
            assert_eq!(info["@type"], "type.googleapis.com/google.rpc.ErrorInfo");
            assert_eq!(info["domain"], "aipgw");
            assert_eq!(info["metadata"]["reason"], reason, "{v}");
            assert_eq!(info["reason"], reason.to_ascii_uppercase());
            // A task another AIC owns is not revealed, nor its owner.
            assert!(
                status != 200 || !v.to_string().contains("10001000011K912345E789ABCDEF2353"),
                "{v}"
            );
        }
        let limited = GatewayError::busy("aic_streams");
        let resp =
            limited.into_response_for(&RpcId::null(), ErrorStatus::Mapped, PartnerProtocol::A2a);
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "1");
        assert_eq!(
            body(&resp)["error"]["data"][0]["metadata"]["retryAfterMs"],
            "1000"
        );
        // Under `error_status = "ok"`, HTTP 200 but for the semantic statuses.
        let resp = GatewayError::AuthenticationRequired.into_response_for(
            &RpcId::null(),
            ErrorStatus::Ok,
            PartnerProtocol::A2a,
        );
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()[http::header::WWW_AUTHENTICATE], "mutual-tls");
        // AIP's callers are answered as before.
        let resp = forbidden("not_task_owner").into_response_for(
            &RpcId::null(),
            ErrorStatus::Mapped,
            PartnerProtocol::Aip,
        );
        assert_eq!(
            (
                resp.status().as_u16(),
                body(&resp)["error"]["code"].as_i64()
            ),
            (403, Some(-32009))
        );
    }
}
