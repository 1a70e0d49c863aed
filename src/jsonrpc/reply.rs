//! JSON-RPC error bodies made by the gateway.
//!
//! The request id is spliced in as the exact bytes the client sent (a slice of the body,
//! not a copy), so an id such as `12345678901234567890123` comes back unchanged.

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;
use serde_json::value::RawValue;

/// The raw JSON text of a request id (`"abc"`, `42`, `null`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcId(Bytes);

impl RpcId {
    /// `null`: the id when the request gave none or could not be read.
    pub fn null() -> Self {
        RpcId(Bytes::from_static(b"null"))
    }

    /// The id as a slice of the request body it was parsed from (no copy).
    ///
    /// `raw` must borrow from `body`, as every `&RawValue` parsed from it does.
    pub fn from_body(body: &Bytes, raw: &RawValue) -> Self {
        RpcId(crate::body::share_or_copy(body, raw.get().as_bytes()))
    }

    /// The id's JSON text.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The id's JSON text as `Bytes`.
    pub fn into_bytes(self) -> Bytes {
        self.0
    }
}

/// `error.data` of a gateway-made error.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorData {
    /// Short snake_case reason; doubles as a metrics label.
    pub reason: &'static str,
    /// The offending field (`-32602`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<&'static str>,
    /// A human detail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The Partner the request was for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partner: Option<String>,
    /// The last `eventSeq` delivered on a stream that ended abnormally (`null`: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_event_seq: Option<Option<u64>>,
    /// When to retry, after a rate-limit refusal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The Partner's HTTP status, when its answer was not a JSON-RPC response.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    /// The lowest `eventSeq` still available, when events were evicted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_available_seq: Option<u64>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    code: i32,
    message: &'a str,
    data: &'a ErrorData,
}

/// `{"jsonrpc":"2.0","id":<id>,"error":{"code":..,"message":..,"data":{..}}}`.
pub fn error_body(id: &RpcId, code: i32, message: &str, data: &ErrorData) -> Bytes {
    let error = serde_json::to_vec(&ErrorObject {
        code,
        message,
        data,
    })
    .unwrap_or_else(|_| br#"{"code":-32603,"message":"Internal error"}"#.to_vec());
    with_error(id, &error)
}

/// `{"jsonrpc":"2.0","id":<id>,"error":<error>}` around an error object already written
/// (AIP's above, A2A's in `error::a2a`).
pub(crate) fn with_error(id: &RpcId, error: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(40 + id.as_bytes().len() + error.len());
    out.put_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.put_slice(id.as_bytes());
    out.put_slice(br#","error":"#);
    out.put_slice(error);
    out.put_u8(b'}');
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_is_a_slice_of_the_body() {
        let body = Bytes::from_static(br#"{"id":12345678901234567890123}"#);
        #[derive(serde::Deserialize)]
        struct W<'a> {
            #[serde(borrow)]
            id: &'a RawValue,
        }
        let w: W<'_> = serde_json::from_slice(&body).unwrap();
        let id = RpcId::from_body(&body, w.id);
        assert_eq!(id.as_bytes(), b"12345678901234567890123");
        assert_eq!(id.as_bytes().as_ptr(), body[6..].as_ptr());
        let out = error_body(
            &id,
            -32600,
            "Invalid Request",
            &ErrorData {
                reason: "x",
                ..Default::default()
            },
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["error"]["data"]["reason"], "x");
        assert!(std::str::from_utf8(&out)
            .unwrap()
            .contains(r#""id":12345678901234567890123,"#));
    }
}

/// What a Partner's answer body is, read as JSON-RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    /// A JSON-RPC 2.0 response carrying a `result`.
    Result,
    /// A JSON-RPC 2.0 response carrying a well-formed `error` (integer `code`, string
    /// `message`).
    Error,
    /// Anything else: not JSON, not an object, no `"jsonrpc":"2.0"`, no `id`, both or
    /// neither of `result` and `error`, or a malformed `error`.
    Other,
}

/// Reads a Partner's answer body as a JSON-RPC response (borrowed, nothing copied).
pub fn answer_shape(body: &[u8]) -> AnswerShape {
    #[derive(serde::Deserialize)]
    struct Response<'a> {
        #[serde(borrow)]
        jsonrpc: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default, deserialize_with = "super::envelope::present")]
        id: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "super::envelope::present")]
        result: Option<&'a RawValue>,
        #[serde(borrow, default, deserialize_with = "super::envelope::present")]
        error: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorObject<'a> {
        #[expect(dead_code, reason = "present in the shape checked, not read")]
        code: i64,
        #[expect(dead_code, reason = "present in the shape checked, not read")]
        #[serde(borrow)]
        message: std::borrow::Cow<'a, str>,
    }
    let Ok(r) = serde_json::from_slice::<Response<'_>>(body) else {
        return AnswerShape::Other;
    };
    if r.jsonrpc.as_deref() != Some("2.0") || r.id.is_none() {
        return AnswerShape::Other;
    }
    match (r.result, r.error) {
        (Some(_), None) => AnswerShape::Result,
        (None, Some(e)) if serde_json::from_str::<ErrorObject<'_>>(e.get()).is_ok() => {
            AnswerShape::Error
        }
        _ => AnswerShape::Other,
    }
}

/// Whether a Partner's answer is a JSON-RPC response carrying a `result` (and no `error`).
pub fn is_result(body: &[u8]) -> bool {
    answer_shape(body) == AnswerShape::Result
}

#[cfg(test)]
mod result_tests {
    use super::is_result;

    #[test]
    fn only_a_result_counts() {
        assert!(is_result(
            br#"{"jsonrpc":"2.0","id":1,"result":{"state":"accepted"}}"#
        ));
        assert!(is_result(br#"{"jsonrpc":"2.0","id":1,"result":null}"#));
        assert!(!is_result(
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001}}"#
        ));
        assert!(!is_result(
            br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#
        ));
        assert!(!is_result(br#"{"result":1,"result":2}"#));
        assert!(!is_result(br#"{"id":1,"result":1}"#), "no jsonrpc member");
        assert!(!is_result(b"<html>"));
        assert!(!is_result(b""));
    }

    #[test]
    fn error_answers_are_told_from_anything_else() {
        use super::{answer_shape, AnswerShape::*};
        let error = br#"{"jsonrpc":"2.0","id":"a","error":{"code":-32001,"message":"Task not found","data":{}}}"#;
        assert_eq!(answer_shape(error), Error);
        let escaped = br#"{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"a \"b\""}}"#;
        assert_eq!(answer_shape(escaped), Error);
        for other in [
            &br#"<!DOCTYPE html><title>500</title>"#[..],
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"m"}}"#,
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":1}}"#,
            br#"{"jsonrpc":"2.0","id":1,"error":"boom"}"#,
            br#"{"jsonrpc":"2.0","error":{"code":1,"message":"no id"}}"#,
            br#"{"jsonrpc":"1.0","id":1,"error":{"code":1,"message":"m"}}"#,
            br#"{"error":"Internal Server Error"}"#,
            br#"[{"jsonrpc":"2.0","id":1,"result":1}]"#,
            b"",
        ] {
            assert_eq!(
                answer_shape(other),
                Other,
                "{}",
                String::from_utf8_lossy(other)
            );
        }
    }
}
