//! The JSON-RPC envelope, parsed by borrowing from the request body.
//!
//! Two phases, so every error can echo the request `id`:
//! 1. [`parse`]: syntax and duplicate keys only; every field is read leniently
//!    (strings borrowed, other types only classified). Yields [`Parsed`] with the raw id.
//! 2. [`Parsed::validate`]: the semantic checks (version, id type, method, params per
//!    method), yielding an [`Envelope`] of borrowed facts.
//!
//! The body itself is never re-serialized: the caller forwards the very bytes it parsed.
//! Must not: allocate a `serde_json::Value` tree, or round-trip the id through a number.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::lenient::{LooseObj, LooseSeq, LooseStr};
use super::vocab::{Command, Method};

/// The fast path: a strict borrowed read of well-formed requests.
mod strict;
pub(crate) mod text;

use text::{check_depth, check_text};

/// Why an envelope was refused; `GatewayError` maps each to its JSON-RPC code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Not JSON (`-32700`).
    #[error("{0}")]
    Parse(String),
    /// JSON, but not a valid AIP request (`-32600`); `reason` is a short label.
    #[error("{message}")]
    Invalid {
        /// Short label (`data.reason`).
        reason: &'static str,
        /// Human message.
        message: String,
    },
    /// Unknown method (`-32601`).
    #[error("method {0:?} does not exist")]
    MethodNotFound(String),
    /// A parameter is missing or wrong (`-32602`); `field` names it.
    #[error("{message}")]
    InvalidParams {
        /// Dotted path of the offending field, e.g. `params.message.command`.
        field: &'static str,
        /// Human message.
        message: String,
    },
}

/// A failed parse, with the request id when it could still be recovered.
#[derive(Debug)]
pub struct ParseFailure<'a> {
    /// The raw id, when the body was an object whose `id` could be read.
    pub id: Option<&'a RawValue>,
    /// What was wrong.
    pub error: EnvelopeError,
}

/// The envelope as the lenient pass reads it (serde derive).
#[derive(Deserialize)]
struct LenientEnvelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: LooseStr<'a>,
    #[serde(borrow, default)]
    method: LooseStr<'a>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: LooseObj<LenientParams<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LenientParams<'a> {
    #[serde(borrow, default)]
    message: LooseObj<RawMessage<'a>>,
    /// v02.01's TaskCommand (`rpc`, `notification/start`).
    #[serde(borrow, default)]
    command: LooseObj<RawMessage<'a>>,
    /// v02.01's direct-RPC invitation (`group`); the fast path leaves it to this pass.
    #[serde(borrow, default)]
    group: LooseObj<RawGroup<'a>>,
    #[serde(borrow, default)]
    task_id: LooseStr<'a>,
    #[serde(borrow, default)]
    url: LooseStr<'a>,
    #[serde(borrow, default)]
    token: LooseStr<'a>,
    #[serde(borrow, default)]
    id: LooseStr<'a>,
    #[serde(borrow, default)]
    notification_config_id: LooseStr<'a>,
}

/// What both passes produce: the fields read, types only classified.
#[derive(Default)]
pub(super) struct RawEnvelope<'a> {
    pub(super) jsonrpc: LooseStr<'a>,
    pub(super) method: LooseStr<'a>,
    pub(super) id: Option<&'a RawValue>,
    pub(super) params: LooseObj<RawParams<'a>>,
}

/// `params`, with one message slot: whichever of `params.message` and `params.command`
/// is present (`carrier` says which, or both, whose contents are never needed). One slot
/// keeps the parsed envelope small, as it is moved from parse to validation.
#[derive(Default)]
pub(super) struct RawParams<'a> {
    pub(super) message: LooseObj<RawMessage<'a>>,
    pub(super) carrier: Carrier,
    pub(super) group: LooseObj<RawGroup<'a>>,
    pub(super) task_id: LooseStr<'a>,
    pub(super) url: LooseStr<'a>,
    pub(super) token: LooseStr<'a>,
    pub(super) id: LooseStr<'a>,
    pub(super) notification_config_id: LooseStr<'a>,
}

/// Which of `params.message` and `params.command` a body carries.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carrier {
    #[default]
    Neither,
    Message,
    Command,
    Both,
}

impl<'a> RawParams<'a> {
    /// Keeps the one slot that matters.
    pub(super) fn one_slot(
        message: LooseObj<RawMessage<'a>>,
        command: LooseObj<RawMessage<'a>>,
    ) -> (LooseObj<RawMessage<'a>>, Carrier) {
        match (message, command) {
            (LooseObj::Absent, LooseObj::Absent) => (LooseObj::Absent, Carrier::Neither),
            (m, LooseObj::Absent) => (m, Carrier::Message),
            (LooseObj::Absent, c) => (c, Carrier::Command),
            _ => (LooseObj::Absent, Carrier::Both),
        }
    }
}

