//! Counts read at `/metrics` scrape time (cluster-wide: every replica shares the store).

use super::{Store, StoreResult};

impl Store {
    /// Invocations by status among `queued`, `running` and `awaiting_approval` (the harness
    /// queue), as (status, count) pairs; absent statuses have none. Uses the partial
    /// `invocations_status` index, whose predicate the condition repeats word for word
    /// (SQLite uses a partial index only for a condition it finds among the index's terms).
    pub async fn harness_queue_counts(&self) -> StoreResult<Vec<(String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT status, COUNT(*) FROM invocations WHERE status = 'awaiting_approval' OR status = 'queued' OR status = 'running'
             GROUP BY status",
        )
        .fetch_all(self.pool())
        .await?)
    }

    /// External MCP servers by connection state, as (state, count) pairs.
    pub async fn mcp_state_counts(&self) -> StoreResult<Vec<(String, i64)>> {
        Ok(sqlx::query_as("SELECT state, COUNT(*) FROM mcp_connections GROUP BY state").fetch_all(self.pool()).await?)
    }
}
