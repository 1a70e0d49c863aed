//! The envelope's fast path: a strict borrowed read of well-formed requests.
//!
//! Valid requests are the common case, and a strict borrowed read is the cheapest way
//! serde_json can take them. Anything this pass does not accept (a wrong type, an escaped
//! string, `null` where a string belongs, a duplicate key, both message fields, `group`,
//! bad syntax) falls back to the lenient pass in `envelope`, which decides the exact error
//! and still recovers the id. Both passes produce the same `RawEnvelope`, so
//! `Parsed::validate` applies one set of rules whichever pass read the body; this pass
//! must therefore never accept what the lenient pass would reject (`null` is not absent;
//! `params` and `message` must be objects, never arrays).
//! `envelope::tests::fast_and_lenient_paths_agree` and the fuzz target check it.
//!
//! Hand-written visitors rather than serde's derive, for two reasons measured in
//! `benches/envelope.rs`: each object is reached through `deserialize_map`, which rejects
//! arrays for free (a derive would need a wrapper), and each visitor is a
//! `DeserializeSeed` that writes into its slot of the one `RawEnvelope` being built, so
//! no nested struct is returned by value and moved up through every `Result` (those
//! moves were a sixth of the fast path's time on a 400-byte request).

use std::borrow::Cow;
use std::fmt;

use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::value::RawValue;

use super::{Carrier, RawCommandParams, RawEnvelope, RawMessage, RawParams};
use crate::jsonrpc::lenient::{LooseObj, LooseSeq, LooseStr};

/// Reads `body` (already checked UTF-8, so its strings are not checked again) strictly;
/// `None` sends it to the lenient pass.
pub(super) fn read(body: &str) -> Option<RawEnvelope<'_>> {
    let mut out = RawEnvelope::default();
    let mut de = serde_json::Deserializer::from_str(body);
    Fill(&mut out).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(out)
}

/// Writes the object it reads into the slot it holds.
struct Fill<'s, T>(&'s mut T);

/// One object's keys: `on_key` reads the value of a key it knows and says whether it did;
/// other keys are skipped.
trait Object<'de> {
    fn on_key<A: MapAccess<'de>>(&mut self, key: &'de str, map: &mut A) -> Result<bool, A::Error>;
}

impl<'de, 's, T: Object<'de>> DeserializeSeed<'de> for Fill<'s, T> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, 's, T: Object<'de>> Visitor<'de> for Fill<'s, T> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<&'de str>()? {
            if !self.0.on_key(key, &mut map)? {
                map.next_value::<Skip>()?;
            }
        }
        Ok(())
    }
}

/// An unknown key's value, skipped. serde_json skips a value (`IgnoredAny`) keeping the
/// innermost open bracket in a local and the ones around it in its scratch `Vec`, whose
/// first push allocates: `"dataItems":[{...}]` did, on every request. Here a container's
/// items are skipped one by one, so the outer bracket is this visitor's and an item
/// nested no deeper than `[{...}]` takes no allocation. Accepts what `IgnoredAny` does
/// (a number out of `f64`'s range aside, which goes to the lenient pass).
struct Skip;

impl<'de> serde::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Skip, D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Skip)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value::<IgnoredAny>()?;
        }
        Ok(Skip)
    }
}

fn duplicate<E: serde::de::Error>(key: &str) -> E {
    E::custom(format_args!("duplicate field `{key}`"))
}

/// Reads a borrowed string into an empty slot.
fn string<'de, A: MapAccess<'de>>(
    slot: &mut LooseStr<'de>,
    key: &str,
    map: &mut A,
) -> Result<bool, A::Error> {
    if !matches!(slot, LooseStr::Absent) {
        return Err(duplicate(key));
    }
    *slot = LooseStr::Str(Cow::Borrowed(map.next_value::<&'de str>()?));
    Ok(true)
}

/// Makes an empty object slot an object, and fills it.
fn object<'de, T: Object<'de> + Default, A: MapAccess<'de>>(
    slot: &mut LooseObj<T>,
    key: &str,
    map: &mut A,
) -> Result<bool, A::Error> {
    if !matches!(slot, LooseObj::Absent) {
        return Err(duplicate(key));
    }
    *slot = LooseObj::Obj(T::default());
    let LooseObj::Obj(inner) = slot else {
        unreachable!("set just above")
    };
    map.next_value_seed(Fill(inner))?;
    Ok(true)
}

impl<'de> Object<'de> for RawEnvelope<'de> {
    fn on_key<A: MapAccess<'de>>(&mut self, key: &'de str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "jsonrpc" => string(&mut self.jsonrpc, key, map),
            "method" => string(&mut self.method, key, map),
            "id" => {
                if self.id.is_some() {
                    return Err(duplicate(key));
                }
                // A present `null` is `Some("null")`: only an absent key is `None`.
                self.id = Some(map.next_value::<&'de RawValue>()?);
                Ok(true)
            }
            "params" => object(&mut self.params, key, map),
            _ => Ok(false),
        }
    }
}