impl<'a> From<LenientEnvelope<'a>> for RawEnvelope<'a> {
    fn from(e: LenientEnvelope<'a>) -> Self {
        RawEnvelope {
            jsonrpc: e.jsonrpc,
            method: e.method,
            id: e.id,
            params: match e.params {
                LooseObj::Absent => LooseObj::Absent,
                LooseObj::Other(k) => LooseObj::Other(k),
                LooseObj::Obj(p) => {
                    let (message, carrier) = RawParams::one_slot(p.message, p.command);
                    LooseObj::Obj(RawParams {
                        message,
                        carrier,
                        group: p.group,
                        task_id: p.task_id,
                        url: p.url,
                        token: p.token,
                        id: p.id,
                        notification_config_id: p.notification_config_id,
                    })
                }
            },
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawMessage<'a> {
    #[serde(borrow, default)]
    pub(super) command: LooseStr<'a>,
    #[serde(borrow, default)]
    pub(super) task_id: LooseStr<'a>,
    #[serde(borrow, default)]
    pub(super) session_id: LooseStr<'a>,
    #[serde(borrow, default)]
    pub(super) sender_id: LooseStr<'a>,
    #[serde(borrow, default)]
    pub(super) sender_role: LooseStr<'a>,
    #[serde(default)]
    pub(super) command_params: LooseObj<RawCommandParams>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawCommandParams {
    #[serde(default)]
    pub(super) last_event_seq: LooseSeq,
}

#[derive(Deserialize)]
pub(super) struct RawGroup<'a> {
    #[serde(borrow, default)]
    pub(super) leader: LooseObj<RawGroupLeader<'a>>,
}

#[derive(Deserialize)]
pub(super) struct RawGroupLeader<'a> {
    #[serde(borrow, default)]
    pub(super) aic: LooseStr<'a>,
}

/// Only the id, for recovering it after a structural error such as a duplicate key.
#[derive(Deserialize)]
struct IdOnly<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
}

/// `Option<&RawValue>` maps `null` to `None`; here a present `null` is `Some("null")`
/// and only an absent key is `None`.
pub(crate) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Phase one: a syntactically valid request object, fields not yet checked.
pub struct Parsed<'a> {
    raw: RawEnvelope<'a>,
}

/// Phase two: a valid AIP request. Every string borrows from the body when it can.
#[derive(Debug)]
pub struct Envelope<'a> {
    /// The raw `id` text (a string, number or null), to echo byte for byte.
    pub id: &'a RawValue,
    /// The method.
    pub method: Method,
    /// `params.message` (v1, and `stream` in both generations) or `params.command` (v2),
    /// for the methods that carry one: whichever the Partner will act on. Any other method
    /// sent one has its sender read (`senderId`, `senderRole`) and nothing else.
    pub message: Option<MessageFacts<'a>>,
    /// Which of the two carried it.
    pub shape: Option<Shape>,
    /// The task the request concerns: `params.message.taskId`, `params.command.taskId` or
    /// `params.taskId`.
    pub task_id: Option<Cow<'a, str>>,
    /// `group`: `params.group.leader.aic`, when present.
    pub group_leader: Option<Cow<'a, str>>,
}

/// Where a request carries its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `params.message` (AIP v01.00; `stream` in both generations).
    Message,
    /// `params.command`, a TaskCommand (AIP v02.01 `rpc` and `notification/start`).
    Command,
}

impl Shape {
    /// The field that carries it.
    pub fn field(self) -> &'static str {
        match self {
            Shape::Message => "params.message",
            Shape::Command => "params.command",
        }
    }
}

/// The dotted names of a message's fields, for errors.
struct Names {
    obj: &'static str,
    command: &'static str,
    task_id: &'static str,
    session_id: &'static str,
    sender_id: &'static str,
    sender_role: &'static str,
    command_params: &'static str,
    last_seq: &'static str,
}

const MESSAGE_NAMES: Names = Names {
    obj: "params.message",
    command: "params.message.command",
    task_id: "params.message.taskId",
    session_id: "params.message.sessionId",
    sender_id: "params.message.senderId",
    sender_role: "params.message.senderRole",
    command_params: "params.message.commandParams",
    last_seq: "params.message.commandParams.lastEventSeq",
};

const COMMAND_NAMES: Names = Names {
    obj: "params.command",
    command: "params.command.command",
    task_id: "params.command.taskId",
    session_id: "params.command.sessionId",
    sender_id: "params.command.senderId",
    sender_role: "params.command.senderRole",
    command_params: "params.command.commandParams",
    last_seq: "params.command.commandParams.lastEventSeq",
};

/// What the gateway reads from `params.message`.
#[derive(Debug, Default)]
pub struct MessageFacts<'a> {
    /// `command`, when present.
    pub command: Option<Command>,
    /// `sessionId`, when present.
    pub session_id: Option<Cow<'a, str>>,
    /// `senderId`, when present.
    pub sender_id: Option<Cow<'a, str>>,
    /// `senderRole`, when present.
    pub sender_role: Option<Cow<'a, str>>,
    /// `commandParams.lastEventSeq` (re-stream); `null` counts as absent.
    pub last_event_seq: Option<u64>,
}

fn invalid(reason: &'static str, message: impl Into<String>) -> EnvelopeError {
    EnvelopeError::Invalid {
        reason,
        message: message.into(),
    }
}

fn bad_param(field: &'static str, message: impl Into<String>) -> EnvelopeError {
    EnvelopeError::InvalidParams {
        field,
        message: message.into(),
    }
}

