//! `Envelope`: the body is parsed by borrowing (valid UTF-8 JSON only), which yields the
//! id every later answer echoes; its JSON-RPC and AIP semantics are checked, the path's
//! method must match the body's, and a Partner pinned to one AIP generation gets only
//! that generation's shape. What later steps need is kept as a [`Call`].

use bytes::Bytes;

use super::check::{Check, CheckLayer, Checked, Refuse};
use super::exchange::{missing_step, Call, Exchange};
use super::step::id_of_parsed;
use crate::access_log::LogText;
use crate::config::AipVersion;
use crate::error::GatewayError;
use crate::jsonrpc::envelope::{EnvelopeError, Shape};
use crate::jsonrpc::{self, Method};

/// The step (see the module documentation).
pub enum EnvelopeStep {}

/// The `Envelope` layer.
pub type EnvelopeLayer = CheckLayer<EnvelopeStep>;
/// The `Envelope` service.
pub type Envelope<S> = Checked<EnvelopeStep, S>;

impl Check<Bytes> for EnvelopeStep {
    fn check(x: &mut Exchange<Bytes>) -> Result<(), Refuse> {
        Ok(read(x)?)
    }
}

/// Parses and checks the envelope, filling the exchange's id, call and log.
fn read(x: &mut Exchange<Bytes>) -> Result<(), GatewayError> {
    let (body, x) = (&x.body, &mut *x.state);
    let parsed = jsonrpc::parse(body);
    x.id = id_of_parsed(body, &parsed);
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
    let route = x.route.as_ref().ok_or_else(missing_step)?;
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
    x.call = Some(call);
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
