//! Identifiers and timestamps shared by every stage.
//!
//! Ids are `<prefix>_<uuidv7 as 32 hex digits>`: opaque to clients, but ordered by creation
//! time (UUIDv7, RFC 9562 §5.7), which lets lists paginate on the id alone. Timestamps are
//! RFC 3339 UTC strings with millisecond precision and a fixed width, so their text order is
//! their time order in both SQLite and Postgres.

use chrono::{DateTime, SecondsFormat, Utc};

/// A new id such as `run_01936c0e8f9a7c3b8e4d2a1f0b9c8d7e`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// The current time as stored: `2026-11-29T23:23:25.123Z`.
pub fn now() -> String {
    format_time(Utc::now())
}

/// Formats a time the way the store keeps it (RFC 3339, UTC, milliseconds, `Z`).
pub fn format_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Longest offset [`now_plus_ms`] and [`now_minus_ms`] apply: 100 years, so that an absurd
/// remote value (a `Retry-After` of 10^14 s) can neither overflow nor leave the stored
/// fixed-width format.
pub const MAX_OFFSET_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// The current time plus `ms` milliseconds (at most [`MAX_OFFSET_MS`]), formatted as stored.
pub fn now_plus_ms(ms: u64) -> String {
    format_time(Utc::now() + offset(ms))
}

/// The current time minus `ms` milliseconds (at most [`MAX_OFFSET_MS`]), formatted as stored.
pub fn now_minus_ms(ms: u64) -> String {
    format_time(Utc::now() - offset(ms))
}

fn offset(ms: u64) -> chrono::Duration {
    chrono::Duration::milliseconds(i64::try_from(ms.min(MAX_OFFSET_MS)).unwrap_or(0))
}

/// True when `id` looks like one of ours with the given prefix (used to answer 404 early
/// for malformed ids without touching the store).
pub fn is_well_formed(id: &str, prefix: &str) -> bool {
    id.len() == prefix.len() + 33
        && id.starts_with(prefix)
        && id.as_bytes().get(prefix.len()) == Some(&b'_')
        && id[prefix.len() + 1..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The prefix of every tool id projected from an External MCP server's tool.
pub const MCP_ID_PREFIX: &str = "mcp:";

/// The projected id of tool `tool` of MCP server `server_id`: `mcp:<serverId>:tool:<toolName>`.
pub fn mcp_projection_id(server_id: &str, tool: &str) -> String {
    format!("{MCP_ID_PREFIX}{server_id}:tool:{tool}")
}

/// Splits a projected MCP tool id into (server id, tool name); `None` for any other id.
pub fn parse_mcp_projection_id(id: &str) -> Option<(&str, &str)> {
    let rest = id.strip_prefix(MCP_ID_PREFIX)?;
    let (server, tool) = rest.split_once(":tool:")?;
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_capped_and_keep_the_stored_width() {
        // A hostile `Retry-After: 99999999999999` must neither panic nor leave the format.
        for t in [now_plus_ms(u64::MAX), now_minus_ms(u64::MAX), now_plus_ms(99_999_999_999_999_000)] {
            assert_eq!(t.len(), now().len(), "{t}");
        }
        assert!(now_plus_ms(u64::MAX) > now());
    }

    #[test]
    fn ids_are_ordered_and_well_formed() {
        let a = new_id("run");
        let b = new_id("run");
        assert!(a < b, "{a} !< {b}");
        assert!(is_well_formed(&a, "run"));
        assert!(!is_well_formed(&a, "inv"));
        assert!(!is_well_formed("run_xyz", "run"));
    }

    #[test]
    fn times_sort_as_text() {
        let t = now();
        assert_eq!(t.len(), 24, "{t}");
        assert!(t.ends_with('Z'));
        assert!(now_plus_ms(1000) > t);
    }
}