/// The default of `limits.max_json_depth`: arrays and objects nested at most this deep.
pub const DEFAULT_MAX_DEPTH: usize = 64;
/// The least `limits.max_json_depth` may be: the envelope's own nesting (the request,
/// `params`, its message, `commandParams`).
pub const MIN_MAX_DEPTH: usize = 4;

/// Phase one: text (RFC 8259: UTF-8, and no string a parser could not decode), nesting
/// (at most [`DEFAULT_MAX_DEPTH`]), syntax, shape (an object, not a batch) and duplicate
/// keys.
pub fn parse(body: &[u8]) -> Result<Parsed<'_>, ParseFailure<'_>> {
    parse_with(body, DEFAULT_MAX_DEPTH, true)
}

/// [`parse`], with arrays and objects nested at most `max_depth` deep anywhere in the body
/// (`limits.max_json_depth`).
pub fn parse_within(body: &[u8], max_depth: usize) -> Result<Parsed<'_>, ParseFailure<'_>> {
    parse_with(body, max_depth, true)
}

/// The verdict of the parse as the gateway runs it (fast path first) and of the same
/// parse with the lenient pass alone, each as text: the fuzz target checks they agree.
#[doc(hidden)]
pub fn verdicts(body: &[u8]) -> (String, String) {
    fn outcome(r: Result<Parsed<'_>, ParseFailure<'_>>) -> String {
        match r {
            Err(f) => format!("parse-err {:?} id={:?}", f.error, f.id.map(|i| i.get())),
            Ok(p) => {
                let id = p.id().map(|i| i.get().to_owned());
                format!("{:?} id={id:?}", p.validate())
            }
        }
    }
    (
        outcome(parse_with(body, DEFAULT_MAX_DEPTH, true)),
        outcome(parse_with(body, DEFAULT_MAX_DEPTH, false)),
    )
}

fn parse_with(body: &[u8], max_depth: usize, fast: bool) -> Result<Parsed<'_>, ParseFailure<'_>> {
    // The parser would check UTF-8 only in the strings it reads, skipping message text and
    // unknown fields unchecked. One pass over the whole body settles it before anything is
    // forwarded, and the parse then reads a `str`, so its strings are not checked twice.
    let text = match check_text(body).and_then(|t| check_depth(body, max_depth).map(|()| t)) {
        Ok(text) => text,
        Err(error) => {
            return Err(ParseFailure {
                id: serde_json::from_slice::<IdOnly<'_>>(body)
                    .ok()
                    .and_then(|i| i.id),
                error,
            })
        }
    };
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first != Some(b'{') {
        let error = match serde_json::from_slice::<IgnoredAny>(body) {
            Err(e) => EnvelopeError::Parse(e.to_string()),
            Ok(_) if first == Some(b'[') => invalid(
                "batch",
                "batch requests are not supported (AIP has no batches)",
            ),
            Ok(_) => invalid("not_object", "a request must be a JSON object"),
        };
        return Err(ParseFailure { id: None, error });
    }
    // Fast path: valid requests parse strictly; anything else takes the lenient pass.
    if fast {
        if let Some(raw) = strict::read(text) {
            return Ok(Parsed { raw });
        }
    }
    parse_lenient(text)
}

/// The lenient pass alone (the fast path's fallback).
fn parse_lenient(body: &str) -> Result<Parsed<'_>, ParseFailure<'_>> {
    match serde_json::from_str::<LenientEnvelope<'_>>(body) {
        Ok(raw) => Ok(Parsed { raw: raw.into() }),
        Err(e) if e.is_data() => Err(ParseFailure {
            // A duplicate key (the only data error the lenient types allow) stops the
            // derive; the id can usually still be read on its own.
            id: serde_json::from_str::<IdOnly<'_>>(body)
                .ok()
                .and_then(|i| i.id),
            error: invalid("duplicate_key", e.to_string()),
        }),
        Err(e) => Err(ParseFailure {
            id: None,
            error: EnvelopeError::Parse(e.to_string()),
        }),
    }
}

fn opt_string<'a>(
    value: LooseStr<'a>,
    field: &'static str,
) -> Result<Option<Cow<'a, str>>, EnvelopeError> {
    match value {
        LooseStr::Absent => Ok(None),
        LooseStr::Str(s) => Ok(Some(s)),
        LooseStr::Other(kind) => Err(bad_param(
            field,
            format!("{field} must be a string, not {}", kind.name()),
        )),
    }
}

fn req_string<'a>(value: LooseStr<'a>, field: &'static str) -> Result<Cow<'a, str>, EnvelopeError> {
    opt_string(value, field)?.ok_or_else(|| bad_param(field, format!("{field} is required")))
}

