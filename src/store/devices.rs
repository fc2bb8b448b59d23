//! Devices with remote runners: enrollment codes, public keys, revocation, last seen
//! (docs/runner.md). The rows themselves are [`super::DeviceRow`].

use super::{DeviceRow, RunScopeRow, Store, StoreResult, WorkspaceRow};

/// A device enrolled with a new key ([`Store::enroll_device`]).
#[derive(Debug, Clone)]
pub struct Enrolled {
    /// The device as it is now: the new key, no holder.
    pub device: DeviceRow,
    /// The device just before: the holder of the earlier runner's connection, if any.
    pub before: DeviceRow,
}

impl Store {
    /// Sets a new one-time enrollment code (its SHA-256 `code_sha256`, valid until
    /// `expires_at`) on the caller's device `id`, replacing any earlier one. False when the
    /// device is not the caller's or is revoked.
    pub async fn set_enrollment_code(
        &self,
        owner_id: &str,
        id: &str,
        code_sha256: &str,
        expires_at: &str,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE devices SET enroll_code_sha256 = $1, enroll_expires_at = $2
             WHERE id = $3 AND owner_id = $4 AND revoked_at IS NULL",
        )
        .bind(code_sha256)
        .bind(expires_at)
        .bind(id)
        .bind(owner_id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Uses the enrollment code whose SHA-256 is `code_sha256` at `now`: the device takes
    /// `public_key` and the code is spent. None when no unexpired code of a device that is not
    /// revoked matches (the code works once).
    ///
    /// A new key ends the earlier runner's session as a revocation does, in the same
    /// transaction: the holder and the session hash are cleared (that runner's heartbeats are
    /// refused from now on, on every replica) and the device's terminal sessions still
    /// `running` are recorded `lost` (they were on the earlier runner). The row is locked
    /// first, so the holder returned in [`Enrolled::before`] is the one replaced (the caller
    /// cuts that connection) and a connect under the earlier key that waited on the lock
    /// finds the key changed ([`Store::hold_device`]).
    pub async fn enroll_device(&self, code_sha256: &str, public_key: &str, now: &str) -> StoreResult<Option<Enrolled>> {
        let mut tx = self.begin_write().await?;
        // A no-op update locks the row (Postgres; SQLite's write transaction is serialised).
        let locked = sqlx::query(
            "UPDATE devices SET enroll_code_sha256 = enroll_code_sha256
             WHERE enroll_code_sha256 = $1 AND enroll_expires_at > $2 AND revoked_at IS NULL",
        )
        .bind(code_sha256)
        .bind(now)
        .execute(tx.conn())
        .await?;
        if locked.rows_affected() != 1 {
            return Ok(None);
        }
        let before: Option<DeviceRow> = sqlx::query_as("SELECT * FROM devices WHERE enroll_code_sha256 = $1")
            .bind(code_sha256)
            .fetch_optional(tx.conn())
            .await?;
        let Some(before) = before else { return Ok(None) };
        sqlx::query(
            "UPDATE devices SET public_key = $1, enrolled_at = $2, enroll_code_sha256 = NULL, enroll_expires_at = NULL,
                holder_node_id = NULL, holder_process_id = NULL, session_sha256 = NULL
             WHERE id = $3",
        )
        .bind(public_key)
        .bind(now)
        .bind(&before.id)
        .execute(tx.conn())
        .await?;
        sqlx::query(
            "UPDATE terminal_sessions SET state = 'lost', ended_at = $1,
                end_reason = 'the device was enrolled with a new key: the earlier runner''s sessions are gone; the output it had sent is kept'
             WHERE state = 'running' AND node_id = $2",
        )
        .bind(now)
        .bind(&before.id)
        .execute(tx.conn())
        .await?;
        let device: Option<DeviceRow> =
            sqlx::query_as("SELECT * FROM devices WHERE id = $1").bind(&before.id).fetch_optional(tx.conn()).await?;
        let Some(device) = device else { return Ok(None) };
        tx.commit().await?;
        Ok(Some(Enrolled { device, before }))
    }

    /// The device `id` whoever owns it (for a runner authenticating with the device key).
    pub async fn device_by_id(&self, id: &str) -> StoreResult<Option<DeviceRow>> {
        Ok(sqlx::query_as("SELECT * FROM devices WHERE id = $1").bind(id).fetch_optional(self.pool()).await?)
    }

    /// Renames the caller's device. False when it is not the caller's.
    pub async fn rename_device(&self, owner_id: &str, id: &str, name: &str) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE devices SET name = $1 WHERE id = $2 AND owner_id = $3")
            .bind(name)
            .bind(id)
            .bind(owner_id)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Revokes the caller's device at `now` (a pending enrollment code dies with it). False
    /// when it is not the caller's; revoking twice keeps the first time.
    pub async fn revoke_device(&self, owner_id: &str, id: &str, now: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE devices SET revoked_at = COALESCE(revoked_at, $1), enroll_code_sha256 = NULL, enroll_expires_at = NULL,
                holder_node_id = NULL, holder_process_id = NULL, session_sha256 = NULL
             WHERE id = $2 AND owner_id = $3",
        )
        .bind(now)
        .bind(id)
        .bind(owner_id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records that `holder` (the replica's node id, its process id) holds device `id`'s live
    /// connection, with session token SHA-256 `session_sha256`, at `now` (its heartbeat), and
    /// what the runner advertised (JSON), for a runner that proved it holds the key
    /// `public_key`. Replaces an earlier holder. False when the device was revoked meanwhile
    /// or enrolled with another key ([`Store::enroll_device`]).
    pub async fn hold_device(
        &self,
        id: &str,
        holder: (&str, &str),
        session_sha256: &str,
        now: &str,
        advertised: Option<&str>,
        public_key: &str,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE devices SET holder_node_id = $1, holder_process_id = $2, session_sha256 = $3, last_seen_at = $4,
                advertised = COALESCE($5, advertised)
             WHERE id = $6 AND revoked_at IS NULL AND public_key = $7",
        )
        .bind(holder.0)
        .bind(holder.1)
        .bind(session_sha256)
        .bind(now)
        .bind(advertised)
        .bind(id)
        .bind(public_key)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Renews the heartbeat of device `id` held under `session_sha256` at `now`. False when
    /// that session no longer holds the device (a newer connection took it, the device was
    /// revoked): the connection is to be cut.
    pub async fn beat_device(&self, id: &str, session_sha256: &str, now: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE devices SET last_seen_at = $1 WHERE id = $2 AND session_sha256 = $3 AND revoked_at IS NULL",
        )
        .bind(now)
        .bind(id)
        .bind(session_sha256)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Forgets the holder of device `id` when it is still the connection `session_sha256`
    /// (a newer connection elsewhere is left alone).
    pub async fn release_device(&self, id: &str, session_sha256: &str) -> StoreResult<()> {
        sqlx::query(
            "UPDATE devices SET holder_node_id = NULL, holder_process_id = NULL, session_sha256 = NULL
             WHERE id = $1 AND session_sha256 = $2",
        )
        .bind(id)
        .bind(session_sha256)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Records a connect challenge for device `device_id` (its SHA-256 `challenge_sha256`,
    /// valid until `expires_at`), and forgets those expired at `now`.
    pub async fn add_runner_challenge(
        &self,
        challenge_sha256: &str,
        device_id: &str,
        expires_at: &str,
        now: &str,
    ) -> StoreResult<()> {
        sqlx::query("DELETE FROM runner_challenges WHERE expires_at < $1").bind(now).execute(self.pool()).await?;
        sqlx::query("INSERT INTO runner_challenges (challenge_sha256, device_id, expires_at) VALUES ($1, $2, $3)")
            .bind(challenge_sha256)
            .bind(device_id)
            .bind(expires_at)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Spends the challenge `challenge_sha256` of device `device_id` at `now`: true once for an
    /// unexpired challenge issued to that device (one conditional DELETE decides, so of two
    /// connects with one challenge, on any replicas, one wins).
    pub async fn take_runner_challenge(&self, challenge_sha256: &str, device_id: &str, now: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "DELETE FROM runner_challenges WHERE challenge_sha256 = $1 AND device_id = $2 AND expires_at > $3",
        )
        .bind(challenge_sha256)
        .bind(device_id)
        .bind(now)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The device whose live connection has session token SHA-256 `session_sha256`.
    pub async fn device_by_session(&self, session_sha256: &str) -> StoreResult<Option<DeviceRow>> {
        Ok(sqlx::query_as("SELECT * FROM devices WHERE session_sha256 = $1")
            .bind(session_sha256)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Run `run_id` whoever owns it, with its workspace (its owner's or a shared one): what
    /// the replica holding a device reads for a job forwarded to it (`/internal/v1/devices/job`),
    /// which takes the owner, the device and the workspace from here, never from the request.
    pub async fn run_scope_any_owner(&self, run_id: &str) -> StoreResult<Option<RunScopeRow>> {
        let owner: Option<String> = sqlx::query_scalar("SELECT owner_id FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(self.pool())
            .await?;
        match owner {
            Some(owner) => self.run_scope_for(&owner, run_id, None).await,
            None => Ok(None),
        }
    }

    /// Registers the workspace `path` (absolute, on the device `device_id`; not looked at
    /// here: the device's runner checks it) for `owner_id`.
    pub async fn create_device_workspace(
        &self,
        owner_id: &str,
        name: &str,
        path: &str,
        device_id: &str,
    ) -> StoreResult<WorkspaceRow> {
        let row = WorkspaceRow {
            id: crate::ids::new_id("ws"),
            owner_id: Some(owner_id.to_owned()),
            name: name.to_owned(),
            path: path.to_owned(),
            device_id: Some(device_id.to_owned()),
            created_at: crate::ids::now(),
            root_identity: None,
            root_registered_at: None,
        };
        sqlx::query(
            "INSERT INTO workspaces (id, owner_id, name, path, device_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&row.id)
        .bind(owner_id)
        .bind(&row.name)
        .bind(&row.path)
        .bind(device_id)
        .bind(&row.created_at)
        .execute(self.pool())
        .await?;
        Ok(row)
    }
}
