//! Integers a tool can represent.
//!
//! JSON Schema's `"type": "integer"` accepts any number without a fractional part, so
//! `{"start_line": 1e300}` or `{"start_line": 5.0}` pass validation — but the tools read their
//! integers as `u64`/`i64`, which such a number is not (serde_json keeps it as a float), and a
//! tool that silently used its default instead froze a call other than the one asked for.
//! [`normalise`] walks the input beside its schema: an integral float at an integer position
//! becomes the integer it denotes (the same JSON value; RFC 8785 canonical form already writes
//! `5.0` as `5`), and one outside the 64-bit range is an error naming the field (422
//! `input_invalid`). Core tools also declare a `maximum` for every integer field, so the
//! validator names the field and the bound for any value above what the tool accepts.

use serde_json::{Number, Value};

/// Deepest schema nesting followed (`$ref` cycles stop here).
const MAX_DEPTH: usize = 64;

/// Rewrites integral floats at integer positions of `input` as integers and returns one
/// message per integer no 64-bit integer can hold, each starting with its JSON pointer.
pub fn normalise(schema: &Value, input: &mut Value) -> Vec<String> {
    let mut errors = Vec::new();
    walk(schema, schema, input, &mut String::new(), &mut errors, 0, true);
    errors
}

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')) {
        Some(pointer) => root.pointer(pointer).unwrap_or(schema),
        None => schema,
    }
}

fn declares_integer(schema: &Value) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "integer",
        Some(Value::Array(types)) => types.iter().any(|t| t == "integer") && !types.iter().any(|t| t == "number"),
        _ => false,
    }
}

fn walk(
    root: &Value,
    schema: &Value,
    value: &mut Value,
    at: &mut String,
    errors: &mut Vec<String>,
    depth: usize,
    strict: bool,
) {
    if depth > MAX_DEPTH {
        return;
    }
    let schema = resolve(root, schema);
    if declares_integer(schema)
        && let Value::Number(n) = value
        && n.as_i64().is_none()
        && n.as_u64().is_none()
        && let Some(f) = n.as_f64()
        && f.fract() == 0.0
    {
        // f64 values in these ranges are exact integers.
        if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f) {
            *value = Value::Number(Number::from(f as i64));
        } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
            *value = Value::Number(Number::from(f as u64));
        } else if strict {
            errors
                .push(format!("{at}: {f:e} is not an integer this tool can take (at most {} in magnitude)", u64::MAX));
        }
    }
    for key in ["allOf"] {
        if let Some(Value::Array(branches)) = schema.get(key) {
            for b in branches {
                walk(root, b, value, at, errors, depth + 1, strict);
            }
        }
    }
    // A value may match another branch (`anyOf: [integer, number]`): normalise only.
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = schema.get(key) {
            for b in branches {
                walk(root, b, value, at, errors, depth + 1, false);
            }
        }
    }
    match value {
        Value::Object(map) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in map.iter_mut() {
                let sub = props.and_then(|p| p.get(k)).or(additional);
                if let Some(sub) = sub {
                    let len = at.len();
                    at.push('/');
                    at.push_str(&k.replace('~', "~0").replace('/', "~1"));
                    walk(root, sub, v, at, errors, depth + 1, strict);
                    at.truncate(len);
                }
            }
        }
        Value::Array(items) => {
            let prefix = schema.get("prefixItems").and_then(Value::as_array);
            for (i, v) in items.iter_mut().enumerate() {
                let sub = match (prefix.and_then(|p| p.get(i)), schema.get("items")) {
                    (Some(p), _) => Some(p),
                    (None, Some(Value::Array(tuple))) => tuple.get(i),
                    (None, Some(s)) if s.is_object() => Some(s),
                    _ => None,
                };
                if let Some(sub) = sub {
                    let len = at.len();
                    at.push_str(&format!("/{i}"));
                    walk(root, sub, v, at, errors, depth + 1, strict);
                    at.truncate(len);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integral_floats_become_integers_and_huge_ones_are_refused() {
        let schema = json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer"},
                "x": {"type": "number"},
                "list": {"type": "array", "items": {"$ref": "#/$defs/i"}},
                "either": {"anyOf": [{"type": "integer"}, {"type": "number"}]}
            },
            "$defs": {"i": {"type": "integer"}}
        });
        let mut input = json!({"n": 5.0, "x": 1e300, "list": [1.0, 2], "either": 1e300});
        assert!(normalise(&schema, &mut input).is_empty());
        assert_eq!(input, json!({"n": 5, "x": 1e300, "list": [1, 2], "either": 1e300}));
        assert!(input["n"].is_u64() && input["list"][0].is_u64());

        let mut input = json!({"n": 1e300, "list": [3, -1e40]});
        let errors = normalise(&schema, &mut input);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.starts_with("/n: 1e300")), "{errors:?}");
        assert!(errors.iter().any(|e| e.starts_with("/list/1: -1e40")), "{errors:?}");
    }
}