impl<'a> Parsed<'a> {
    /// The raw request id, when present.
    pub fn id(&self) -> Option<&'a RawValue> {
        self.raw.id
    }

    /// Phase two: every semantic check, in a fixed order.
    pub fn validate(self) -> Result<Envelope<'a>, EnvelopeError> {
        // Fields are taken out of `raw` in place: it is several hundred bytes (both
        // generations' message slots), so it is not moved around whole.
        let mut raw = self.raw;
        match raw.jsonrpc.as_str() {
            Some("2.0") => {}
            _ => return Err(invalid("jsonrpc_version", "\"jsonrpc\" must be \"2.0\"")),
        }
        let id = raw.id.ok_or_else(|| {
            invalid(
                "id_missing",
                "\"id\" is required (AIP has no notifications)",
            )
        })?;
        if !matches!(
            id.get().as_bytes().first(),
            Some(b'"' | b'-' | b'0'..=b'9' | b'n')
        ) {
            return Err(invalid(
                "id_type",
                "\"id\" must be a string, number or null",
            ));
        }
        let method = match std::mem::take(&mut raw.method) {
            LooseStr::Str(name) => Method::from_name(&name)
                .ok_or_else(|| EnvelopeError::MethodNotFound(name.into_owned()))?,
            _ => return Err(invalid("method_type", "\"method\" must be a string")),
        };
        let params = match &mut raw.params {
            LooseObj::Obj(p) => p,
            LooseObj::Other(kind) => {
                return Err(bad_param(
                    "params",
                    format!("params must be an object, not {}", kind.name()),
                ))
            }
            LooseObj::Absent => return Err(bad_param("params", "params is required")),
        };
        if method.carries_message() {
            validate_message(method, id, params)
        } else {
            validate_other(method, id, params)
        }
    }
}

/// Picks the field the Partner will act on: `stream` keeps `params.message` in both
/// generations; `rpc` and `notification/start` take exactly one of `params.message` (v1)
/// and `params.command` (v2). A body with both is refused whatever the Partner speaks, so
/// nothing the gateway did not check can reach a Partner.
fn validate_message<'a>(
    method: Method,
    id: &'a RawValue,
    params: &mut RawParams<'a>,
) -> Result<Envelope<'a>, EnvelopeError> {
    let (shape, names) = shape_of(method, params.carrier)?;
    let m = message_object(std::mem::take(&mut params.message), names)?;
    let command = command_of(method, m.command, names)?;
    let task_id = opt_string(m.task_id, names.task_id)?;
    if command == Some(Command::ReStream) && task_id.is_none() {
        return Err(bad_param(
            names.task_id,
            format!("re-stream needs {}", names.task_id),
        ));
    }
    let last_event_seq = last_event_seq_of(m.command_params, names)?;
    Ok(Envelope {
        id,
        method,
        task_id,
        shape: Some(shape),
        group_leader: None,
        message: Some(MessageFacts {
            last_event_seq,
            command,
            session_id: opt_string(m.session_id, names.session_id)?,
            sender_id: opt_string(m.sender_id, names.sender_id)?,
            sender_role: opt_string(m.sender_role, names.sender_role)?,
        }),
    })
}

/// Which generation's shape `params` carries (`stream` has one shape in both), and the
/// field names its errors use.
fn shape_of(method: Method, carrier: Carrier) -> Result<(Shape, &'static Names), EnvelopeError> {
    match (method, carrier) {
        (Method::Stream, Carrier::Command | Carrier::Both) => Err(bad_param(
            "params.command",
            "stream carries its command in params.message, in both AIP generations",
        )),
        (_, Carrier::Both) => Err(bad_param(
            "params.command",
            "params carries both message (AIP v01.00) and command (v02.01); send exactly one",
        )),
        (_, Carrier::Command) => Ok((Shape::Command, &COMMAND_NAMES)),
        (_, Carrier::Message) => Ok((Shape::Message, &MESSAGE_NAMES)),
        (Method::Stream, Carrier::Neither) => {
            Err(bad_param("params.message", "params.message is required"))
        }
        (_, Carrier::Neither) => Err(bad_param(
            "params.message",
            "params.message (AIP v01.00) or params.command (v02.01) is required",
        )),
    }
}

/// The message (or command) object itself.
fn message_object<'a>(
    m: LooseObj<RawMessage<'a>>,
    names: &Names,
) -> Result<RawMessage<'a>, EnvelopeError> {
    match m {
        LooseObj::Obj(m) => Ok(m),
        LooseObj::Other(kind) => Err(bad_param(
            names.obj,
            format!("{} must be an object, not {}", names.obj, kind.name()),
        )),
        LooseObj::Absent => Err(bad_param(names.obj, format!("{} is required", names.obj))),
    }
}

/// The command, known by name and allowed in `method`.
fn command_of(
    method: Method,
    command: LooseStr<'_>,
    names: &Names,
) -> Result<Option<Command>, EnvelopeError> {
    let command = match opt_string(command, names.command)? {
        None => None,
        Some(c) => Some(
            Command::from_name(&c)
                .ok_or_else(|| bad_param(names.command, format!("unknown command {c:?}")))?,
        ),
    };
    let refuse = |only: &'static str| Err(bad_param(names.command, only));
    match (method, command) {
        (Method::Stream, Some(Command::Start | Command::ReStream)) => Ok(command),
        (Method::Stream, _) => refuse("stream takes only the commands start and re-stream"),
        (Method::NotificationStart, Some(Command::Start)) => Ok(command),
        (Method::NotificationStart, _) => refuse("notification/start takes only the command start"),
        _ => Ok(command),
    }
}

