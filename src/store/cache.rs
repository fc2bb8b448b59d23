//! The store's short-lived read cache of authenticated tokens.
//!
//! Every API request starts by resolving its bearer token (a join of `tokens` and `users`).
//! Under load that one lookup per request was one of the ~13 round trips of a freeze, so a
//! token that was found valid is remembered for [`IDENTITY_TTL`]:
//!
//! - a token revoked through [`Store::revoke_token`] is forgotten by this process at once
//!   (the revocation takes effect immediately on this replica);
//! - a revocation made by another replica, or by hand in the database, and a change of the
//!   user's roles take effect here within [`IDENTITY_TTL`] (1 s);
//! - unknown or revoked tokens are never cached: a token created a moment ago works at
//!   once, and a wrong token always costs its lookup.
//!
//! The cache holds at most [`IDENTITY_CAPACITY`] tokens (when full it is emptied and starts
//! over), so its memory is bounded whatever the number of clients.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::users::TokenIdentity;
use super::{Store, StoreResult};

/// How long a valid token's identity is reused without reading the store: the bound within
/// which a revocation by another replica (or by hand) takes effect on this one.
pub const IDENTITY_TTL: Duration = Duration::from_secs(1);

/// Most tokens remembered at once.
pub const IDENTITY_CAPACITY: usize = 4096;

/// Identities of recently seen valid tokens, by token hash.
#[derive(Default)]
pub(crate) struct IdentityCache {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_hash: HashMap<String, (TokenIdentity, Instant)>,
    /// Bumped by every revocation: a lookup that started before one does not store what it
    /// read (it may predate the revocation).
    generation: u64,
}

/// Where a lookup started: the time and the revocation generation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadStart {
    at: Instant,
    generation: u64,
}

impl IdentityCache {
    /// The identity behind `token_sha256` when it was read less than [`IDENTITY_TTL`] ago.
    /// The identity behind `token_sha256` when it was read less than [`IDENTITY_TTL`] ago;
    /// otherwise None and where the store read that follows starts.
    pub(crate) fn get(&self, token_sha256: &str) -> Result<TokenIdentity, ReadStart> {
        let entries = self.entries.lock();
        match entries.by_hash.get(token_sha256) {
            Some((identity, read_at)) if read_at.elapsed() < IDENTITY_TTL => Ok(identity.clone()),
            _ => Err(ReadStart { at: Instant::now(), generation: entries.generation }),
        }
    }

    /// Remembers `identity`, read by a lookup that started at `start` (its time, taken
    /// before the read, is the entry's age: it never outlives the bound), unless a
    /// revocation happened since.
    pub(crate) fn put(&self, token_sha256: &str, identity: &TokenIdentity, start: ReadStart) {
        let mut entries = self.entries.lock();
        if entries.generation != start.generation {
            return;
        }
        if entries.by_hash.len() >= IDENTITY_CAPACITY && !entries.by_hash.contains_key(token_sha256) {
            entries.by_hash.retain(|_, (_, at)| at.elapsed() < IDENTITY_TTL);
            if entries.by_hash.len() >= IDENTITY_CAPACITY {
                entries.by_hash.clear();
            }
        }
        entries.by_hash.insert(token_sha256.to_owned(), (identity.clone(), start.at));
    }

    /// Forgets the tokens with row ids `token_ids` (and keeps lookups already under way from
    /// remembering them).
    pub(crate) fn forget_tokens(&self, token_ids: &[String]) {
        let mut entries = self.entries.lock();
        entries.generation += 1;
        entries.by_hash.retain(|_, (identity, _)| !token_ids.contains(&identity.token_id));
    }
}

impl Store {
    /// Revokes the token with row id `token_id` and its descendants — the tokens it made
    /// (`parent_token_id`), the tokens they made, and so on — in one write transaction (sets
    /// `revoked_at`; a revoked token stays revoked), and forgets them in this process's
    /// cache, so that they are refused at once here and within [`IDENTITY_TTL`] on other
    /// replicas. Returns whether `token_id` itself was valid until now.
    pub async fn revoke_token(&self, token_id: &str) -> StoreResult<bool> {
        Ok(self.revoke_token_tree(token_id).await?.iter().any(|id| id == token_id))
    }

    /// [`Store::revoke_token`], answering the ids of every token it revoked now (`token_id`
    /// first when it was valid; tokens revoked before are not repeated).
    ///
    /// The tree is walked from the top, each token revoked before its children are read: the
    /// update locks the token's row, and [`Store::create_token`] locks the parent's row
    /// before adding a child of it, so a token made concurrently from a member of the tree
    /// is either seen here or refused there (on Postgres; SQLite has one writer anyway).
    pub async fn revoke_token_tree(&self, token_id: &str) -> StoreResult<Vec<String>> {
        let now = crate::ids::now();
        let mut tx = self.begin_write().await?;
        let mut revoked = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        let mut todo = vec![token_id.to_owned()];
        while let Some(id) = todo.pop() {
            if seen.contains(&id) {
                continue;
            }
            let done = sqlx::query("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
                .bind(&now)
                .bind(&id)
                .execute(tx.conn())
                .await?;
            let now_revoked = done.rows_affected() == 1;
            if now_revoked {
                revoked.push(id.clone());
            }
            // A token revoked before had its tree revoked with it (and makes nothing since):
            // only the one asked for and those revoked now are looked below, so revoking
            // again never walks every token a user ever made.
            if now_revoked || id == token_id {
                let children: Vec<String> =
                    sqlx::query_scalar("SELECT id FROM tokens WHERE parent_token_id = $1 AND revoked_at IS NULL")
                        .bind(&id)
                        .fetch_all(tx.conn())
                        .await?;
                todo.extend(children);
            }
            seen.push(id);
        }
        tx.commit().await?;
        self.identities.forget_tokens(&seen);
        Ok(revoked)
    }
}
