//! Users and their bearer tokens (stored as SHA-256 hashes only).

use serde::Serialize;

use super::{Store, StoreResult};
use crate::auth::Scopes;
use crate::ids;
use crate::state::Flag;

/// A stored user.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct UserRow {
    /// `usr_…`
    pub id: String,
    /// Unique name.
    pub name: String,
    /// 1 when the user may create users and workspaces.
    #[sqlx(try_from = "Flag")]
    pub is_admin: bool,
    /// 1 when the user may grant other users' four-eyes approvals (admins may too).
    #[sqlx(try_from = "Flag")]
    pub is_approver: bool,
    /// RFC 3339.
    pub created_at: String,
}

/// Who a valid token belongs to.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TokenIdentity {
    /// The user.
    pub user_id: String,
    /// The user's name.
    pub name: String,
    /// True for admins.
    #[sqlx(try_from = "Flag")]
    pub is_admin: bool,
    /// True for approvers (may grant other users' four-eyes approvals).
    #[sqlx(try_from = "Flag")]
    pub is_approver: bool,
    /// The token row, recorded on decisions ("from which token").
    pub token_id: String,
    /// What the token may do.
    #[sqlx(try_from = "String")]
    pub scopes: Scopes,
}

/// The roles a user is created with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Roles {
    /// May create users and workspaces, and decide other users' four-eyes approvals.
    pub admin: bool,
    /// May decide other users' four-eyes approvals.
    pub approver: bool,
}

