//! Terminal sessions and their retained output.
//!
//! A session row records what was started (command, args, real cwd, env, PTY size, life
//! limit), on which node, and how it ended. Output is kept as chunks of raw bytes (base64
//! text, so both back-ends store it the same way) addressed by byte offsets in the session's
//! output; chunks older than the session's retention cap are deleted and `retained_from`
//! says where the kept output begins. Each action's report of a byte range is recorded in
//! `terminal_reports`; a session's *reported-up-to* offset is the largest end of a range
//! whose invocation completed.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;

use super::{Store, StoreError, StoreResult};
use crate::ids;
use crate::state::TerminalSessionState;

/// A stored terminal session.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct TerminalSessionRow {
    /// `term_…`
    pub id: String,
    /// Owner.
    pub owner_id: String,
    /// The run whose invocation started it.
    pub run_id: String,
    /// The `start` invocation.
    pub invocation_id: String,
    /// The node (`<stable node id>`) whose process holds the PTY.
    pub node_id: String,
    /// Program started.
    pub command: String,
    /// Its arguments (JSON array text).
    pub args: String,
    /// Real absolute working directory.
    pub cwd: String,
    /// Environment set for the process beyond the server's (JSON object text).
    pub env: String,
    /// PTY columns.
    pub cols: i64,
    /// PTY rows.
    pub rows: i64,
    /// Life limit in ms.
    pub timeout_ms: i64,
    /// Process id of the session leader.
    pub pid: Option<i64>,
    /// `<boot id>:<start time>` of the leader, which tells it apart from a later process
    /// that got the same pid.
    pub pid_start: Option<String>,
    /// `running`, or how it ended.
    pub state: TerminalSessionState,
    /// Why it ended, in words.
    pub end_reason: Option<String>,
    /// Exit code when the process exited.
    pub exit_code: Option<i64>,
    /// Signal name when a signal ended it.
    pub signal: Option<String>,
    /// Bytes of output produced so far.
    pub bytes_out: i64,
    /// Offset of the oldest retained byte.
    pub retained_from: i64,
    /// Output before this offset was reported by completed actions (0 where the query does
    /// not ask for it: see [`REPORTED_TO`]).
    #[sqlx(default)]
    pub reported_to: i64,
    /// RFC 3339.
    pub started_at: String,
    /// RFC 3339, when ended.
    pub ended_at: Option<String>,
}

/// Who started a session: the `start` invocation's owner, run and id.
#[derive(Debug, Clone)]
pub struct SessionOrigin {
    /// Owner.
    pub owner_id: String,
    /// The run whose invocation started it.
    pub run_id: String,
    /// The `start` invocation.
    pub invocation_id: String,
}

/// What a `start` launched, as a session row records it.
#[derive(Debug, Clone, Default)]
pub struct SessionLaunch {
    /// The command as given (for display).
    pub command: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Real absolute working directory.
    pub cwd: String,
    /// Environment set for the process (`null` = left unset).
    pub env: serde_json::Map<String, serde_json::Value>,
    /// PTY columns.
    pub cols: u16,
    /// PTY rows.
    pub rows: u16,
    /// Life limit in ms.
    pub timeout_ms: u64,
}

impl TerminalSessionRow {
    /// The row of session `id` started now by `origin`, its PTY held by `node_id` (the
    /// replica's stable node id on the host, the device id on a device): `running`, no output
    /// yet, no process id (the host sets `pid` and `pid_start` once it spawned the leader).
    pub fn new_running(id: String, node_id: String, origin: SessionOrigin, launch: SessionLaunch) -> Self {
        Self {
            id,
            owner_id: origin.owner_id,
            run_id: origin.run_id,
            invocation_id: origin.invocation_id,
            node_id,
            command: launch.command,
            args: serde_json::Value::from(launch.args).to_string(),
            cwd: launch.cwd,
            env: serde_json::Value::Object(launch.env).to_string(),
            cols: i64::from(launch.cols),
            rows: i64::from(launch.rows),
            timeout_ms: i64::try_from(launch.timeout_ms).unwrap_or(i64::MAX),
            pid: None,
            pid_start: None,
            state: TerminalSessionState::Running,
            end_reason: None,
            exit_code: None,
            signal: None,
            bytes_out: 0,
            retained_from: 0,
            reported_to: 0,
            started_at: ids::now(),
            ended_at: None,
        }
    }
}

