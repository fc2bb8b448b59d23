//! Only text every back-end can store gets past the extractors.
//!
//! PostgreSQL's `text` cannot hold the NUL character (U+0000): a title, a task, a grant field
//! or an id containing one made every Postgres query fail (500) while SQLite stored it. The
//! request extractors of [`super::error`] therefore refuse NUL in every string of a body, a path
//! and a query with 400 `invalid_request`, on both back-ends alike. (Lone surrogates and invalid
//! UTF-8 never reach a handler: the JSON parser and the path/query decoding refuse them.)
//!
//! Bodies are checked while they are deserialised, by [`Guard`], a serde `Deserializer` adapter
//! that sees every string, map key and char of the typed body — so every handler taking
//! [`super::error::Json`] is covered without code of its own. One exception: a field of type
//! [`JsonDocument`] holds an opaque JSON document (a tool's input) that is stored as JSON text,
//! where NUL is written as the escape `\u0000` and so is storable; it is passed through as is.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, VariantAccess, Visitor};
use serde_json::Value;

/// The serde name by which [`Guard`] recognises a [`JsonDocument`].
const DOCUMENT: &str = "$mira::JsonDocument";

/// The message of a refused string.
pub const NUL_MESSAGE: &str = "text must not contain the NUL character (U+0000)";

/// An opaque JSON document in a request body (a tool input), exempt from the NUL check
/// because it is stored as JSON text (see the module docs). Deserialises like a [`Value`].
#[derive(Debug, Clone, PartialEq)]
pub struct JsonDocument(pub Value);

impl<'de> serde::Deserialize<'de> for JsonDocument {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonDocument;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON document")
            }
            fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<JsonDocument, D::Error> {
                Value::deserialize(d).map(JsonDocument)
            }
        }
        d.deserialize_newtype_struct(DOCUMENT, V)
    }
}

use serde::Deserialize as _;

fn check<E: de::Error>(s: &str) -> Result<(), E> {
    if s.contains('\0') { Err(E::custom(NUL_MESSAGE)) } else { Ok(()) }
}

/// A `Deserializer` that refuses NUL in every string it yields (see the module docs).
pub struct Guard<D>(pub D);

macro_rules! forward {
    ($($method:ident),*) => {$(
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
            self.0.$method(GuardVisitor(visitor))
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Guard<D> {
    type Error = D::Error;

    forward!(
        deserialize_any,
        deserialize_bool,
        deserialize_i8,
        deserialize_i16,
        deserialize_i32,
        deserialize_i64,
        deserialize_i128,
        deserialize_u8,
        deserialize_u16,
        deserialize_u32,
        deserialize_u64,
        deserialize_u128,
        deserialize_f32,
        deserialize_f64,
        deserialize_char,
        deserialize_str,
        deserialize_string,
        deserialize_bytes,
        deserialize_byte_buf,
        deserialize_option,
        deserialize_unit,
        deserialize_seq,
        deserialize_map,
        deserialize_identifier,
        deserialize_ignored_any
    );

    fn deserialize_unit_struct<V: Visitor<'de>>(self, name: &'static str, v: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_unit_struct(name, GuardVisitor(v))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, v: V) -> Result<V::Value, Self::Error> {
        if name == DOCUMENT {
            // An opaque document: stored as JSON text, NUL included (escaped).
            return self.0.deserialize_newtype_struct(name, v);
        }
        self.0.deserialize_newtype_struct(name, GuardVisitor(v))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, Self::Error> {
        self.0.deserialize_tuple(len, GuardVisitor(v))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_tuple_struct(name, len, GuardVisitor(v))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_struct(name, fields, GuardVisitor(v))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.deserialize_enum(name, variants, GuardVisitor(v))
    }

    fn is_human_readable(&self) -> bool {
        self.0.is_human_readable()
    }
}

struct GuardVisitor<V>(V);

macro_rules! pass {
    ($($method:ident: $ty:ty),*) => {$(
        fn $method<E: de::Error>(self, v: $ty) -> Result<Self::Value, E> {
            self.0.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for GuardVisitor<V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.expecting(f)
    }

    pass!(
        visit_bool: bool, visit_i8: i8, visit_i16: i16, visit_i32: i32, visit_i64: i64, visit_i128: i128,
        visit_u8: u8, visit_u16: u16, visit_u32: u32, visit_u64: u64, visit_u128: u128,
        visit_f32: f32, visit_f64: f64, visit_bytes: &[u8], visit_byte_buf: Vec<u8>
    );

    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        self.0.visit_borrowed_bytes(v)
    }

    fn visit_char<E: de::Error>(self, v: char) -> Result<Self::Value, E> {
        if v == '\0' {
            return Err(E::custom(NUL_MESSAGE));
        }
        self.0.visit_char(v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        check(v)?;
        self.0.visit_str(v)
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        check(v)?;
        self.0.visit_borrowed_str(v)
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        check(&v)?;
        self.0.visit_string(v)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_some(Guard(d))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_unit()
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.visit_newtype_struct(Guard(d))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(GuardAccess(seq))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(GuardAccess(map))
    }

    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        self.0.visit_enum(GuardAccess(data))
    }
}

struct GuardSeed<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for GuardSeed<S> {
    type Value = S::Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.0.deserialize(Guard(d))
    }
}

struct GuardAccess<A>(A);

impl<'de, A: SeqAccess<'de>> SeqAccess<'de> for GuardAccess<A> {
    type Error = A::Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, A::Error> {
        self.0.next_element_seed(GuardSeed(seed))
    }
    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: MapAccess<'de>> MapAccess<'de> for GuardAccess<A> {
    type Error = A::Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, A::Error> {
        self.0.next_key_seed(GuardSeed(seed))
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.0.next_value_seed(GuardSeed(seed))
    }
    fn size_hint(&self) -> Option<usize> {
        self.0.size_hint()
    }
}

impl<'de, A: EnumAccess<'de>> EnumAccess<'de> for GuardAccess<A> {
    type Error = A::Error;
    type Variant = GuardAccess<A::Variant>;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self::Variant), A::Error> {
        let (value, variant) = self.0.variant_seed(GuardSeed(seed))?;
        Ok((value, GuardAccess(variant)))
    }
}

impl<'de, A: VariantAccess<'de>> VariantAccess<'de> for GuardAccess<A> {
    type Error = A::Error;
    fn unit_variant(self) -> Result<(), A::Error> {
        self.0.unit_variant()
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, A::Error> {
        self.0.newtype_variant_seed(GuardSeed(seed))
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, v: V) -> Result<V::Value, A::Error> {
        self.0.tuple_variant(len, GuardVisitor(v))
    }
    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], v: V) -> Result<V::Value, A::Error> {
        self.0.struct_variant(fields, GuardVisitor(v))
    }
}

