//! The replica registry: one row per server sharing this database (see [`crate::cluster`]).

use serde::Serialize;

use super::{Store, StoreResult};
use crate::ids;
use crate::state::ReplicaState;

/// Why the running terminal sessions of a replica declared dead ended.
pub const DEAD_REPLICA_REASON: &str = "its replica stopped sending heartbeats and was declared dead";

/// A stored replica.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct ReplicaRow {
    /// The stable node id of its data directory (`node-…`), which owns its terminal sessions.
    pub node_id: String,
    /// The id of its current process (`<node id>:<uuid>`), which claims invocations.
    pub process_id: String,
    /// Base URL other replicas reach it at for forwarded requests (`http://host:port`).
    pub address: String,
    /// `alive`, or `dead` once another replica declared it so.
    pub state: ReplicaState,
    /// RFC 3339: when its current process registered.
    pub started_at: String,
    /// RFC 3339: its last heartbeat.
    pub heartbeat_at: String,
}

impl Store {
    /// Records this process as replica `node_id` (alive, heartbeat now), replacing what an
    /// earlier process of the same data directory left.
    pub async fn register_replica(&self, node_id: &str, process_id: &str, address: &str) -> StoreResult<()> {
        let now = ids::now();
        sqlx::query(
            "INSERT INTO replicas (node_id, process_id, address, state, started_at, heartbeat_at)
             VALUES ($1, $2, $3, 'alive', $4, $4)
             ON CONFLICT (node_id) DO UPDATE SET process_id = excluded.process_id, address = excluded.address,
                state = 'alive', started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at",
        )
        .bind(node_id)
        .bind(process_id)
        .bind(address)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Renews this process's heartbeat. False when its row is no longer its own alive row
    /// (another replica declared it dead, or another process took the data directory).
    pub async fn replica_heartbeat(&self, node_id: &str, process_id: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE replicas SET heartbeat_at = $1 WHERE node_id = $2 AND process_id = $3 AND state = 'alive'",
        )
        .bind(ids::now())
        .bind(node_id)
        .bind(process_id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records that this process stopped cleanly (state `dead`; what it held it ended itself).
    pub async fn leave_replica(&self, node_id: &str, process_id: &str) -> StoreResult<()> {
        sqlx::query("UPDATE replicas SET state = 'dead' WHERE node_id = $1 AND process_id = $2")
            .bind(node_id)
            .bind(process_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Every known replica, by node id.
    pub async fn list_replicas(&self) -> StoreResult<Vec<ReplicaRow>> {
        Ok(sqlx::query_as("SELECT * FROM replicas ORDER BY node_id").fetch_all(self.pool()).await?)
    }

    /// One replica.
    pub async fn replica(&self, node_id: &str) -> StoreResult<Option<ReplicaRow>> {
        Ok(sqlx::query_as("SELECT * FROM replicas WHERE node_id = $1")
            .bind(node_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Declares dead every alive replica whose heartbeat is older than `stale_before`
    /// (RFC 3339), other than `self_node`: one conditional UPDATE per replica decides, so of
    /// several replicas sweeping at once exactly one declares it. For each it declared, its
    /// running terminal sessions become `lost`, the stdio MCP servers it held become `lost`
    /// (moved only by an explicit connect) and the invocations its process still held are
    /// interrupted (never re-run). Returns the node ids it declared dead.
    pub async fn declare_dead_replicas(&self, self_node: &str, stale_before: &str) -> StoreResult<Vec<String>> {
        let stale: Vec<ReplicaRow> =
            sqlx::query_as("SELECT * FROM replicas WHERE state = 'alive' AND heartbeat_at < $1 AND node_id <> $2")
                .bind(stale_before)
                .bind(self_node)
                .fetch_all(self.pool())
                .await?;
        let mut declared = Vec::new();
        for r in stale {
            let done = sqlx::query(
                "UPDATE replicas SET state = 'dead' WHERE node_id = $1 AND process_id = $2 AND state = 'alive'
                 AND heartbeat_at < $3",
            )
            .bind(&r.node_id)
            .bind(&r.process_id)
            .bind(stale_before)
            .execute(self.pool())
            .await?;
            if done.rows_affected() != 1 {
                continue;
            }
            let now = ids::now();
            sqlx::query(
                "UPDATE terminal_sessions SET state = 'lost', ended_at = $1, end_reason = $2
                 WHERE node_id = $3 AND state = 'running'",
            )
            .bind(&now)
            .bind(DEAD_REPLICA_REASON)
            .bind(&r.node_id)
            .execute(self.pool())
            .await?;
            self.lose_mcp_owners(&r.node_id).await?;
            // The runners it held connected elsewhere or not at all: it holds none any more.
            sqlx::query(
                "UPDATE devices SET holder_node_id = NULL, holder_process_id = NULL, session_sha256 = NULL
                 WHERE holder_node_id = $1 AND holder_process_id = $2",
            )
            .bind(&r.node_id)
            .bind(&r.process_id)
            .execute(self.pool())
            .await?;
            let interrupted = self.interrupt_orphans(Some(&format!("{}:", r.node_id))).await?;
            crate::metrics::invocations_recovered(interrupted);
            declared.push(r.node_id);
        }
        Ok(declared)
    }
}
