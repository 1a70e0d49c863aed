//! The envelope's fast path: strict borrowed structs for well-formed requests.
//!
//! Valid requests are the common case, and a strict derive with `&str` fields is the
//! cheapest way serde_json can read them. Anything this pass does not accept (a wrong
//! type, an escaped string, `null` where a string belongs, a duplicate key, bad syntax)
//! falls back to the lenient pass in `envelope`, which decides the exact error and still
//! recovers the id. Both passes produce the same `RawEnvelope`, so `Parsed::validate`
//! applies one set of rules whichever pass read the body; this pass must therefore never
//! accept what the lenient pass would reject (hence no `Option<&str>` that maps `null`
//! to absent, and objects only, never arrays, for `params` and `message`).

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::lenient::{LooseObj, LooseStr};

#[derive(Deserialize)]
pub(super) struct FastEnvelope<'a> {
    #[serde(borrow)]
    jsonrpc: &'a str,
    #[serde(borrow)]
    method: &'a str,
    #[serde(borrow, default, deserialize_with = "super::envelope::present")]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    params: ObjOnly<FastParams<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FastParams<'a> {
    #[serde(borrow, default, deserialize_with = "object")]
    message: Option<ObjOnly<FastMessage<'a>>>,
    #[serde(borrow, default, deserialize_with = "string")]
    task_id: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    url: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    token: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    id: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    notification_config_id: Option<&'a str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FastMessage<'a> {
    #[serde(borrow, default, deserialize_with = "string")]
    command: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    task_id: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    session_id: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    sender_id: Option<&'a str>,
    #[serde(borrow, default, deserialize_with = "string")]
    sender_role: Option<&'a str>,
}

/// A present key must hold a string (`null` is not absent).
fn string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de str>, D::Error> {
    <&str>::deserialize(d).map(Some)
}

/// A present key must hold an object (`null` is not absent).
fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<ObjOnly<T>>, D::Error> {
    ObjOnly::deserialize(d).map(Some)
}

/// A JSON object read as `T`; serde's derive alone would also accept an array.
struct ObjOnly<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjOnly<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = ObjOnly<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(ObjOnly)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

fn s(v: Option<&str>) -> LooseStr<'_> {
    v.map_or(LooseStr::Absent, |s| LooseStr::Str(Cow::Borrowed(s)))
}

impl<'a> From<FastEnvelope<'a>> for super::envelope::RawEnvelope<'a> {
    fn from(f: FastEnvelope<'a>) -> Self {
        let p = f.params.0;
        super::envelope::RawEnvelope {
            jsonrpc: LooseStr::Str(Cow::Borrowed(f.jsonrpc)),
            method: LooseStr::Str(Cow::Borrowed(f.method)),
            id: f.id,
            params: LooseObj::Obj(super::envelope::RawParams {
                message: match p.message {
                    None => LooseObj::Absent,
                    Some(ObjOnly(m)) => LooseObj::Obj(super::envelope::RawMessage {
                        command: s(m.command),
                        task_id: s(m.task_id),
                        session_id: s(m.session_id),
                        sender_id: s(m.sender_id),
                        sender_role: s(m.sender_role),
                    }),
                },
                task_id: s(p.task_id),
                url: s(p.url),
                token: s(p.token),
                id: s(p.id),
                notification_config_id: s(p.notification_config_id),
            }),
        }
    }
}