impl Store {
    /// Number of users (0 on a fresh store: time to bootstrap the admin).
    pub async fn count_users(&self) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM users").fetch_one(self.pool()).await?)
    }

    /// Creates a user and its first token (given as its SHA-256 hex). A taken name is a
    /// unique violation ([`super::StoreError::is_unique_violation`]).
    pub async fn create_user(&self, name: &str, is_admin: bool, token_sha256: &str) -> StoreResult<UserRow> {
        self.create_user_with_roles(name, Roles { admin: is_admin, approver: false }, token_sha256).await
    }

    /// [`Store::create_user`] with every role.
    pub async fn create_user_with_roles(&self, name: &str, roles: Roles, token_sha256: &str) -> StoreResult<UserRow> {
        let user = UserRow {
            id: ids::new_id("usr"),
            name: name.to_owned(),
            is_admin: roles.admin,
            is_approver: roles.approver,
            created_at: ids::now(),
        };
        let mut tx = self.begin_write().await?;
        sqlx::query("INSERT INTO users (id, name, is_admin, is_approver, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(&user.id)
            .bind(&user.name)
            .bind(i64::from(user.is_admin))
            .bind(i64::from(user.is_approver))
            .bind(&user.created_at)
            .execute(tx.conn())
            .await?;
        // A user's first token holds every scope (it is the person's own).
        sqlx::query(
            "INSERT INTO tokens (id, user_id, token_sha256, label, created_at, scopes) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(ids::new_id("tok"))
        .bind(&user.id)
        .bind(token_sha256)
        .bind("initial")
        .bind(&user.created_at)
        .bind(Scopes::ALL.stored())
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(user)
    }

    /// The identity behind a token hash, if the token exists and is not revoked. A valid
    /// token's identity is reused for up to [`super::cache::IDENTITY_TTL`] (see
    /// [`super::cache`] for when a revocation takes effect).
    pub async fn identity_by_token(&self, token_sha256: &str) -> StoreResult<Option<TokenIdentity>> {
        let start = match self.identities.get(token_sha256) {
            Ok(identity) => return Ok(Some(identity)),
            Err(start) => start,
        };
        let row: Option<IdentityRow> = sqlx::query_as(
            "SELECT u.id AS user_id, u.name, u.is_admin, u.is_approver, t.id AS token_id, t.scopes, t.last_used_at
             FROM tokens t JOIN users u ON u.id = t.user_id
             WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL",
        )
        .bind(token_sha256)
        .fetch_optional(self.pool())
        .await?;
        let Some(row) = row else { return Ok(None) };
        self.identities.put(token_sha256, &row.identity, start);
        self.note_token_use(&row.identity.token_id, row.last_used_at.as_deref()).await;
        Ok(Some(row.identity))
    }

    /// Records that token `token_id` was used now, when its stored `last_used_at` is older
    /// than [`LAST_USED_PRECISION`] (so a busy token costs one write a minute per replica, not
    /// one per request). A failure is logged: it never refuses the request.
    async fn note_token_use(&self, token_id: &str, last_used_at: Option<&str>) {
        let now = chrono::Utc::now();
        let stale_before = ids::format_time(now - LAST_USED_PRECISION);
        if last_used_at.is_some_and(|at| at >= stale_before.as_str()) {
            return;
        }
        let done = sqlx::query(
            "UPDATE tokens SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at < $3)",
        )
        .bind(ids::format_time(now))
        .bind(token_id)
        .bind(&stale_before)
        .execute(self.pool())
        .await;
        if let Err(e) = done {
            tracing::warn!(token = token_id, error = %e, "recording a token's last use failed");
        }
    }

    /// The tokens of user `user_id` (revoked ones too), oldest first. Never their hashes.
    pub async fn list_tokens(&self, user_id: &str) -> StoreResult<Vec<TokenRow>> {
        Ok(sqlx::query_as(
            "SELECT id, user_id, label, scopes, parent_token_id, created_at, last_used_at, revoked_at
             FROM tokens WHERE user_id = $1 ORDER BY id",
        )
        .bind(user_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// The token with row id `token_id`, whoever owns it.
    pub async fn token_by_id(&self, token_id: &str) -> StoreResult<Option<TokenRow>> {
        Ok(sqlx::query_as(
            "SELECT id, user_id, label, scopes, parent_token_id, created_at, last_used_at, revoked_at
             FROM tokens WHERE id = $1",
        )
        .bind(token_id)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Of `token_ids`, the ones that still authenticate: not revoked, and of a user that
    /// exists — what [`Store::identity_by_token`] accepts, read from the store (never from the
    /// identity cache), for many tokens in one statement. Open streams and the MCP server's
    /// grants through elicitation re-check their token with it ([`crate::revocation`]).
    pub async fn valid_token_ids(&self, token_ids: &[&str]) -> StoreResult<std::collections::HashSet<String>> {
        if token_ids.is_empty() {
            return Ok(std::collections::HashSet::new());
        }
        let among = match self.backend {
            super::Backend::Sqlite => "IN (SELECT value FROM json_each($1))",
            super::Backend::Postgres => "= ANY(ARRAY(SELECT json_array_elements_text($1::json)))",
        };
        let ids: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT t.id FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.revoked_at IS NULL AND t.id {among}"
        )))
        .bind(serde_json::to_string(token_ids)?)
        .fetch_all(self.pool())
        .await?;
        Ok(ids.into_iter().collect())
    }

    /// Number of tokens of user `user_id` that are not revoked.
    pub async fn count_active_tokens(&self, user_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tokens WHERE user_id = $1 AND revoked_at IS NULL")
            .bind(user_id)
            .fetch_one(self.pool())
            .await?)
    }

    /// Adds a token (given as its SHA-256 hex) to user `user_id`, labelled `label`, holding
    /// `scopes`, made by token `parent_token_id` (revoking that token revokes this one,
    /// [`Store::revoke_token`]). The caller checks that `scopes` are the parent's or fewer.
    /// None when the parent is revoked (also by a revocation that raced this: the parent's
    /// row is locked first, see [`Store::revoke_token_tree`]).
    pub async fn create_token(
        &self,
        user_id: &str,
        label: &str,
        token_sha256: &str,
        scopes: Scopes,
        parent_token_id: Option<&str>,
    ) -> StoreResult<Option<TokenRow>> {
        let row = TokenRow {
            id: ids::new_id("tok"),
            user_id: user_id.to_owned(),
            label: label.to_owned(),
            scopes,
            parent_token_id: parent_token_id.map(str::to_owned),
            created_at: ids::now(),
            last_used_at: None,
            revoked_at: None,
        };
        let mut tx = self.begin_write().await?;
        if let Some(parent) = parent_token_id {
            // A no-op update: locks the parent's row while it is still valid.
            let valid = sqlx::query("UPDATE tokens SET revoked_at = NULL WHERE id = $1 AND revoked_at IS NULL")
                .bind(parent)
                .execute(tx.conn())
                .await?;
            if valid.rows_affected() != 1 {
                return Ok(None);
            }
        }
        sqlx::query(
            "INSERT INTO tokens (id, user_id, token_sha256, label, created_at, scopes, parent_token_id)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&row.id)
        .bind(user_id)
        .bind(token_sha256)
        .bind(&row.label)
        .bind(&row.created_at)
        .bind(scopes.stored())
        .bind(&row.parent_token_id)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(Some(row))
    }
}

/// How precisely `tokens.last_used_at` follows use: it is rewritten once it is older than this.
pub const LAST_USED_PRECISION: chrono::Duration = chrono::Duration::seconds(60);

/// A token's identity with its stored last use (read together on a cache miss).
#[derive(sqlx::FromRow)]
struct IdentityRow {
    #[sqlx(flatten)]
    identity: TokenIdentity,
    last_used_at: Option<String>,
}

/// A stored token, without its hash.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct TokenRow {
    /// `tok_…`
    pub id: String,
    /// The user it authenticates.
    pub user_id: String,
    /// Its label (`initial` for a user's first token).
    pub label: String,
    /// What it may do: `plan`, `approve`, `manage` (a user's first token, and every token
    /// made before scopes existed, holds all three).
    #[sqlx(try_from = "String")]
    #[schema(value_type = Vec<crate::auth::Scope>)]
    pub scopes: Scopes,
    /// `tok_…`: the token that made this one (`POST /v1/tokens`); revoking that token
    /// revoked this one too. Null for a user's first token and tokens made before scopes.
    pub parent_token_id: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339: when it last authenticated a request, to the minute
    /// ([`LAST_USED_PRECISION`]); null when not used since this was recorded.
    pub last_used_at: Option<String>,
    /// RFC 3339: when it was revoked; null while it is valid.
    pub revoked_at: Option<String>,
}

impl Store {
    /// Whether user `user_id` exists and may decide another user's four-eyes approval (an
    /// admin or an approver). For the harness's gate, which re-checks the stored decider.
    pub async fn may_second(&self, user_id: &str) -> StoreResult<bool> {
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM users WHERE id = $1 AND (is_admin <> 0 OR is_approver <> 0)")
                .bind(user_id)
                .fetch_one(self.pool())
                .await?;
        Ok(n > 0)
    }
}
