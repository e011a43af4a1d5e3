//! envoyproxy/ratelimit's response dynamic metadata (`rls.response_dynamic_metadata`, its
//! `RESPONSE_DYNAMIC_METADATA`): the call's domain, descriptors and hits, and the `metadata` of
//! the descriptors that passed, merged, as the `google.protobuf.Struct` Envoy stores.

use std::collections::HashMap;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

use crate::exchange::rls::Status;

/// The answer's `dynamic_metadata` for `request`, whose descriptors got `statuses`.
pub fn of(request: &RateLimitRequest, statuses: &[Status<'_>]) -> Struct {
    let mut fields = HashMap::new();
    fields.insert("domain".to_string(), text(&request.domain));
    let descriptors = request.descriptors.iter().map(descriptor).collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if request.hits_addend != 0 {
        fields.insert("hitsAddend".to_string(), number(request.hits_addend));
    }
    let mut passed = Struct::default();
    for metadata in statuses
        .iter()
        .filter(|s| !s.over)
        .filter_map(|s| s.metadata)
    {
        if let Kind::StructValue(metadata) = json(metadata) {
            merge(&mut passed, metadata);
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".to_string(), kind(Kind::StructValue(passed)));
    }
    Struct { fields }
}

/// One descriptor: its entries as `key=value`, and its hits when it says.
fn descriptor(descriptor: &RateLimitDescriptor) -> Value {
    let entries = descriptor
        .entries
        .iter()
        .map(|entry| text(&format!("{}={}", entry.key, entry.value)))
        .collect();
    let mut fields = HashMap::from([("entries".to_string(), list(entries))]);
    if let Some(hits) = &descriptor.hits_addend {
        // A JSON number, as envoyproxy/ratelimit sends it (exact below 2^53).
        fields.insert("hitsAddend".to_string(), number(hits.value as f64));
    }
    kind(Kind::StructValue(Struct { fields }))
}

/// Adds `source`'s fields to `into`: a field both have is merged when both are tables, and
/// otherwise keeps the first value (envoyproxy/ratelimit's `mergeMetadata`).
fn merge(into: &mut Struct, source: Struct) {
    for (name, value) in source.fields {
        match (into.fields.get_mut(&name), value.kind) {
            (None, kind_of) => {
                into.fields.insert(name, Value { kind: kind_of });
            }
            (Some(present), Some(Kind::StructValue(source))) => {
                if let Some(Kind::StructValue(present)) = &mut present.kind {
                    merge(present, source);
                }
            }
            (Some(_), _) => {}
        }
    }
}

/// A JSON value (a descriptor's `metadata`, read from YAML) as a protobuf one.
fn json(value: &serde_json::Value) -> Kind {
    match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(|item| kind(json(item))).collect(),
        }),
        serde_json::Value::Object(fields) => Kind::StructValue(Struct {
            fields: fields
                .iter()
                .map(|(name, value)| (name.clone(), kind(json(value))))
                .collect(),
        }),
    }
}

fn kind(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn text(text: &str) -> Value {
    kind(Kind::StringValue(text.to_string()))
}

fn number(n: impl Into<f64>) -> Value {
    kind(Kind::NumberValue(n.into()))
}

fn list(values: Vec<Value>) -> Value {
    kind(Kind::ListValue(ListValue { values }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(json: serde_json::Value) -> Struct {
        match super::json(&json) {
            Kind::StructValue(table) => table,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn metadata_merges_tables_and_keeps_the_first_of_anything_else() {
        let mut merged = table(serde_json::json!({"a": {"x": 1}, "b": "first"}));
        merge(
            &mut merged,
            table(serde_json::json!({"a": {"y": 2}, "b": "second", "c": [true]})),
        );
        let expected = table(serde_json::json!({
            "a": {"x": 1, "y": 2}, "b": "first", "c": [true]
        }));
        assert_eq!(merged, expected);
    }
}