impl<'de> Object<'de> for RawParams<'de> {
    fn on_key<A: MapAccess<'de>>(&mut self, key: &'de str, map: &mut A) -> Result<bool, A::Error> {
        let carrier = match key {
            "message" => Carrier::Message,
            "command" => Carrier::Command,
            "taskId" => return string(&mut self.task_id, key, map),
            "url" => return string(&mut self.url, key, map),
            "token" => return string(&mut self.token, key, map),
            "id" => return string(&mut self.id, key, map),
            "notificationConfigId" => return string(&mut self.notification_config_id, key, map),
            // Rare shapes the lenient pass reads: `group`'s nested leader, or a body
            // carrying both message fields (refused, but only after the lenient pass has
            // read both, so that a duplicate key inside either is reported as such).
            "group" => return Err(A::Error::custom("`group` is read by the lenient pass")),
            _ => return Ok(false),
        };
        if self.carrier != Carrier::Neither {
            return Err(duplicate(key));
        }
        self.carrier = carrier;
        object(&mut self.message, key, map)
    }
}

impl<'de> Object<'de> for RawMessage<'de> {
    fn on_key<A: MapAccess<'de>>(&mut self, key: &'de str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "command" => string(&mut self.command, key, map),
            "taskId" => string(&mut self.task_id, key, map),
            "sessionId" => string(&mut self.session_id, key, map),
            "senderId" => string(&mut self.sender_id, key, map),
            "senderRole" => string(&mut self.sender_role, key, map),
            "commandParams" => object(&mut self.command_params, key, map),
            _ => Ok(false),
        }
    }
}

impl<'de> Object<'de> for RawCommandParams {
    fn on_key<A: MapAccess<'de>>(&mut self, key: &'de str, map: &mut A) -> Result<bool, A::Error> {
        if key != "lastEventSeq" {
            return Ok(false);
        }
        if self.last_event_seq != LooseSeq::Absent {
            return Err(duplicate(key));
        }
        self.last_event_seq = map
            .next_value::<Option<u64>>()?
            .map_or(LooseSeq::Null, LooseSeq::Num);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn borrowed<'a>(s: &LooseStr<'a>) -> Option<&'a str> {
        match s {
            LooseStr::Str(Cow::Borrowed(s)) => Some(s),
            _ => None,
        }
    }

    /// Valid requests of both generations are taken here, not by the lenient pass, and
    /// every string is a slice of the body.
    #[test]
    fn valid_requests_take_the_fast_path() {
        for key in ["message", "command"] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","x":[1,{{"y":null}}],"method":"rpc","id":"r1","params":{{"taskId":"p","{key}":{{"type":"t","command":"start","taskId":"t1","sessionId":"s","senderId":"A","senderRole":"leader","commandParams":{{"responseTimeout":3,"lastEventSeq":null}}}}}}}}"#
            );
            let raw = read(&body).expect("fast path");
            assert_eq!(borrowed(&raw.method), Some("rpc"));
            assert_eq!(raw.id.map(RawValue::get), Some(r#""r1""#));
            let LooseObj::Obj(p) = &raw.params else {
                panic!("params")
            };
            let want = if key == "message" {
                Carrier::Message
            } else {
                Carrier::Command
            };
            assert_eq!(p.carrier, want);
            assert_eq!(borrowed(&p.task_id), Some("p"));
            let LooseObj::Obj(m) = &p.message else {
                panic!("message")
            };
            assert_eq!(borrowed(&m.task_id), Some("t1"));
            assert_eq!(borrowed(&m.sender_role), Some("leader"));
            let start = body.as_ptr() as usize;
            let at = borrowed(&m.sender_id).unwrap().as_ptr() as usize;
            assert!(at > start && at < start + body.len());
            assert!(matches!(
                &m.command_params,
                LooseObj::Obj(RawCommandParams {
                    last_event_seq: LooseSeq::Null
                })
            ));
        }
    }

    /// What the lenient pass must decide: duplicates, both carriers, `group`, escapes,
    /// wrong types, arrays where objects belong.
    #[test]
    fn everything_else_goes_to_the_lenient_pass() {
        for body in [
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"id":2,"params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{},"command":{}}}"#,
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"command":{},"command":{}}}"#,
            r#"{"jsonrpc":"2.0","method":"group","id":1,"params":{"group":{}}}"#,
            r#"{"jsonrpc":"2.0","method":"r\u0070c","id":1,"params":{}}"#,
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":{"senderId":null}}}"#,
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{"message":[]}}"#,
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":[]}"#,
            r#"{"jsonrpc":"2.0","method":"stream","id":1,"params":{"message":{"commandParams":{"lastEventSeq":1,"lastEventSeq":2}}}}"#,
            r#"{"jsonrpc":"2.0","method":"rpc","id":1,"params":{}} x"#,
        ] {
            assert!(read(body).is_none(), "{body}");
        }
    }
}
