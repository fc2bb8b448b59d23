//! Users and their bearer tokens (stored as SHA-256 hashes only).

use serde::Serialize;

use super::{Store, StoreResult};
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
        sqlx::query("INSERT INTO tokens (id, user_id, token_sha256, label, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(ids::new_id("tok"))
            .bind(&user.id)
            .bind(token_sha256)
            .bind("initial")
            .bind(&user.created_at)
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
        let identity: Option<TokenIdentity> = sqlx::query_as(
            "SELECT u.id AS user_id, u.name, u.is_admin, u.is_approver, t.id AS token_id
             FROM tokens t JOIN users u ON u.id = t.user_id
             WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL",
        )
        .bind(token_sha256)
        .fetch_optional(self.pool())
        .await?;
        if let Some(identity) = &identity {
            self.identities.put(token_sha256, identity, start);
        }
        Ok(identity)
    }
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
