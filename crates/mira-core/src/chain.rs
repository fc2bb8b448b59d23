//! The hash chain of a run's events and the hashes that bind the run's records to it
//! (docs/verify.md, Hashing rules): what the store writes and what `mira verify` recomputes,
//! so both sides hash the very same bytes.
//!
//! - **Content hash** of an event: lowercase hex SHA-256 of the RFC 8785 form of
//!   `{"created_at", "data", "run_id", "type"}` ([`event_content_hash`]).
//! - **Link**: `hash = SHA-256("mira-event-v1\n" || prev_hash || "\n" || seq || "\n" ||
//!   content_hash)` over ASCII text ([`event_link`]); `prev_hash` is the previous event's
//!   `hash`, [`GENESIS`] for the first chained event of a run. Postgres computes the same link
//!   in SQL (`mira_event_chain`, migration 0026) for the events of a group commit.
//! - **Record hashes** carried in event data: `exposure_sha256` (exposure.created),
//!   `result_sha256` (execution.completed / execution.failed), `evidence_sha256`
//!   (evidence.recorded): SHA-256 of the RFC 8785 form of the record ([`json_sha256`],
//!   [`evidence_sha256`]). A frozen input is bound by its `input_hash`
//!   ([`crate::canonical::input_hash`]), an approval decision by the decision event's fields.

use serde_json::{Value, json};

use crate::canonical::to_canonical_string;
use crate::evidence::sha256_hex;

/// The `prev_hash` of the first chained event of a run: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Domain prefix of an event link ([`event_link`]).
pub const LINK_DOMAIN: &str = "mira-event-v1\n";

/// Domain prefix of a bundle signature: Ed25519 over these bytes followed by the RFC 8785
/// form of the bundle without its `signature` member.
pub const BUNDLE_DOMAIN: &[u8] = b"mira-run-bundle-v1\n";

/// The `format` member of a run bundle.
pub const BUNDLE_FORMAT: &str = "mira-run-bundle-v1";

/// Lowercase hex SHA-256 of the RFC 8785 form of `value`.
pub fn json_sha256(value: &Value) -> String {
    sha256_hex(to_canonical_string(value).as_bytes())
}

/// The content hash of event `kind` of run `run_id` stored at `created_at` with `data`.
pub fn event_content_hash(run_id: &str, kind: &str, created_at: &str, data: &Value) -> String {
    // The JCS form of {"created_at", "data", "run_id", "type"} (members already in order),
    // written around the data's own JCS form instead of copying the data into a new object.
    let text = |s: &str| to_canonical_string(&Value::String(s.to_owned()));
    let canonical = format!(
        "{{\"created_at\":{},\"data\":{},\"run_id\":{},\"type\":{}}}",
        text(created_at),
        to_canonical_string(data),
        text(run_id),
        text(kind)
    );
    sha256_hex(canonical.as_bytes())
}

/// The hash of event `seq` whose content hash is `content_hash`, after the event whose hash
/// is `prev` ([`GENESIS`] for the first).
pub fn event_link(prev: &str, seq: i64, content_hash: &str) -> String {
    sha256_hex(format!("{LINK_DOMAIN}{prev}\n{seq}\n{content_hash}").as_bytes())
}

/// The hash of a piece of evidence as recorded: its kind, provenance, content hash and excerpt.
pub fn evidence_sha256(kind: &str, provenance: &Value, content_sha256: &str, excerpt: &str) -> String {
    json_sha256(&json!({"kind": kind, "provenance": provenance, "content_sha256": content_sha256, "excerpt": excerpt}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_hashes_the_documented_bytes() {
        // sha256("mira-event-v1\n" + 64 zeros + "\n1\nabc")
        let text = format!("mira-event-v1\n{GENESIS}\n1\nabc");
        assert_eq!(event_link(GENESIS, 1, "abc"), sha256_hex(text.as_bytes()));
        assert_ne!(event_link(GENESIS, 2, "abc"), event_link(GENESIS, 1, "abc"));
    }

    #[test]
    fn content_hash_ignores_key_order_but_not_values() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":2}"#).unwrap_or_default();
        let b: Value = serde_json::from_str(r#"{"a":2,"b":1}"#).unwrap_or_default();
        let t = "2026-01-01T00:00:00.000Z";
        assert_eq!(event_content_hash("run_1", "x", t, &a), event_content_hash("run_1", "x", t, &b));
        assert_ne!(event_content_hash("run_1", "x", t, &a), event_content_hash("run_2", "x", t, &a));
        let canonical = r#"{"created_at":"2026-01-01T00:00:00.000Z","data":{"a":2,"b":1},"run_id":"run_1","type":"x"}"#;
        assert_eq!(event_content_hash("run_1", "x", t, &a), sha256_hex(canonical.as_bytes()));
        let odd = json!({"k": "é\u{1}\"\\"});
        let via_object = json_sha256(&json!({"run_id": "r\"1", "type": "x", "created_at": t, "data": odd}));
        assert_eq!(event_content_hash("r\"1", "x", t, &odd), via_object);
    }
}
