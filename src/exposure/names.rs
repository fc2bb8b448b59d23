//! Function names the model can call: every major LLM API accepts `^[A-Za-z0-9_-]{1,64}$`.

use std::collections::HashSet;

use sha2::{Digest, Sha256};

/// The stable function name of a tool id: the id itself when it already fits the pattern,
/// otherwise the id with other characters replaced by `_`, shortened to 55 characters and
/// suffixed with `_` + 8 hex digits of the id's SHA-256, so two long ids never collapse
/// into one name.
pub fn function_name(id: &str) -> String {
    if is_valid(id) {
        return id.to_owned();
    }
    let cleaned: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    let hash = hex::encode(&Sha256::digest(id.as_bytes())[..4]);
    let head: String = cleaned.chars().take(55).collect();
    format!("{head}_{hash}")
}

/// A function name for `id` not yet in `taken` (adds it). Collisions are practically
/// impossible after hashing, but a duplicate still gets a counter rather than a clash.
pub(super) fn unique_function_name(id: &str, taken: &mut HashSet<String>) -> String {
    let base = function_name(id);
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        let suffix = format!("_{n}");
        name = format!("{}{suffix}", &base[..base.len().min(64 - suffix.len())]);
        n += 1;
    }
    name
}

fn is_valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_ids_are_their_own_names() {
        assert_eq!(function_name("read_open"), "read_open");
    }

    #[test]
    fn projected_ids_are_shortened_with_a_hash() {
        let a = function_name(&format!("mcp:srv_{}:tool:search", "a".repeat(40)));
        let b = function_name(&format!("mcp:srv_{}:tool:search", "b".repeat(40)));
        assert!(is_valid(&a) && is_valid(&b), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(a, function_name(&format!("mcp:srv_{}:tool:search", "a".repeat(40))));
        let long1 = format!("mcp:srv:tool:{}x", "q".repeat(80));
        let long2 = format!("mcp:srv:tool:{}y", "q".repeat(80));
        assert_ne!(function_name(&long1), function_name(&long2));
    }
}
