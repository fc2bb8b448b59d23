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
    #[allow(clippy::excessive_precision)]
    fn canonical_form_matches_rfc8785_example_shapes() {
        let v = json!({"numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001], "b": "\u{20ac}$\u{000F}\nA'B\"\\\\\"/"});
        assert_eq!(
            to_canonical_string(&v),
            r#"{"b":"€$\u000f\nA'B\"\\\\\"/","numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}"#
        );
    }
}
