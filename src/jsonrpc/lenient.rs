//! Lenient borrowed JSON values for the envelope's first pass.
//!
//! The first pass must never fail on a value's *type* (only on syntax and duplicate
//! keys), so that the request `id` is known before any semantic error is reported.
//! Serde's derive would abort at the first wrong type, losing the id when it comes later
//! in the object; these types record what they saw instead. Strings are borrowed from the
//! body whenever they have no escapes.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The JSON type of a value that was not what the envelope wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `null`
    Null,
    /// `true` / `false`
    Bool,
    /// a number
    Number,
    /// a string
    String,
    /// an array
    Array,
    /// an object
    Object,
}

impl Kind {
    /// The JSON type's name, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a boolean",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Array => "an array",
            Kind::Object => "an object",
        }
    }
}

/// A value that should be a string: the string, or the kind of what was there instead.
///
/// `Absent` (the `Default`) stands for a missing key, so fields need no `Option` layer
/// (serde_json's `deserialize_option` would peek for `null` before every value).
#[derive(Debug, Default)]
pub enum LooseStr<'a> {
    /// The key was not there.
    #[default]
    Absent,
    /// A string, borrowed from the input when it has no escapes.
    Str(Cow<'a, str>),
    /// Something else.
    Other(Kind),
}

/// A value that should be an object read as `T`, or the kind of what was there instead.
#[derive(Debug, Default)]
pub enum LooseObj<T> {
    /// The key was not there.
    #[default]
    Absent,
    /// An object.
    Obj(T),
    /// Something else.
    Other(Kind),
}

/// The visitor methods shared by both lenient types: every non-string, non-object value
/// is drained and classified by `$other`.
macro_rules! classify_rest {
    ($other:expr) => {
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok($other(Kind::Bool))
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok($other(Kind::Number))
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok($other(Kind::Number))
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok($other(Kind::Number))
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($other(Kind::Null))
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok($other(Kind::Null))
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok($other(Kind::Array))
        }
    };
}

struct StrVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for StrVisitor<'a> {
    type Value = LooseStr<'a>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(LooseStr::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LooseStr::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(LooseStr::Str(Cow::Owned(v)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LooseStr::Other(Kind::Object))
    }
    classify_rest!(LooseStr::Other);
}

impl<'de: 'a, 'a> Deserialize<'de> for LooseStr<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrVisitor(PhantomData))
    }
}

struct ObjVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjVisitor<T> {
    type Value = LooseObj<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(LooseObj::Other(Kind::String))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        // Hand the open object to T's derived impl: it sees an ordinary map, and its
        // duplicate-field detection still applies.
        T::deserialize(MapAccessDeserializer::new(map)).map(LooseObj::Obj)
    }
    classify_rest!(LooseObj::Other);
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for LooseObj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ObjVisitor(PhantomData))
    }
}

impl LooseStr<'_> {
    /// The string, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            LooseStr::Str(s) => Some(s),
            LooseStr::Absent | LooseStr::Other(_) => None,
        }
    }
}

/// A value that should be a non-negative integer (an `eventSeq`): absent, `null`, the
/// number, or the kind of what was there instead.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum LooseSeq {
    /// The key was not there.
    #[default]
    Absent,
    /// `null`.
    Null,
    /// A non-negative integer.
    Num(u64),
    /// Something else (a negative or fractional number counts as `Number`).
    Other(Kind),
}

struct SeqVisitor;

impl<'de> Visitor<'de> for SeqVisitor {
    type Value = LooseSeq;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(LooseSeq::Num(v))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(LooseSeq::Null)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
        Ok(LooseSeq::Null)
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(LooseSeq::Other(Kind::Bool))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LooseSeq::Other(Kind::Number))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LooseSeq::Other(Kind::Number))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(LooseSeq::Other(Kind::String))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LooseSeq::Other(Kind::Array))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LooseSeq::Other(Kind::Object))
    }
}

impl<'de> Deserialize<'de> for LooseSeq {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SeqVisitor)
    }
}
