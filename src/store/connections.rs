//! Storage of user connections (`connections`, migration 0024): one row per GitHub account,
//! mail account… with its sealed credential and the last check's report. The in-memory view
//! the tools' availability reads is [`crate::connections::ConnectionHub`].

use super::{Store, StoreResult};
use crate::state::Flag;

/// A stored connection (the credential stays sealed).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ConnectionRow {
    /// `conn_…`
    pub id: String,
    /// Owner; None = shared (an admin's, usable by every user).
    pub owner_id: Option<String>,
    /// `github`, `mail`… ([`crate::connections::ConnectionKind`]).
    pub kind: String,
    /// Display name.
    pub name: String,
    /// The kind's validated, non-secret settings (JSON object).
    pub settings_json: String,
    /// The credential object, sealed with the secret box (associated data: the id).
    pub credential_ciphertext: String,
    /// Id of the key that sealed it.
    pub credential_key_id: String,
    /// True when calls may use it (stored as 0/1).
    #[sqlx(try_from = "Flag")]
    pub enabled: bool,
    /// The last check's report ([`crate::connections::CheckReport`] as JSON); None = never
    /// checked.
    pub check_json: Option<String>,
    /// When the last check ran (RFC 3339).
    pub checked_at: Option<String>,
    /// When the periodic check is due (RFC 3339).
    pub next_check_at: String,
    /// End of a rate limit a call or check ran into (RFC 3339).
    pub rate_limited_until: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

impl Store {
    /// Stores a new connection, unless its owner owns `owner_limit` connections already
    /// (false, nothing stored; a shared connection has no owner and no limit). The count and
    /// the insert are one write transaction under the owner's lock ([`Store::begin_owner_write`]),
    /// so concurrent requests never pass the limit together.
    pub async fn create_connection(&self, row: &ConnectionRow, owner_limit: i64) -> StoreResult<bool> {
        let (_turn, mut tx) = match &row.owner_id {
            Some(owner) => {
                let (turn, tx) = self.begin_owner_write(owner).await?;
                (Some(turn), tx)
            }
            None => (None, self.begin_write().await?),
        };
        if let Some(owner) = &row.owner_id {
            let owned: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM connections WHERE owner_id = $1")
                .bind(owner)
                .fetch_one(tx.conn())
                .await?;
            if owned >= owner_limit {
                tx.commit().await?;
                return Ok(false);
            }
        }
        sqlx::query(
            "INSERT INTO connections (id, owner_id, kind, name, settings_json, credential_ciphertext,
                 credential_key_id, enabled, check_json, checked_at, next_check_at, rate_limited_until,
                 created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        )
        .bind(&row.id)
        .bind(&row.owner_id)
        .bind(&row.kind)
        .bind(&row.name)
        .bind(&row.settings_json)
        .bind(&row.credential_ciphertext)
        .bind(&row.credential_key_id)
        .bind(i64::from(row.enabled))
        .bind(&row.check_json)
        .bind(&row.checked_at)
        .bind(&row.next_check_at)
        .bind(&row.rate_limited_until)
        .bind(&row.created_at)
        .bind(&row.updated_at)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Every stored connection, oldest first (the in-memory state is built from this).
    pub async fn all_connections(&self) -> StoreResult<Vec<ConnectionRow>> {
        Ok(sqlx::query_as("SELECT * FROM connections ORDER BY id").fetch_all(self.pool()).await?)
    }

    /// The ids of every admin (their connections may reach internal addresses).
    pub async fn admin_user_ids(&self) -> StoreResult<std::collections::HashSet<String>> {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id FROM users WHERE is_admin <> 0").fetch_all(self.pool()).await?;
        Ok(ids.into_iter().collect())
    }

    /// One connection by id (any owner: callers check who may see it).
    pub async fn connection(&self, id: &str) -> StoreResult<Option<ConnectionRow>> {
        Ok(sqlx::query_as("SELECT * FROM connections WHERE id = $1").bind(id).fetch_optional(self.pool()).await?)
    }

    /// Writes the mutable fields (name, settings, credential, enabled) of connection `row.id`
    /// and clears its check (the next check is due at once). False when it is gone.
    pub async fn update_connection(&self, row: &ConnectionRow) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE connections SET name = $2, settings_json = $3, credential_ciphertext = $4,
                 credential_key_id = $5, enabled = $6, check_json = $7, checked_at = $8,
                 next_check_at = $9, rate_limited_until = $10, updated_at = $11
             WHERE id = $1",
        )
        .bind(&row.id)
        .bind(&row.name)
        .bind(&row.settings_json)
        .bind(&row.credential_ciphertext)
        .bind(&row.credential_key_id)
        .bind(i64::from(row.enabled))
        .bind(&row.check_json)
        .bind(&row.checked_at)
        .bind(&row.next_check_at)
        .bind(&row.rate_limited_until)
        .bind(&row.updated_at)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Claims the periodic check of `id` by moving `next_check_at` from `seen_next` (the due
    /// time the caller read) to `next` (compare-and-set: of several replicas, one wins). True
    /// when this caller won.
    pub async fn claim_connection_check(&self, id: &str, seen_next: &str, next: &str) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE connections SET next_check_at = $3 WHERE id = $1 AND next_check_at = $2")
            .bind(id)
            .bind(seen_next)
            .bind(next)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Records a check's report (`check_json`), when it ran, and the rate limit it met.
    /// Only while the credential is still `credential_ciphertext` (a check of a credential
    /// that was replaced meanwhile is dropped). True when written.
    pub async fn record_connection_check(
        &self,
        id: &str,
        credential_ciphertext: &str,
        check_json: &str,
        checked_at: &str,
        rate_limited_until: Option<&str>,
    ) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE connections SET check_json = $3, checked_at = $4, rate_limited_until = $5
             WHERE id = $1 AND credential_ciphertext = $2",
        )
        .bind(id)
        .bind(credential_ciphertext)
        .bind(check_json)
        .bind(checked_at)
        .bind(rate_limited_until)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Deletes connection `id` (its sealed credential with it). False when it is gone.
    pub async fn delete_connection(&self, id: &str) -> StoreResult<bool> {
        let done = sqlx::query("DELETE FROM connections WHERE id = $1").bind(id).execute(self.pool()).await?;
        Ok(done.rows_affected() == 1)
    }
}
