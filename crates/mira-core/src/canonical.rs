//! Canonical JSON (RFC 8785, JSON Canonicalization Scheme) and the input hash.
//!
//! `input_hash` = lowercase hex SHA-256 of the JCS form of `{"input": …, "tool_id": …}`
//! (`docs/api.md`, Invocations). JCS sorts object keys by UTF-16 code units and
//! serialises numbers the ECMAScript way, so equal JSON values hash equally whatever their
//! key order or number spelling.

use serde_json::{Value, json};

use crate::evidence::sha256_hex;

/// The RFC 8785 canonical text of `value`.
pub fn to_canonical_string(value: &Value) -> String {
    // serde_jcs only fails for values serde_json itself cannot represent (never for a Value).
    serde_jcs::to_string(value).unwrap_or_else(|_| value.to_string())
}

/// The largest integer magnitude RFC 8785 represents exactly (2^53): JCS writes every number
/// as an IEEE 754 double, so larger integers of one rounding step share one canonical form.
pub const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// The JSON pointer and value of the first integer in `value` whose magnitude is above
/// [`MAX_EXACT_INTEGER`] — a number whose canonical form (and so every hash over it) would
/// equal that of a neighbouring integer — or None when every number is exact.
pub fn inexact_integer(value: &Value) -> Option<(String, String)> {
    fn walk(v: &Value, path: &mut String) -> Option<(String, String)> {
        match v {
            Value::Number(n) => {
                let exact = n
                    .as_u64()
                    .map(|u| u <= MAX_EXACT_INTEGER)
                    .or_else(|| n.as_i64().map(|i| i.unsigned_abs() <= MAX_EXACT_INTEGER));
                (exact == Some(false)).then(|| (path.clone(), n.to_string()))
            }
            Value::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
                let len = path.len();
                path.push_str(&format!("/{i}"));
                let found = walk(item, path);
                path.truncate(len);
                found
            }),
            Value::Object(map) => map.iter().find_map(|(k, item)| {
                let len = path.len();
                path.push('/');
                path.push_str(&k.replace('~', "~0").replace('/', "~1"));
                let found = walk(item, path);
                path.truncate(len);
                found
            }),
            _ => None,
        }
    }
    walk(value, &mut String::new())
}

/// The input hash of a call to `tool_id` with canonical `input`.
pub fn input_hash(tool_id: &str, input: &Value) -> String {
    sha256_hex(to_canonical_string(&json!({"tool_id": tool_id, "input": input})).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_and_number_spelling_do_not_change_the_hash() {
        let a: Value = serde_json::from_str(r#"{"b": 1.0, "a": [1, {"y": 2, "x": 1}]}"#).unwrap_or_default();
        let b: Value = serde_json::from_str(r#"{"a": [1, {"x": 1, "y": 2}], "b": 1}"#).unwrap_or_default();
        assert_eq!(input_hash("t", &a), input_hash("t", &b));
        assert_ne!(input_hash("t", &a), input_hash("u", &a));
    }

    #[test]
    fn integers_beyond_two_to_the_53_are_named() {
        assert_eq!(inexact_integer(&json!({"a": [1, 9007199254740992u64]})), None);
        assert_eq!(
            inexact_integer(&json!({"a": [1, {"b/c": 9007199254740993u64}]})),
            Some(("/a/1/b~1c".to_owned(), "9007199254740993".to_owned()))
        );
        assert!(inexact_integer(&json!({"n": -9007199254740993i64})).is_some());
        // The reason: both spell one canonical number.
        assert_eq!(to_canonical_string(&json!(9007199254740993u64)), to_canonical_string(&json!(9007199254740992u64)));
    }

    #[test]
    #[allow(clippy::excessive_precision)]
    fn canonical_form_matches_rfc8785_example_shapes() {
        let v = json!({"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001], "b": "\u{20ac}$\u{000F}\nA'B\"\\\\\"/"});
        assert_eq!(
            to_canonical_string(&v),
            r#"{"b":"€$\u000f\nA'B\"\\\\\"/","numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}"#
        );
    }
}
