//! The W3C trace context of the request that made an invocation runnable
//! (`invocation_traces`, see [`crate::telemetry`]). Written and read only while trace export
//! is on.

use super::{Store, StoreResult};

impl Store {
    /// The trace context recorded for `invocation_id`, if any.
    pub async fn invocation_trace(&self, invocation_id: &str) -> StoreResult<Option<String>> {
        Ok(sqlx::query_scalar("SELECT trace_parent FROM invocation_traces WHERE invocation_id = $1")
            .bind(invocation_id)
            .fetch_optional(self.pool())
            .await?)
    }
}
