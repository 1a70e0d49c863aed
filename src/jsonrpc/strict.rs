//! The envelope's fast path: strict borrowed structs for well-formed requests.
//!
//! Valid requests are the common case, and a strict borrowed read is the cheapest way
//! serde_json can take them. Anything this pass does not accept (a wrong type, an escaped
//! string, `null` where a string belongs, a duplicate key, bad syntax) falls back to the
//! lenient pass in `envelope`, which decides the exact error and still recovers the id.
//! Both passes produce the same `RawEnvelope`, so `Parsed::validate` applies one set of
//! rules whichever pass read the body; this pass must therefore never accept what the
//! lenient pass would reject (`null` is not absent; `params` and `message` must be
//! objects, never arrays). `envelope::tests::fast_and_lenient_paths_agree` checks it.
//!
//! `params` and `message` are read by one hand-written map visitor rather than serde's
//! derive: reached through `deserialize_map`, it rejects arrays for free, where a derive
//! would need a wrapper costing ~25 ns per object on a 400-byte request.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Error as _, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::envelope::{RawCommandParams, RawEnvelope, RawMessage, RawParams};
use super::lenient::{LooseObj, LooseSeq, LooseStr};

#[derive(Deserialize)]
pub(crate) struct FastEnvelope<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    #[serde(borrow)]
    method: &'a str,
    #[serde(borrow, default, deserialize_with = "super::envelope::present")]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    params: FastParams<'a>,
}

const MESSAGE_FIELDS: [&str; 5] = ["command", "taskId", "sessionId", "senderId", "senderRole"];
const PARAMS_FIELDS: [&str; 5] = ["taskId", "url", "token", "id", "notificationConfigId"];

/// `params.message`: the string fields in [`MESSAGE_FIELDS`] order, and
/// `commandParams` (present) with its `lastEventSeq` (`null` = absent).
struct FastMessage<'a>([Option<&'a str>; 5], Option<Option<u64>>);

/// `params`: `message` (v1) or `command` (v2), and the string fields in
/// [`PARAMS_FIELDS`] order.
struct FastParams<'a> {
    message: Option<FastMessage<'a>>,
    command: Option<FastMessage<'a>>,
    fields: [Option<&'a str>; 5],
    command_params: Option<Option<u64>>,
}

/// `commandParams`: only `lastEventSeq` is read.
struct FastCommandParams(Option<u64>);

impl<'de> Deserialize<'de> for FastCommandParams {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FastCommandParams;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut seq: Option<Option<u64>> = None;
                while let Some(key) = map.next_key::<&'de str>()? {
                    if key == "lastEventSeq" {
                        if seq.is_some() {
                            return Err(A::Error::custom("duplicate field `lastEventSeq`"));
                        }
                        seq = Some(map.next_value::<Option<u64>>()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(FastCommandParams(seq.flatten()))
            }
        }
        d.deserialize_map(V)
    }
}

/// Reads an object whose interesting keys are strings (and, for `params`, `message`);
/// other keys are skipped. A duplicate interesting key is an error (-> lenient pass).
struct FieldsVisitor<const WITH_MESSAGE: bool>;

impl<'de, const WITH_MESSAGE: bool> Visitor<'de> for FieldsVisitor<WITH_MESSAGE> {
    type Value = FastParams<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let names = if WITH_MESSAGE {
            PARAMS_FIELDS
        } else {
            MESSAGE_FIELDS
        };
        let mut out = FastParams {
            message: None,
            command: None,
            fields: [None; 5],
            command_params: None,
        };
        while let Some(key) = map.next_key::<&'de str>()? {
            let slot = match key {
                "message" if WITH_MESSAGE => Some(&mut out.message),
                "command" if WITH_MESSAGE => Some(&mut out.command),
                _ => None,
            };
            if let Some(slot) = slot {
                if slot.is_some() {
                    return Err(A::Error::custom(format_args!("duplicate field `{key}`")));
                }
                *slot = Some(map.next_value::<FastMessage<'de>>()?);
                continue;
            }
            if WITH_MESSAGE && key == "group" {
                // A rare method with nested fields: the lenient pass reads it.
                return Err(A::Error::custom("`group` is read by the lenient pass"));
            }
            if !WITH_MESSAGE && key == "commandParams" {
                if out.command_params.is_some() {
                    return Err(A::Error::custom("duplicate field `commandParams`"));
                }
                out.command_params = Some(map.next_value::<FastCommandParams>()?.0);
                continue;
            }
            match names.iter().position(|n| *n == key) {
                Some(i) if out.fields[i].is_some() => {
                    return Err(A::Error::custom(format_args!("duplicate field `{key}`")))
                }
                Some(i) => out.fields[i] = Some(map.next_value::<&'de str>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for FastParams<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FieldsVisitor::<true>)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for FastMessage<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(FieldsVisitor::<false>)
            .map(|p| FastMessage(p.fields, p.command_params))
    }
}

fn s(v: Option<&str>) -> LooseStr<'_> {
    v.map_or(LooseStr::Absent, |s| LooseStr::Str(Cow::Borrowed(s)))
}

fn message(m: Option<FastMessage<'_>>) -> LooseObj<RawMessage<'_>> {
    match m {
        None => LooseObj::Absent,
        Some(FastMessage(m, cp)) => {
            let [command, task_id, session_id, sender_id, sender_role] = m.map(s);
            LooseObj::Obj(RawMessage {
                command,
                task_id,
                session_id,
                sender_id,
                sender_role,
                command_params: match cp {
                    None => LooseObj::Absent,
                    Some(seq) => LooseObj::Obj(RawCommandParams {
                        last_event_seq: seq.map_or(LooseSeq::Absent, LooseSeq::Num),
                    }),
                },
            })
        }
    }
}

impl<'a> From<FastEnvelope<'a>> for RawEnvelope<'a> {
    fn from(f: FastEnvelope<'a>) -> Self {
        let [task_id, url, token, id, notification_config_id] = f.params.fields.map(s);
        RawEnvelope {
            jsonrpc: LooseStr::Str(Cow::Borrowed(f.jsonrpc)),
            method: LooseStr::Str(Cow::Borrowed(f.method)),
            id: f.id,
            params: LooseObj::Obj({
                let (message, carrier) =
                    RawParams::one_slot(message(f.params.message), message(f.params.command));
                RawParams {
                    message,
                    carrier,
                    group: LooseObj::Absent,
                    task_id,
                    url,
                    token,
                    id,
                    notification_config_id,
                }
            }),
        }
    }
}
