//! Typed tool inputs: each core tool reads its input as one `Deserialize` type, and publishes
//! the JSON Schema generated from that same type ([`schema_of`]), so the parser and the schema
//! the Planner sees cannot drift apart.
//!
//! The registry validates a call against the schema first (`input_invalid`, 422, naming the
//! field), so [`parse`] of a schema-valid input does not fail; it is still checked, and a
//! failure is the tool's `invalid_input` (400). A frozen canonical input is read back with
//! [`frozen`]: one that no longer parses is `corrupt_input`, as the harness says of unreadable
//! stored input.

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use mira_core::error_code::ErrorCode;
use mira_core::tool::ToolError;

/// The JSON Schema of input type `T` as a tool publishes it: JSON Schema 2020-12 without
/// `$schema` (the registry infers the dialect, as it did for the hand-written schemas), every
/// subschema inline (no `$defs`), an optional property that may be left out but is not
/// `null`, and without the generator's `title`, root `description`, `format` and `default`
/// annotations (the tool's spec carries its title and description; defaults are named in the
/// field descriptions).
pub fn schema_of<T: JsonSchema>() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.inline_subschemas = true;
    settings.meta_schema = None;
    let mut schema = settings.into_generator().into_root_schema_for::<T>().to_value();
    if let Value::Object(root) = &mut schema {
        root.remove("title");
        root.remove("description");
    }
    tidy(&mut schema);
    schema
}

/// Drops the generator's annotations from a schema and its subschemas, and makes optional
/// properties non-nullable.
fn tidy(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    o.remove("format");
    o.remove("default");
    o.remove("title");
    let required: Vec<String> = match o.get("required") {
        Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        _ => Vec::new(),
    };
    if let Some(Value::Object(props)) = o.get_mut("properties") {
        for (name, p) in props.iter_mut() {
            if !required.contains(name) {
                not_null(p);
            }
            tidy(p);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = o.get_mut(key) {
            tidy(sub);
        }
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(branches)) = o.get_mut(key) {
            branches.iter_mut().for_each(tidy);
        }
    }
    string_enum(o);
}

/// A unit enum whose variants have doc comments is generated as a `oneOf` of one `const`
/// (or `enum`) string per variant; it is published as one `"enum"` list, in variant order
/// (the variants' docs are for the code, the field's description is for the model).
fn string_enum(o: &mut Map<String, Value>) {
    let Some(Value::Array(branches)) = o.get("oneOf") else { return };
    let mut values = Vec::new();
    for b in branches {
        let Some(b) = b.as_object() else { return };
        if b.get("type").and_then(Value::as_str) != Some("string")
            || b.keys().any(|k| !matches!(k.as_str(), "type" | "const" | "enum" | "description"))
        {
            return;
        }
        match (b.get("const"), b.get("enum")) {
            (Some(c), None) => values.push(c.clone()),
            (None, Some(Value::Array(e))) => values.extend(e.iter().cloned()),
            _ => return,
        }
    }
    o.remove("oneOf");
    o.insert("type".into(), Value::String("string".into()));
    o.insert("enum".into(), Value::Array(values));
}

/// `Option<T>`'s schema (T or null) becomes T's: a field is optional by being left out.
fn not_null(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    if let Some(Value::Array(types)) = o.get_mut("type") {
        types.retain(|t| t != "null");
        if types.len() == 1 {
            let only = types.remove(0);
            o.insert("type".into(), only);
        }
        if let Some(Value::Array(values)) = o.get_mut("enum") {
            values.retain(|v| !v.is_null());
        }
        return;
    }
    let is_null = |b: &Value| b.get("type").and_then(Value::as_str) == Some("null");
    let Some(Value::Array(branches)) = o.get("anyOf") else { return };
    if branches.len() != 2 || !branches.iter().any(is_null) {
        return;
    }
    let Some(Value::Object(inner)) = branches.iter().find(|b| !is_null(b)).cloned() else { return };
    o.remove("anyOf");
    for (k, v) in inner {
        o.entry(k).or_insert(v);
    }
}

/// Reads a call's input (already valid against [`schema_of`]`::<T>()`) as `T`; a failure is
/// 400 `invalid_input` naming the problem.
pub fn parse<T: DeserializeOwned>(input: &Value) -> Result<T, ToolError> {
    T::deserialize(input).map_err(|e| ToolError::new(ErrorCode::InvalidInput, format!("the input does not parse: {e}")))
}

/// Reads a frozen canonical input as `T`; a failure is `corrupt_input` (the stored input is
/// not what this tool froze).
pub fn frozen<T: DeserializeOwned>(input: &Value) -> Result<T, ToolError> {
    T::deserialize(input)
        .map_err(|e| ToolError::new(ErrorCode::CorruptInput, format!("the frozen input does not parse: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Example {
        /// A name
        #[schemars(length(min = 1, max = 8))]
        name: String,
        /// How many (default 3)
        #[schemars(range(min = 1, max = 9))]
        count: Option<u64>,
        /// A flag
        #[serde(default)]
        flag: bool,
        /// Values, null removes one
        env: Option<std::collections::BTreeMap<String, Option<String>>>,
        /// How fast
        speed: Option<Speed>,
        /// Which side
        side: Option<Side>,
    }

    /// Undocumented variants.
    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Side {
        Left,
        Right,
    }

    /// Documented variants.
    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Speed {
        /// Slowly.
        Slow,
        /// Quickly.
        Fast,
    }

    #[test]
    fn generated_schemas_look_hand_written() {
        assert_eq!(
            schema_of::<Example>(),
            json!({
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1, "maxLength": 8, "description": "A name"},
                    "count": {"type": "integer", "minimum": 1, "maximum": 9, "description": "How many (default 3)"},
                    "flag": {"type": "boolean", "description": "A flag"},
                    "env": {"type": "object", "additionalProperties": {"type": ["string", "null"]},
                        "description": "Values, null removes one"},
                    "speed": {"type": "string", "enum": ["slow", "fast"], "description": "How fast"},
                    "side": {"type": "string", "enum": ["left", "right"], "description": "Which side"}
                },
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn parse_refuses_unknown_fields() {
        let e = parse::<Example>(&json!({"name": "a", "other": 1})).err().map(|e| e.code);
        assert_eq!(e, Some(ErrorCode::InvalidInput));
        assert!(parse::<Example>(&json!({"name": "a", "count": 2})).is_ok());
        assert_eq!(frozen::<Example>(&json!({})).err().map(|e| e.code), Some(ErrorCode::CorruptInput));
    }
}
