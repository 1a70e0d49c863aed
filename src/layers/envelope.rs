//! `Envelope`: the body is parsed by borrowing (valid UTF-8 JSON only, nested at most
//! `limits.max_json_depth` deep, unknown fields included), which yields the id every
//! later answer echoes; the body must be declared as what the gateway reads it as
//! (`application/json`, or no type, in UTF-8, without a content coding: HTTP 415
//! otherwise); its JSON-RPC and AIP semantics are checked, the path's method must match
//! the body's, and a Partner pinned to one AIP generation gets only that generation's
//! shape. What later steps need is kept as a [`Call`].

use bytes::Bytes;

use super::check::{Check, Refuse};
use super::exchange::Exchange;
use super::facts::{Admitted, Call};
use super::handing::id_of_parsed;
use crate::access_log::LogText;
use crate::config::AipVersion;
use crate::error::GatewayError;
use crate::jsonrpc::envelope::{EnvelopeError, Shape};
use crate::jsonrpc::{self, Method};

/// The step (see the module documentation).
pub(crate) enum EnvelopeStep {}

impl Check<Bytes, Admitted> for EnvelopeStep {
    type Found = Call;
    fn check(x: &mut Exchange<Bytes, Admitted>) -> Result<Call, Refuse> {
        Ok(read(x)?)
    }
}

/// Parses and checks the envelope, filling the exchange's id and log: what it says.
fn read(x: &mut Exchange<Bytes, Admitted>) -> Result<Call, GatewayError> {
    let (body, route, x) = (&x.body, &x.facts.route, &mut *x.state);
    let parsed = jsonrpc::envelope::parse_within(body, x.snap.config.max_json_depth);
    x.id = id_of_parsed(body, &parsed);
    check_media(&x.head.headers)?;
    if route.partner.config.protocol == crate::config::PartnerProtocol::A2a {
        // An A2A agent's envelope is not AIP's: only JSON-RPC's form is checked here.
        parsed.map_err(|f| f.error)?;
        return Ok(Call::opaque());
    }
    let envelope = parsed.map_err(|f| f.error)?.validate()?;
    let call = Call::of(body, &envelope);
    let log = &mut x.log;
    log.method = Some(call.method);
    log.command = call.command;
    log.task_id = envelope.task_id.as_ref().map(|t| LogText::of(body, t));
    log.session_id = envelope
        .message
        .as_ref()
        .and_then(|m| m.session_id.as_ref())
        .map(|s| LogText::of(body, s));
    if let Some(path_method) = route.path_method {
        if path_method != call.method {
            return Err(GatewayError::MethodPathMismatch {
                path: path_method.name(),
                body: call.method.name().to_owned(),
            });
        }
    }
    let partner = &route.partner.config;
    check_generation(partner.aip_version, call.method, call.shape, &partner.name)?;
    Ok(call)
}

/// The body must be declared as the gateway reads it: `application/json` (or no type) in
/// UTF-8, with no content coding. The Partner gets the gateway's own `content-type` and
/// no `content-encoding` (`layers::upstream_headers`), so it reads the very text checked
/// here; a client that declared another reading is refused rather than reinterpreted.
fn check_media(headers: &http::HeaderMap) -> Result<(), GatewayError> {
    use http::header::{CONTENT_ENCODING, CONTENT_TYPE};
    let refuse = |reason, detail: String| Err(GatewayError::UnsupportedMedia { reason, detail });
    for value in headers.get_all(CONTENT_TYPE) {
        let text = value.to_str().unwrap_or("\u{fffd}");
        let mut parts = text.split(';');
        let essence = parts.next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return refuse(
                "unsupported_media_type",
                format!("Content-Type {text:?} is not application/json"),
            );
        }
        for param in parts {
            let Some((name, v)) = param.split_once('=') else {
                continue;
            };
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            if name.trim().eq_ignore_ascii_case("charset") && !v.eq_ignore_ascii_case("utf-8") {
                return refuse(
                    "unsupported_charset",
                    format!("Content-Type {text:?}: the body must be UTF-8"),
                );
            }
        }
    }
    for value in headers.get_all(CONTENT_ENCODING) {
        let text = value.to_str().unwrap_or("\u{fffd}");
        let coded = text
            .split(',')
            .map(str::trim)
            .any(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"));
        if coded {
            return refuse(
                "unsupported_encoding",
                format!("Content-Encoding {text:?}: send the body without a content coding"),
            );
        }
    }
    Ok(())
}

/// A Partner pinned to one AIP generation gets only that generation's shape (`stream`
/// has one shape in both).
fn check_generation(
    version: AipVersion,
    method: Method,
    shape: Option<Shape>,
    partner: &str,
) -> Result<(), GatewayError> {
    if method == Method::Stream {
        return Ok(());
    }
    let refuse = |shape: Shape, speaks: &str, send: &str| {
        Err(GatewayError::Envelope(EnvelopeError::InvalidParams {
            field: shape.field(),
            message: format!(
                "Partner {partner} speaks AIP {speaks}: send {send}, not {}",
                shape.field()
            ),
        }))
    };
    match (version, shape) {
        (AipVersion::V1, Some(Shape::Command)) => {
            refuse(Shape::Command, "v01.00", "params.message")
        }
        (AipVersion::V2, Some(Shape::Message)) => {
            refuse(Shape::Message, "v02.01", "params.command")
        }
        _ => Ok(()),
    }
}
