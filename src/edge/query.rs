//! An admin call's parameters — a URL query, or the dashboard's form body — read into a typed
//! struct in one place. The `application/x-www-form-urlencoded` pairs (`+` a space, `%XX` its
//! byte, a malformed escape kept as written) are grouped by name and handed to the struct's
//! derived `serde::Deserialize`, with this module's error: so each refusal is a value chosen
//! where serde finds its cause, never read back from a message. A parameter the struct lacks
//! (`#[serde(deny_unknown_fields)]`), one given twice for a field that holds one value (a
//! `Vec` field takes each), text that is not UTF-8 for a text field: each is its own variant.
//! A field that takes bytes (`serde_bytes::ByteBuf`, a credit's id) receives them as sent.
//!
//! `serde_urlencoded` does the same with a fixed error type, whose causes differ only by their
//! text, and decodes bytes lossily (two ids, `%FF` and `%FE`, would both read U+FFFD).

use std::fmt::Display;

use percent_encoding::percent_decode;
use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{DeserializeOwned, Deserializer, IntoDeserializer, Visitor};
use smallvec::SmallVec;

/// Why the parameters sent are not a call of the struct they are read into.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueryError {
    /// `takes`: the struct's fields, as serde lists them.
    #[error("unknown parameter {name:?}")]
    Unknown {
        name: String,
        takes: &'static [&'static str],
    },
    #[error("{0} is given more than once")]
    Repeated(String),
    #[error("{0}: not UTF-8 text")]
    NotText(String),
    /// Anything else serde found (a field of a type no parameter can be).
    #[error("{0}")]
    Other(String),
}

impl serde::de::Error for QueryError {
    fn custom<T: Display>(message: T) -> Self {
        QueryError::Other(message.to_string())
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        QueryError::Unknown {
            name: field.to_string(),
            takes: expected,
        }
    }
}

/// The parameters `sent` (a query without its `?`, or a form body) as a `T`.
pub fn read<T: DeserializeOwned>(sent: &[u8]) -> Result<T, QueryError> {
    T::deserialize(MapDeserializer::new(grouped(sent).into_iter()))
}

/// `sent`'s pairs, decoded, each name once (in the order first sent) with its values.
fn grouped(sent: &[u8]) -> Vec<(String, Values)> {
    let mut grouped: Vec<(String, Values)> = Vec::new();
    let pairs = sent.split(|&b| b == b'&').filter(|pair| !pair.is_empty());
    for pair in pairs {
        let mut halves = pair.splitn(2, |&b| b == b'=');
        let name = decoded(halves.next().unwrap_or_default());
        let name = String::from_utf8_lossy(&name).into_owned();
        let value = decoded(halves.next().unwrap_or_default());
        match grouped.iter_mut().find(|(known, _)| *known == name) {
            Some((_, values)) => values.sent.push(value),
            None => {
                let values = Values {
                    name: name.clone(),
                    sent: SmallVec::from_elem(value, 1),
                };
                grouped.push((name, values));
            }
        }
    }
    grouped
}

/// `text` percent-decoded, `+` a space; a malformed escape is kept as written.
fn decoded(text: &[u8]) -> Vec<u8> {
    let spaced: Vec<u8> = text
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    percent_decode(&spaced).collect()
}

/// The values sent for one parameter, read as the field it fills asks.
struct Values {
    name: String,
    sent: SmallVec<[Vec<u8>; 1]>,
}

impl Values {
    /// Its one value: `Err` when it was given more than once.
    fn one(mut self) -> Result<Vec<u8>, QueryError> {
        match (self.sent.pop(), self.sent.is_empty()) {
            (Some(value), true) => Ok(value),
            _ => Err(QueryError::Repeated(self.name)),
        }
    }

    fn text(name: &str, value: Vec<u8>) -> Result<String, QueryError> {
        String::from_utf8(value).map_err(|_| QueryError::NotText(name.to_string()))
    }
}

impl<'de> IntoDeserializer<'de, QueryError> for Values {
    type Deserializer = Self;

    fn into_deserializer(self) -> Self {
        self
    }
}

impl<'de> Deserializer<'de> for Values {
    type Error = QueryError;

    /// One value, as text.
    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        let name = self.name.clone();
        visitor.visit_string(Values::text(&name, self.one()?)?)
    }

    /// A parameter sent is a value given: an `Option` field holds it.
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_some(self)
    }

    /// A `Vec` field: every value sent, each text.
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        let name = self.name;
        let texts = self
            .sent
            .into_iter()
            .map(|value| Values::text(&name, value));
        let texts = texts.collect::<Result<Vec<String>, QueryError>>()?;
        SeqDeserializer::new(texts.into_iter()).deserialize_any(visitor)
    }

    /// A bytes field: one value, as sent.
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        visitor.visit_byte_buf(self.one()?)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, QueryError> {
        self.deserialize_byte_buf(visitor)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        unit unit_struct newtype_struct tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Call {
        route: Option<String>,
        plan: Option<String>,
        #[serde(default)]
        header: Vec<String>,
        id: Option<serde_bytes::ByteBuf>,
    }

    fn call(sent: &str) -> Result<Call, QueryError> {
        read(sent.as_bytes())
    }

    #[test]
    fn pairs_are_decoded_into_their_fields() {
        let read = call("route=a+b&header=X-A%3A+1&id=%FF&header=X-B:2&plan=").expect("a call");
        assert_eq!(read.route.as_deref(), Some("a b"));
        assert_eq!(read.plan.as_deref(), Some(""), "sent empty is given");
        assert_eq!(read.header, ["X-A: 1", "X-B:2"]);
        assert_eq!(read.id.as_deref().map(|id| &id[..]), Some(&b"\xff"[..]));
        let none = call("").expect("a call of nothing");
        assert_eq!((none.route, none.id, none.header.len()), (None, None, 0));
        let kept = call("route=100%&&route2").err();
        assert!(matches!(kept, Some(QueryError::Unknown { .. })), "{kept:?}");
        assert_eq!(
            call("route=100%").expect("a call").route.as_deref(),
            Some("100%"),
            "a malformed escape is kept as written"
        );
    }

    #[test]
    fn each_refusal_is_its_own_variant() {
        assert_eq!(
            call("nope=1"),
            Err(QueryError::Unknown {
                name: "nope".into(),
                takes: &["route", "plan", "header", "id"],
            })
        );
        assert_eq!(
            call("route=a&route=b"),
            Err(QueryError::Repeated("route".into()))
        );
        assert_eq!(call("id=a&id=b"), Err(QueryError::Repeated("id".into())));
        assert_eq!(call("plan=%FF"), Err(QueryError::NotText("plan".into())));
        assert_eq!(
            call("header=%FE"),
            Err(QueryError::NotText("header".into()))
        );
    }
}