/// How a session ended.
#[derive(Debug, Clone)]
pub struct SessionEnd {
    /// Final state (`exited`, `killed`, `timed_out`, `reaped`, `lost`).
    pub state: TerminalSessionState,
    /// Why, in words.
    pub reason: Option<String>,
    /// Exit code.
    pub exit_code: Option<i64>,
    /// Signal name.
    pub signal: Option<String>,
}

/// SQL expression: the reported-up-to offset of the session `s` (see the module docs).
pub const REPORTED_TO: &str = "(SELECT COALESCE(MAX(r.end_offset), 0) FROM terminal_reports r
    JOIN invocations i ON i.id = r.invocation_id WHERE r.session_id = s.id AND i.status = 'completed')";

/// One action's report of a byte range of a session's output.
#[derive(Debug, Clone)]
pub struct TerminalReport {
    /// The session.
    pub session_id: String,
    /// The invocation whose result carries the range.
    pub invocation_id: String,
    /// First offset.
    pub from: u64,
    /// One past the last offset.
    pub to: u64,
}

impl Store {
    /// Records a started session.
    pub async fn insert_terminal_session(&self, row: &TerminalSessionRow) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO terminal_sessions (id, owner_id, run_id, invocation_id, node_id, command, args, cwd, env,
                cols, rows, timeout_ms, pid, pid_start, state, bytes_out, retained_from, started_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 0, 0, $16)",
        )
        .bind(&row.id)
        .bind(&row.owner_id)
        .bind(&row.run_id)
        .bind(&row.invocation_id)
        .bind(&row.node_id)
        .bind(&row.command)
        .bind(&row.args)
        .bind(&row.cwd)
        .bind(&row.env)
        .bind(row.cols)
        .bind(row.rows)
        .bind(row.timeout_ms)
        .bind(row.pid)
        .bind(&row.pid_start)
        .bind(row.state)
        .bind(&row.started_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The caller's session, or None (with its reported-up-to offset).
    pub async fn terminal_session_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<TerminalSessionRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT s.*, {REPORTED_TO} AS reported_to FROM terminal_sessions s WHERE s.id = $1 AND s.owner_id = $2"
        )))
        .bind(id)
        .bind(owner_id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// The session's reported-up-to offset: output before it was in the result of a
    /// completed action.
    pub async fn terminal_reported_to(&self, id: &str) -> StoreResult<u64> {
        let v: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {REPORTED_TO} FROM terminal_sessions s WHERE s.id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await?
        .unwrap_or(0);
        Ok(u64::try_from(v).unwrap_or(0))
    }

    /// A session whoever owns it (for a stream already authorised).
    pub async fn terminal_session_for_any(&self, id: &str) -> StoreResult<Option<TerminalSessionRow>> {
        Ok(sqlx::query_as("SELECT * FROM terminal_sessions WHERE id = $1").bind(id).fetch_optional(self.pool()).await?)
    }

    /// The caller's sessions, newest first, optionally of one run.
    pub async fn list_terminal_sessions(
        &self,
        owner_id: &str,
        run_id: Option<&str>,
        cursor: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<TerminalSessionRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT s.*, {REPORTED_TO} AS reported_to FROM terminal_sessions s WHERE s.owner_id = $1
             AND ($2 IS NULL OR s.run_id = $2) AND ($3 IS NULL OR s.id < $3) ORDER BY s.id DESC LIMIT $4"
        )))
        .bind(owner_id)
        // An empty filter is no filter (as it always was).
        .bind(run_id.filter(|r| !r.is_empty()))
        .bind(cursor.filter(|c| !c.is_empty()))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// Updates the PTY size.
    pub async fn resize_terminal_session(&self, id: &str, cols: u16, rows: u16) -> StoreResult<()> {
        sqlx::query("UPDATE terminal_sessions SET cols = $1, rows = $2 WHERE id = $3")
            .bind(i64::from(cols))
            .bind(i64::from(rows))
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Stores one chunk of output `[start, start + data.len())`, moves the session's
    /// `bytes_out` forward, and drops chunks that end before `retain_from` (the retention
    /// cap), all in one transaction.
    pub async fn append_terminal_chunk(
        &self,
        id: &str,
        start: u64,
        data: &[u8],
        bytes_out: u64,
        retain_from: u64,
    ) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        write_chunk(&mut tx, id, start, data, bytes_out, retain_from).await?;
        tx.commit().await
    }

    /// A device's chunk `[held, held + data.len())` of the `running` session `id` whose
    /// `bytes_out` is `held`: moves `bytes_out` to its end and stores it as
    /// [`Store::append_terminal_chunk`] does, in one transaction. False (nothing stored) when
    /// the session is no longer `running` or its `bytes_out` moved meanwhile.
    pub async fn append_device_terminal_chunk(
        &self,
        id: &str,
        held: u64,
        data: &[u8],
        retain_from: u64,
    ) -> StoreResult<bool> {
        let to_i64 = |v: u64| i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("offset {v} too large")));
        let end = held + data.len() as u64;
        let mut tx = self.begin_write().await?;
        let claimed = sqlx::query(
            "UPDATE terminal_sessions SET bytes_out = $1 WHERE id = $2 AND bytes_out = $3 AND state = 'running'",
        )
        .bind(to_i64(end)?)
        .bind(id)
        .bind(to_i64(held)?)
        .execute(tx.conn())
        .await?
        .rows_affected();
        if claimed != 1 {
            return Ok(false);
        }
        write_chunk(&mut tx, id, held, data, end, retain_from).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Stored output chunks that end after `offset`, in order: `(start, bytes)`.
    pub async fn terminal_chunks_from(&self, id: &str, offset: u64, limit: i64) -> StoreResult<Vec<(u64, Vec<u8>)>> {
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT start_offset, data FROM terminal_chunks WHERE session_id = $1 AND end_offset > $2
             ORDER BY start_offset LIMIT $3",
        )
        .bind(id)
        .bind(i64::try_from(offset).unwrap_or(i64::MAX))
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.into_iter()
            .map(|(start, data)| {
                let bytes = STANDARD.decode(data).map_err(|e| StoreError::Corrupt(format!("terminal chunk: {e}")))?;
                Ok((u64::try_from(start).unwrap_or(0), bytes))
            })
            .collect()
    }

    /// Records how a session ended (only if it is still `running`).
    pub async fn end_terminal_session(&self, id: &str, end: &SessionEnd, bytes_out: u64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE terminal_sessions SET state = $1, end_reason = $2, exit_code = $3, signal = $4, ended_at = $5,
                bytes_out = $6 WHERE id = $7 AND state = 'running'",
        )
        .bind(end.state)
        .bind(&end.reason)
        .bind(end.exit_code)
        .bind(&end.signal)
        .bind(ids::now())
        .bind(i64::try_from(bytes_out).unwrap_or(i64::MAX))
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Appends a `terminal.output` event to `run_id`'s log — which session, which invocation,
    /// which byte range of its output (the bytes themselves are in the session's stream) —
    /// and, for an action that reports output, records its range in the same transaction
    /// (it counts once the invocation has completed).
    pub async fn record_terminal_output(
        &self,
        run_id: &str,
        data: &serde_json::Value,
        report: Option<&TerminalReport>,
    ) -> StoreResult<()> {
        let to_i64 = |v: u64| i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("offset {v} too large")));
        let mut tx = self.begin_write().await?;
        tx.append_event(run_id, crate::events::EventKind::TerminalOutput, data).await?;
        if let Some(r) = report {
            sqlx::query(
                "INSERT INTO terminal_reports (invocation_id, session_id, start_offset, end_offset)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (invocation_id) DO NOTHING",
            )
            .bind(&r.invocation_id)
            .bind(&r.session_id)
            .bind(to_i64(r.from)?)
            .bind(to_i64(r.to)?)
            .execute(tx.conn())
            .await?;
        }
        tx.commit().await
    }

    /// Sessions this node left `running` (a previous process of this server): marks them
    /// `lost` and returns `(id, leader pid, pid_start)` of each, so that leftovers can be killed.
    pub async fn lose_terminal_sessions(&self, node_id: &str) -> StoreResult<Vec<(String, i64, Option<String>)>> {
        let pids: Vec<(String, Option<i64>, Option<String>)> =
            sqlx::query_as("SELECT id, pid, pid_start FROM terminal_sessions WHERE node_id = $1 AND state = 'running'")
                .bind(node_id)
                .fetch_all(self.pool())
                .await?;
        sqlx::query(
            "UPDATE terminal_sessions SET state = 'lost', ended_at = $1,
                end_reason = 'the server stopped; its processes were killed with it' WHERE node_id = $2 AND state = 'running'",
        )
        .bind(ids::now())
        .bind(node_id)
        .execute(self.pool())
        .await?;
        Ok(pids.into_iter().map(|(id, pid, start)| (id, pid.unwrap_or(0), start)).collect())
    }

    /// Sessions on remote devices (`node_id` = the device id) still `running` whose device's
    /// runner was last seen before `cutoff` (RFC 3339), or whose device was revoked: marks
    /// them `lost` (the output already stored stays readable); how many.
    pub async fn lose_device_terminal_sessions(&self, cutoff: &str) -> StoreResult<u64> {
        let done = sqlx::query(
            "UPDATE terminal_sessions SET state = 'lost', ended_at = $1,
                end_reason = 'the device''s runner went away (its lease ran out); the output it had sent is kept'
             WHERE state = 'running' AND node_id IN
                (SELECT id FROM devices WHERE revoked_at IS NOT NULL OR last_seen_at IS NULL OR last_seen_at < $2)",
        )
        .bind(ids::now())
        .bind(cutoff)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }
}