/// `commandParams.lastEventSeq`, when there is one.
fn last_event_seq_of(
    params: LooseObj<RawCommandParams>,
    names: &Names,
) -> Result<Option<u64>, EnvelopeError> {
    let p = match params {
        LooseObj::Absent => return Ok(None),
        LooseObj::Obj(p) => p,
        LooseObj::Other(kind) => {
            let field = names.command_params;
            return Err(bad_param(
                field,
                format!("{field} must be an object, not {}", kind.name()),
            ));
        }
    };
    match p.last_event_seq {
        LooseSeq::Absent | LooseSeq::Null => Ok(None),
        LooseSeq::Num(n) => Ok(Some(n)),
        LooseSeq::Other(kind) => Err(bad_param(
            names.last_seq,
            format!(
                "{} must be a non-negative integer, not {}",
                names.last_seq,
                kind.name()
            ),
        )),
    }
}

fn validate_other<'a>(
    method: Method,
    id: &'a RawValue,
    params: &mut RawParams<'a>,
) -> Result<Envelope<'a>, EnvelopeError> {
    let take = |s: &mut LooseStr<'a>| std::mem::take(s);
    let task_id = match method {
        Method::NotificationSet => {
            req_string(take(&mut params.url), "params.url")?;
            req_string(take(&mut params.token), "params.token")?;
            opt_string(take(&mut params.id), "params.id")?;
            Some(req_string(take(&mut params.task_id), "params.taskId")?)
        }
        Method::NotificationGet | Method::NotificationDelete => {
            opt_string(
                take(&mut params.notification_config_id),
                "params.notificationConfigId",
            )?;
            Some(req_string(take(&mut params.task_id), "params.taskId")?)
        }
        _ => opt_string(take(&mut params.task_id), "params.taskId")?,
    };
    const LEADER: &str = "params.group.leader.aic";
    let group_leader = match (method, std::mem::take(&mut params.group)) {
        (Method::Group, LooseObj::Obj(g)) => match g.leader {
            LooseObj::Obj(l) => opt_string(l.aic, LEADER)?,
            LooseObj::Absent => None,
            LooseObj::Other(kind) => {
                return Err(bad_param(
                    "params.group.leader",
                    format!("params.group.leader must be an object, not {}", kind.name()),
                ))
            }
        },
        (Method::Group, LooseObj::Other(kind)) => {
            return Err(bad_param(
                "params.group",
                format!("params.group must be an object, not {}", kind.name()),
            ))
        }
        _ => None,
    };
    // A method that takes no message may still be sent one (`group` with a message, say):
    // a Partner that reads its sender must read the caller, so it is bound here too.
    let message = match (params.carrier, std::mem::take(&mut params.message)) {
        (Carrier::Both, _) => {
            return Err(bad_param(
                "params.command",
                "params carries both message and command; send at most one",
            ))
        }
        (carrier, LooseObj::Obj(m)) => {
            let names = match carrier {
                Carrier::Command => &COMMAND_NAMES,
                _ => &MESSAGE_NAMES,
            };
            Some(MessageFacts {
                sender_id: opt_string(m.sender_id, names.sender_id)?,
                sender_role: opt_string(m.sender_role, names.sender_role)?,
                ..MessageFacts::default()
            })
        }
        _ => None,
    };
    Ok(Envelope {
        id,
        method,
        task_id,
        shape: None,
        group_leader,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hole 8: bytes a Partner could not decode are refused with -32700, id echoed.
    #[test]
    fn invalid_text_is_a_parse_error() {
        let start = br#"{"jsonrpc":"2.0","method":"rpc","id":"x-1","params":{"message":{"text":""#;
        let end = br#""}}}"#;
        let with = |mid: &[u8]| [&start[..], mid, &end[..]].concat();
        for bad in [
            &b"\xff"[..],
            b"\xc3",
            b"\xed\xa0\x80", // a surrogate encoded as UTF-8
            br"\ud800",
            br"\udc00",
            br"\ud800\u0041",
            br"\ud800x",
            br"\\\ud800",
            br"\uDBFF\uDBFF",
        ] {
            let body = with(bad);
            let f = parse(&body)
                .err()
                .unwrap_or_else(|| panic!("accepted {:?}", String::from_utf8_lossy(&body)));
            assert!(matches!(f.error, EnvelopeError::Parse(_)), "{:?}", f.error);
            assert_eq!(f.id.map(|r| r.get()), Some("\"x-1\""));
        }
        for good in [
            &br"\ud83d\ude00"[..],
            br"\uD83D\uDE00",
            br"\\ud800",
            br"\\\\ud800",
            br#"\u00e9 \n \""#,
            "é 😀".as_bytes(),
        ] {
            let body = with(good);
            assert!(
                check_text(&body).is_ok(),
                "refused {:?}",
                String::from_utf8_lossy(&body)
            );
        }
    }

    fn ok(body: &str) -> Envelope<'_> {
        parse(body.as_bytes())
            .map_err(|f| f.error)
            .and_then(Parsed::validate)
            .unwrap()
    }

    /// The error and the echoed id (as text, `None` when it could not be read).
    fn err(body: &str) -> (EnvelopeError, Option<String>) {
        match parse(body.as_bytes()) {
            Err(f) => (f.error, f.id.map(|i| i.get().to_owned())),
            Ok(p) => {
                let id = p.id().map(|i| i.get().to_owned());
                (p.validate().unwrap_err(), id)
            }
        }
    }

    const START: &str = r#"{"jsonrpc":"2.0","method":"rpc","id":"1","params":{"message":{"type":"message","id":"m1","senderRole":"leader","senderId":"X","command":"start","dataItems":[{"type":"text","text":"hi"}],"taskId":"t1","sessionId":"s1"}}}"#;

    #[test]
    fn valid_rpc_start_borrows() {
        let e = ok(START);
        assert_eq!(e.method, Method::Rpc);
        assert_eq!(e.id.get(), "\"1\"");
        assert!(matches!(e.task_id, Some(Cow::Borrowed("t1"))));
        let m = e.message.unwrap();
        assert_eq!(m.command, Some(Command::Start));
        assert!(matches!(m.sender_id, Some(Cow::Borrowed("X"))));
    }

    #[test]
    fn huge_numeric_id_is_kept_verbatim() {
        let body = START.replace(r#""id":"1""#, r#""id":12345678901234567890123"#);
        assert_eq!(ok(&body).id.get(), "12345678901234567890123");
        let bad = body.replace(r#""jsonrpc":"2.0""#, r#""jsonrpc":"1.0""#);
        assert_eq!(err(&bad).1.as_deref(), Some("12345678901234567890123"));
    }

    #[test]
    fn syntax_errors_are_parse_errors() {
        for body in ["", "{", "{\"a\":}", "nope", "[1,", "{\"id\":1} x"] {
            assert!(matches!(err(body).0, EnvelopeError::Parse(_)), "{body:?}");
        }
    }

    #[test]
    fn shape_errors() {
        let (e, _) = err(&format!("[{START}]"));
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "batch",
                ..
            }
        ));
        let (e, _) = err("\"hello\"");
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "not_object",
                ..
            }
        ));
    }

    #[test]
    fn duplicate_keys_are_rejected_with_the_id() {
        let body = START.replace(r#""method":"rpc""#, r#""method":"rpc","method":"stream""#);
        let (e, id) = err(&body);
        assert!(
            matches!(
                e,
                EnvelopeError::Invalid {
                    reason: "duplicate_key",
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(id.as_deref(), Some("\"1\""));
        let body = START.replace(
            r#""command":"start""#,
            r#""command":"start","command":"cancel""#,
        );
        assert!(matches!(
            err(&body).0,
            EnvelopeError::Invalid {
                reason: "duplicate_key",
                ..
            }
        ));
    }

    #[test]
    fn semantic_errors_keep_the_id_even_when_it_comes_last() {
        let (e, id) = err(r#"{"jsonrpc":"1.0","method":"rpc","params":{},"id":7}"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "jsonrpc_version",
                ..
            }
        ));
        assert_eq!(id.as_deref(), Some("7"));
        let (e, id) = err(r#"{"jsonrpc":"2.0","method":"nope","params":{},"id":null}"#);
        assert_eq!(e, EnvelopeError::MethodNotFound("nope".into()));
        assert_eq!(id.as_deref(), Some("null"));
        let (e, _) = err(r#"{"jsonrpc":"2.0","method":5,"params":{},"id":1}"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "method_type",
                ..
            }
        ));
        let (e, _) = err(r#"{"jsonrpc":"2.0","method":"rpc","params":{},"id":{}}"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "id_type",
                ..
            }
        ));
        let (e, _) = err(r#"{"jsonrpc":"2.0","method":"rpc","params":{}}"#);
        assert!(matches!(
            e,
            EnvelopeError::Invalid {
                reason: "id_missing",
                ..
            }
        ));
    }

    #[test]
    fn params_errors_name_the_field() {
        let cases = [
            (r#"{"jsonrpc":"2.0","method":"rpc","id":1}"#, "params"),
            (
                r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":[]}"#,
                "params",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{}}"#,
                "params.message",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":"x"}}"#,
                "params.message",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{"command":"fly"}}}"#,
                "params.message.command",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"stream","id":1,"params":{"message":{"command":"get"}}}"#,
                "params.message.command",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"stream","id":1,"params":{"message":{"command":"re-stream"}}}"#,
                "params.message.taskId",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{"senderId":3}}}"#,
                "params.message.senderId",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notification/set","id":1,"params":{"taskId":"t","token":"x"}}"#,
                "params.url",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notification/set","id":1,"params":{"taskId":"t","url":"u"}}"#,
                "params.token",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notification/get","id":1,"params":{}}"#,
                "params.taskId",
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notification/delete","id":1,"params":{"taskId":1}}"#,
                "params.taskId",
            ),
        ];
        for (body, field) in cases {
            match err(body).0 {
                EnvelopeError::InvalidParams { field: f, .. } => assert_eq!(f, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[test]
    fn other_methods_validate() {
        let e = ok(
            r#"{"jsonrpc":"2.0","method":"notification/set","id":"n","params":{"url":"https://l/cb","token":"t","taskId":"t9"}}"#,
        );
        assert_eq!(e.method, Method::NotificationSet);
        assert_eq!(e.task_id.as_deref(), Some("t9"));
        let e = ok(r#"{"jsonrpc":"2.0","method":"group","id":2,"params":{"groupId":"g"}}"#);
        assert_eq!(e.method, Method::Group);
        let e = ok(
            r#"{"jsonrpc":"2.0","method":"notification/start","id":2,"params":{"message":{"command":"start","taskId":"a"}}}"#,
        );
        assert_eq!(e.method, Method::NotificationStart);
    }

    /// The fast path must decide exactly as the lenient pass does.
    #[test]
    fn fast_and_lenient_paths_agree() {
        let msg = r#""message":{"command":"start","taskId":"t","sessionId":"s","senderId":"A","senderRole":"leader"}"#;
        let mut bodies = vec![START.to_owned()];
        for (from, to) in [
            (r#""senderId":"A""#, r#""senderId":null"#),
            (r#""senderId":"A""#, r#""senderId":7"#),
            (r#""senderId":"A""#, r#""senderId":"AB""#),
            (r#""command":"start""#, r#""command":null"#),
            (r#""command":"start""#, r#""command":["start"]"#),
            (r#""taskId":"t""#, r#""taskId":{}"#),
            (msg, r#""message":null"#),
            (msg, r#""message":["x"]"#),
            (msg, r#""message":"x""#),
            (msg, r#""message":{},"message":{}"#),
            (msg, r#""taskId":null"#),
            (msg, r#""taskId":"t","url":"u","token":null"#),
        ] {
            bodies.push(
                format!(r#"{{"jsonrpc":"2.0","method":"rpc","id":1,"params":{{{msg}}}}}"#)
                    .replace(from, to),
            );
        }
        for (from, to) in [
            (r#""params":{"#, r#""params":[{"#),
            (r#""jsonrpc":"2.0""#, r#""jsonrpc":null"#),
            (r#""jsonrpc":"2.0""#, r#""jsonrpc":2.0"#),
            (r#""method":"rpc""#, r#""method":null"#),
            (r#""method":"rpc""#, r#""method":"rpc""#),
            (r#""id":1"#, r#""id":null"#),
            (r#""id":1"#, r#""id":[1]"#),
            (r#""id":1"#, r#""id":1,"id":2"#),
            (r#""id":1,"#, ""),
        ] {
            let b = format!(r#"{{"jsonrpc":"2.0","method":"rpc","id":1,"params":{{{msg}}}}}"#);
            bodies.push(b.replace(from, to));
        }
        bodies.push(r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":[{"message":{}}]}"#.into());
        bodies.push(r#"{"jsonrpc":"2.0","method":"rpc","id":1}"#.into());
        bodies.push(r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":[]}"#.into());
        for cp in [
            r#"{"lastEventSeq":3}"#,
            r#"{"lastEventSeq":null}"#,
            r#"{"lastEventSeq":-1}"#,
            r#"{"lastEventSeq":2.5}"#,
            r#"{"lastEventSeq":"3"}"#,
            r#"{"lastEventSeq":3,"lastEventSeq":4}"#,
            r#"{"responseTimeout":30}"#,
            "null",
            "[]",
            "7",
        ] {
            bodies.push(format!(
                r#"{{"jsonrpc":"2.0","method":"stream","id":1,"params":{{"message":{{"command":"re-stream","taskId":"t","commandParams":{cp}}}}}}}"#
            ));
        }
        bodies.push(r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{"task\u0049d":"t","sender\u0049d":5}}}"#.into());
        bodies.push(r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"x":1,"x":2,"message":{"y":[],"y":{}}}}"#.into());
        bodies.push(r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{"taskId":"a","taskId":"b"}}}"#.into());
        bodies.push(r#"{"jsonrpc":"2.0","method":"group","id":1,"params":{}}"#.into());
        bodies.push(
            r#"{"jsonrpc":"2.0","method":"notification/get","id":1,"params":{"taskId":null}}"#
                .into(),
        );
        // AIP v02.01: every v1 body above again with its message in `params.command`,
        // and the shapes that mix or nest them.
        let v2: Vec<String> = bodies
            .iter()
            .filter(|b| b.contains(r#""message":"#))
            .map(|b| b.replacen(r#""message":"#, r#""command":"#, 1))
            .collect();
        bodies.extend(v2);
        let cmd = r#""command":{"command":"cancel","taskId":"v","senderId":"A"}"#;
        for params in [
            format!("{msg},{cmd}"),
            format!("{cmd},{msg}"),
            format!("{cmd},{cmd}"),
            format!(r#"{msg},"command":null"#),
            format!(r#""command":[],{msg}"#),
            r#""command":{"command":"start","command":"get"}"#.to_owned(),
            r#""group":{"groupId":"g","leader":{"aic":"A"}}"#.to_owned(),
            r#""group":{"leader":{"aic":7}}"#.to_owned(),
            r#""group":{"leader":[]}"#.to_owned(),
            r#""group":null"#.to_owned(),
        ] {
            for method in ["rpc", "notification/start", "stream", "group"] {
                bodies.push(format!(
                    r#"{{"jsonrpc":"2.0","method":"{method}","id":1,"params":{{{params}}}}}"#
                ));
            }
        }
        for body in &bodies {
            let b = body.as_bytes();
            let (gateway, lenient) = verdicts(b);
            assert_eq!(gateway, lenient, "{body}");
        }
    }

    #[test]
    fn v2_commands_are_read_and_checked() {
        let e = ok(
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"command":{"type":"task-command","command":"cancel","taskId":"t","senderId":"S","sessionId":"s"}}}"#,
        );
        assert_eq!(e.shape, Some(Shape::Command));
        assert_eq!(e.task_id.as_deref(), Some("t"));
        let m = e.message.unwrap();
        assert_eq!(
            (m.command, m.sender_id.as_deref()),
            (Some(Command::Cancel), Some("S"))
        );
        let field = |body: &str| match parse(body.as_bytes()).ok().unwrap().validate() {
            Err(EnvelopeError::InvalidParams { field, .. }) => field,
            other => panic!("{body}: {other:?}"),
        };
        assert_eq!(
            field(
                r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{},"command":{}}}"#
            ),
            "params.command"
        );
        assert_eq!(
            field(
                r#"{"jsonrpc":"2.0","method":"notification/start","id":1,"params":{"command":{"command":"get"}}}"#
            ),
            "params.command.command"
        );
        assert_eq!(
            field(
                r#"{"jsonrpc":"2.0","method":"stream","id":1,"params":{"command":{"command":"start"}}}"#
            ),
            "params.command"
        );
        let g = ok(
            r#"{"jsonrpc":"2.0","method":"group","id":1,"params":{"group":{"leader":{"aic":"L"}}}}"#,
        );
        assert_eq!(g.group_leader.as_deref(), Some("L"));
    }

    /// Issue 28 hole 4: nesting is bounded over the whole body, unknown fields and the
    /// contents of strings minded, and the id is still echoed.
    #[test]
    fn nesting_is_bounded_everywhere() {
        let with = |extra: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"rpc","id":"d-1","x":{extra},"params":{{"message":{{"command":"get","taskId":"t"}}}}}}"#
            )
        };
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        // The request itself is one level: 63 more fit in 64, 64 more do not.
        assert!(parse(with(&deep(63)).as_bytes()).is_ok());
        for body in [with(&deep(64)), with(&deep(100_000))] {
            let f = parse(body.as_bytes()).err().expect("too deep");
            assert!(
                matches!(
                    f.error,
                    EnvelopeError::Invalid {
                        reason: "json_too_deep",
                        ..
                    }
                ),
                "{:?}",
                f.error
            );
            assert_eq!(f.id.map(|i| i.get()), Some("\"d-1\""));
        }
        assert!(parse_within(with(&deep(10)).as_bytes(), 10).is_err());
        assert!(parse_within(with(&deep(9)).as_bytes(), 10).is_ok());
        // Brackets inside strings (escaped quotes and backslashes too) are text.
        let text = format!(r#""{}\"\\{}""#, "[".repeat(200), "{".repeat(200));
        assert!(parse(with(&text).as_bytes()).is_ok());
        // Many siblings are not depth.
        let wide = format!("[{}[]]", "[],".repeat(2000));
        assert!(parse(with(&wide).as_bytes()).is_ok());
    }

    /// Issue 28 hole 5: every method sent a message or command has its sender read.
    #[test]
    fn every_method_reads_a_sender() {
        for method in [
            "group",
            "notification/set",
            "notification/get",
            "notification/delete",
        ] {
            for key in ["message", "command"] {
                let body = format!(
                    r#"{{"jsonrpc":"2.0","method":"{method}","id":1,"params":{{"taskId":"t","url":"u","token":"k","{key}":{{"senderId":"S","senderRole":"leader"}}}}}}"#
                );
                let e = ok(&body);
                let m = e.message.expect("the sender is read");
                assert_eq!(m.sender_id.as_deref(), Some("S"), "{body}");
                assert_eq!(m.sender_role.as_deref(), Some("leader"), "{body}");
                let bad = body.replace(r#""senderId":"S""#, r#""senderId":7"#);
                match err(&bad).0 {
                    EnvelopeError::InvalidParams { field, .. } => {
                        assert_eq!(field, format!("params.{key}.senderId"), "{bad}")
                    }
                    other => panic!("{bad}: {other:?}"),
                }
            }
            let both = format!(
                r#"{{"jsonrpc":"2.0","method":"{method}","id":1,"params":{{"taskId":"t","url":"u","token":"k","message":{{}},"command":{{}}}}}}"#
            );
            assert!(matches!(err(&both).0, EnvelopeError::InvalidParams { .. }));
        }
    }

    #[test]
    fn escaped_strings_are_read() {
        let e = ok(
            r#"{"jsonrpc":"2\u002e0","method":"r\u0070c","id":1,"params":{"message":{"taskId":"t\n1"}}}"#,
        );
        assert_eq!(e.method, Method::Rpc);
        assert_eq!(e.task_id.as_deref(), Some("t\n1"));
    }
}
