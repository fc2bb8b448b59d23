//! Evidence: every tool result becomes citable, hashed facts with their provenance.
//!
//! Tools describe what they found as [`EvidenceDraft`]s; the harness stores them in the
//! same transaction that records the result (the server's `Store::finish_invocation`).
//! Evidence states facts about bytes (this file had these lines, with this hash); whether
//! they satisfy the user's goal is the Planner's judgement, recorded as acceptance.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Evidence produced by a tool, before it is stored.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct EvidenceDraft {
    /// What kind of fact: `file_excerpt`, `grep_match`, `directory_listing`, `file_write`…
    pub kind: String,
    /// Where it came from: path, line range, content hash, tool-specific fields.
    pub provenance: serde_json::Value,
    /// Lowercase hex SHA-256 of the content the evidence speaks for.
    pub content_sha256: String,
    /// A bounded excerpt of that content (at most [`EXCERPT_MAX_BYTES`]).
    pub excerpt: String,
}

/// Largest excerpt stored with a piece of evidence, in bytes of UTF-8.
pub const EXCERPT_MAX_BYTES: usize = 4096;

impl EvidenceDraft {
    /// Evidence whose hash covers `content` and whose excerpt is `content` cut to
    /// [`EXCERPT_MAX_BYTES`] on a character boundary.
    pub fn of_text(kind: &str, provenance: serde_json::Value, content: &str) -> Self {
        Self {
            kind: kind.to_owned(),
            provenance,
            content_sha256: sha256_hex(content.as_bytes()),
            excerpt: excerpt(content, EXCERPT_MAX_BYTES),
        }
    }
}

/// Lowercase hex SHA-256 (FIPS 180-4) of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `text` cut to at most `max` bytes on a character boundary, with `…` when cut.
pub fn excerpt(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_respects_char_boundaries() {
        let s = "é".repeat(10);
        let e = excerpt(&s, 7);
        assert!(e.len() <= 7, "{e}");
        assert!(e.ends_with('…'));
        assert_eq!(excerpt("short", 10), "short");
    }

    #[test]
    fn sha256_of_empty_is_the_standard_value() {
        assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