/// Stores one chunk of output `[start, start + data.len())` in `tx`, moves the session's
/// `bytes_out` forward, and drops chunks that end before `retain_from` (the retention cap).
async fn write_chunk(
    tx: &mut super::WriteTx,
    id: &str,
    start: u64,
    data: &[u8],
    bytes_out: u64,
    retain_from: u64,
) -> StoreResult<()> {
    let to_i64 = |v: u64| i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("offset {v} too large")));
    let end = start + data.len() as u64;
    if !data.is_empty() {
        sqlx::query("INSERT INTO terminal_chunks (session_id, start_offset, end_offset, data) VALUES ($1, $2, $3, $4)")
            .bind(id)
            .bind(to_i64(start)?)
            .bind(to_i64(end)?)
            .bind(STANDARD.encode(data))
            .execute(tx.conn())
            .await?;
    }
    sqlx::query("DELETE FROM terminal_chunks WHERE session_id = $1 AND end_offset <= $2")
        .bind(id)
        .bind(to_i64(retain_from)?)
        .execute(tx.conn())
        .await?;
    let oldest: Option<i64> = sqlx::query_scalar("SELECT MIN(start_offset) FROM terminal_chunks WHERE session_id = $1")
        .bind(id)
        .fetch_one(tx.conn())
        .await?;
    sqlx::query("UPDATE terminal_sessions SET bytes_out = $1, retained_from = $2 WHERE id = $3")
        .bind(to_i64(bytes_out)?)
        .bind(oldest.unwrap_or(to_i64(end)?))
        .bind(id)
        .execute(tx.conn())
        .await?;
    Ok(())
}
