//! Retention: removing runs that ended long ago, with everything that belongs to them, and
//! giving the space back (see [`crate::retention`] for the background job).

use super::{Backend, Store, StoreResult};

/// What one batch removed (row counts per table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RetentionCounts {
    /// Runs.
    pub runs: u64,
    /// Turns (each with the exposure the model was shown).
    pub turns: u64,
    /// Invocations.
    pub invocations: u64,
    /// Approvals.
    pub approvals: u64,
    /// Evidence.
    pub evidence: u64,
    /// Run events.
    pub events: u64,
    /// Terminal sessions (with their stored output chunks and reports).
    pub terminal_sessions: u64,
}

impl RetentionCounts {
    /// Adds `other` to these counts.
    pub fn add(&mut self, other: RetentionCounts) {
        self.runs += other.runs;
        self.turns += other.turns;
        self.invocations += other.invocations;
        self.approvals += other.approvals;
        self.evidence += other.evidence;
        self.events += other.events;
        self.terminal_sessions += other.terminal_sessions;
    }
}

impl Store {
    /// Up to `limit` runs, oldest first, that retention may remove at `cutoff` (RFC 3339): created
    /// before it, with no turn, invocation change or event since, no invocation that is
    /// `awaiting_approval`, `queued` or `running`, and no terminal session still `running`.
    pub async fn expired_runs(&self, cutoff: &str, limit: i64) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT r.id FROM runs r
             WHERE r.created_at < $1
               AND NOT EXISTS (SELECT 1 FROM invocations i WHERE i.run_id = r.id
                   AND (i.status IN ('awaiting_approval', 'queued', 'running') OR i.updated_at >= $1))
               AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = r.id AND t.created_at >= $1)
               AND NOT EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.id AND e.created_at >= $1)
               AND NOT EXISTS (SELECT 1 FROM terminal_sessions s WHERE s.run_id = r.id AND s.state = 'running')
             ORDER BY r.created_at, r.id LIMIT $2",
        )
        .bind(cutoff)
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// Removes the runs `ids` that are still expired at `cutoff` (rechecked inside the write
    /// transaction, so a run that got new work since [`Store::expired_runs`] stays), with their
    /// turns, invocations, approvals, evidence, events and terminal sessions (output chunks and
    /// reports included), in one transaction.
    pub async fn delete_expired_runs(&self, ids: &[String], cutoff: &str) -> StoreResult<RetentionCounts> {
        if ids.is_empty() {
            return Ok(RetentionCounts::default());
        }
        let list = serde_json::Value::from(ids.to_vec()).to_string();
        // The ids as rows: JSON on both back-ends (the Any driver binds no arrays).
        let ids_sql = match self.backend() {
            Backend::Sqlite => "SELECT value FROM json_each($1)",
            Backend::Postgres => "SELECT json_array_elements_text($1::json)",
        };
        let mut tx = self.begin_write().await?;
        // Recheck under the write lock: only runs still expired are removed.
        let still: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT r.id FROM runs r
             WHERE r.id IN ({ids_sql}) AND r.created_at < $2
               AND NOT EXISTS (SELECT 1 FROM invocations i WHERE i.run_id = r.id
                   AND (i.status IN ('awaiting_approval', 'queued', 'running') OR i.updated_at >= $2))
               AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.run_id = r.id AND t.created_at >= $2)
               AND NOT EXISTS (SELECT 1 FROM events e WHERE e.run_id = r.id AND e.created_at >= $2)
               AND NOT EXISTS (SELECT 1 FROM terminal_sessions s WHERE s.run_id = r.id AND s.state = 'running')"
        )))
        .bind(&list)
        .bind(cutoff)
        .fetch_all(tx.conn())
        .await?;
        if still.is_empty() {
            tx.commit().await?;
            return Ok(RetentionCounts::default());
        }
        let list = serde_json::Value::from(still).to_string();
        // The removed turns' task vectors (learning from use keeps them in the embedding
        // cache, [`super::task_key`]) go with them: a vector says something of its text.
        let tasks: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT DISTINCT r.owner_id, substr(t.task, 1, {}) FROM turns t JOIN runs r ON r.id = t.run_id
             WHERE t.run_id IN ({ids_sql})",
            super::TASK_PREFIX_CHARS
        )))
        .bind(&list)
        .fetch_all(tx.conn())
        .await?;
        let keys: Vec<String> = tasks.iter().map(|(owner, task)| super::task_key(owner, task)).collect();
        for chunk in keys.chunks(200) {
            let placeholders: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM tool_embeddings WHERE text_sha256 IN ({})",
                placeholders.join(", ")
            )));
            for k in chunk {
                q = q.bind(k);
            }
            q.execute(tx.conn()).await?;
        }
        // Children first: every foreign key points at a row deleted after it.
        let sessions = format!("SELECT id FROM terminal_sessions WHERE run_id IN ({ids_sql})");
        let statements = [
            format!("DELETE FROM terminal_chunks WHERE session_id IN ({sessions})"),
            format!("DELETE FROM terminal_reports WHERE session_id IN ({sessions})"),
            format!("DELETE FROM terminal_sessions WHERE run_id IN ({ids_sql})"),
            format!("DELETE FROM events WHERE run_id IN ({ids_sql})"),
            format!("DELETE FROM evidence WHERE run_id IN ({ids_sql})"),
            format!("DELETE FROM approvals WHERE run_id IN ({ids_sql})"),
            // Explicit: SQLite applies the table's ON DELETE CASCADE only with foreign keys on.
            format!(
                "DELETE FROM invocation_traces WHERE invocation_id IN (SELECT id FROM invocations WHERE run_id IN ({ids_sql}))"
            ),
            format!("DELETE FROM invocations WHERE run_id IN ({ids_sql})"),
            format!("DELETE FROM turns WHERE run_id IN ({ids_sql})"),
            format!("DELETE FROM runs WHERE id IN ({ids_sql})"),
        ];
        let mut removed = [0u64; 10];
        for (sql, n) in statements.into_iter().zip(removed.iter_mut()) {
            *n = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(&list).execute(tx.conn()).await?.rows_affected();
        }
        tx.commit().await?;
        let [_, _, terminal_sessions, events, evidence, approvals, _, invocations, turns, runs] = removed;
        Ok(RetentionCounts { runs, turns, invocations, approvals, evidence, events, terminal_sessions })
    }

    /// Gives freed space back after deletions. SQLite: `PRAGMA incremental_vacuum` returns the
    /// free pages to the file system when the database was created with
    /// `auto_vacuum = INCREMENTAL` (every database this version creates; see
    /// [`Store::connect`]), and is a no-op on older files (their free pages are reused by new
    /// rows; docs/retention.md has the one-off conversion). Postgres: nothing — autovacuum makes
    /// deleted rows' space reusable. Returns the SQLite pages still free afterwards (0 on
    /// Postgres).
    pub async fn reclaim_space(&self) -> StoreResult<i64> {
        match self.backend() {
            Backend::Sqlite => {
                let mut conn = self.pool().acquire().await?;
                sqlx::query("PRAGMA incremental_vacuum").execute(&mut *conn).await?;
                Ok(sqlx::query_scalar("PRAGMA freelist_count").fetch_one(&mut *conn).await?)
            }
            Backend::Postgres => Ok(0),
        }
    }

    /// The database's size in bytes: SQLite `page_count × page_size` (the main file, WAL
    /// excluded); Postgres `pg_database_size(current_database())`.
    pub async fn database_bytes(&self) -> StoreResult<i64> {
        let sql = match self.backend() {
            Backend::Sqlite => {
                "SELECT (SELECT page_count FROM pragma_page_count()) * (SELECT page_size FROM pragma_page_size())"
            }
            Backend::Postgres => "SELECT pg_database_size(current_database())",
        };
        Ok(sqlx::query_scalar(sql).fetch_one(self.pool()).await?)
    }

    /// SQLite's `auto_vacuum` mode (0 none, 1 full, 2 incremental); None on Postgres.
    pub async fn sqlite_auto_vacuum(&self) -> StoreResult<Option<i64>> {
        match self.backend() {
            Backend::Sqlite => Ok(Some(sqlx::query_scalar("PRAGMA auto_vacuum").fetch_one(self.pool()).await?)),
            Backend::Postgres => Ok(None),
        }
    }
}