/// Why a body could not be read as the operation's type.
#[derive(Debug)]
pub enum BodyError {
    /// Not JSON at all: a syntax error, a truncated document, invalid UTF-8, a lone surrogate.
    Syntax(String),
    /// JSON of the wrong shape (a type, a missing or unknown field, NUL in a string).
    Shape {
        /// Where, e.g. `tags[1]` (`.` for the whole body).
        path: String,
        /// What is wrong there.
        message: String,
    },
}

/// Deserialises `T` from JSON `bytes`, refusing NUL in its strings; a shape error names the
/// field's path (`a.b[2]`).
pub fn from_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let classify = |e: serde_json::Error, path: String| match e.classify() {
        serde_json::error::Category::Data => BodyError::Shape { path, message: e.to_string() },
        _ => BodyError::Syntax(e.to_string()),
    };
    let value = serde_path_to_error::deserialize(Guard(&mut de)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // serde reports a missing field at the object holding it: name the field itself.
        let path = match missing_field(&inner.to_string()) {
            Some(field) if path == "." => field.to_owned(),
            Some(field) => format!("{path}.{field}"),
            None => path,
        };
        classify(inner, path)
    })?;
    // Characters after the document are a syntax error, as with serde_json::from_slice.
    de.end().map_err(|e| classify(e, ".".into()))?;
    Ok(value)
}

/// The field named by serde's "missing field `x`" message.
pub(crate) fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Body {
        title: String,
        tags: Option<Vec<String>>,
        env: Option<std::collections::BTreeMap<String, String>>,
        input: Option<JsonDocument>,
        any: Option<Value>,
    }

    #[test]
    fn nul_is_refused_everywhere_but_in_documents() {
        let ok: Body = from_json(br#"{"title":"a","input":{"data":"x\u0000y"}}"#).expect("document passes");
        assert_eq!(ok.input.expect("input").0["data"], "x\0y");
        for (body, path) in [
            (r#"{"title":"a\u0000"}"#, "title"),
            (r#"{"title":"a","tags":["x","\u0000"]}"#, "tags[1]"),
            (r#"{"title":"a","env":{"K\u0000":"v"}}"#, "env"),
            (r#"{"title":"a","env":{"K":"v\u0000"}}"#, "env.K"),
            (r#"{"title":"a","any":{"k":["\u0000"]}}"#, "any.k[0]"),
        ] {
            match from_json::<Body>(body.as_bytes()) {
                Err(BodyError::Shape { path: at, message }) => {
                    assert!(message.contains(NUL_MESSAGE), "{body}: {message}");
                    assert!(at.starts_with(path), "{body}: {at}");
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        // An escaped backslash followed by u0000 is ordinary text.
        let ok: Body = from_json(br#"{"title":"\\u0000"}"#).expect("literal text");
        assert_eq!(ok.title, "\\u0000");
        assert!(matches!(from_json::<Body>(br#"{"title":"a"} x"#), Err(BodyError::Syntax(_))));
        assert!(matches!(from_json::<Body>(br#"{"title":"\ud800"}"#), Err(BodyError::Syntax(_))));
        assert!(matches!(from_json::<Body>(br#"{"title":"#), Err(BodyError::Syntax(_))));
        assert!(matches!(from_json::<Body>(br#"{"title":1}"#), Err(BodyError::Shape { .. })));
        // A missing field is named, not its parent.
        match from_json::<Body>(br#"{"tags":[]}"#) {
            Err(BodyError::Shape { path, .. }) => assert_eq!(path, "title"),
            other => panic!("{other:?}"),
        }
    }
}
