//! Reading a run's stored event log.

use super::{Store, StoreResult};

/// A stored event.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EventRow {
    /// The run.
    pub run_id: String,
    /// Event id, monotonic per run, starting at 1.
    pub seq: i64,
    /// Event type (`approval.granted`, …).
    #[sqlx(rename = "type")]
    pub kind: String,
    /// JSON payload text.
    pub data: String,
    /// RFC 3339.
    pub created_at: String,
}

impl Store {
    /// Up to `limit` events of `run_id` with id > `after`, in id order.
    pub async fn events_after(&self, run_id: &str, after: i64, limit: i64) -> StoreResult<Vec<EventRow>> {
        Ok(sqlx::query_as("SELECT * FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
            .bind(run_id)
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?)
    }

    /// The newest event id of a run (0 when none).
    pub async fn last_event_seq(&self, run_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT event_seq FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(self.pool())
            .await?
            .unwrap_or(0))
    }
}
