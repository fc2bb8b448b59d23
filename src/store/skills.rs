//! Storage of skills (`skills`, migration 0027): a skill's private tools and the public
//! tools its manifest allows, per owner. See [`crate::availability::SkillScope`] for what they
//! change on the ladder and in exposures.

use super::{Store, StoreResult};
use crate::ids;

/// A stored skill.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SkillRow {
    /// `skl_…`
    pub id: String,
    /// Owner.
    pub owner_id: String,
    /// Name, unique per owner.
    pub name: String,
    /// What the skill does.
    pub description: String,
    /// JSON array of the tool ids private to the skill.
    pub private_tools: String,
    /// JSON array of the public tool ids its sub-runs may see (`["*"]`: all).
    pub allowed_public: String,
    /// RFC 3339.
    pub created_at: String,
}

impl SkillRow {
    /// The private tool ids (empty when the stored text is not a JSON array of strings).
    pub fn private_tools(&self) -> Vec<String> {
        serde_json::from_str(&self.private_tools).unwrap_or_default()
    }

    /// The allowed public tool ids.
    pub fn allowed_public(&self) -> Vec<String> {
        serde_json::from_str(&self.allowed_public).unwrap_or_default()
    }
}

impl Store {
    /// Creates a skill, unless the owner has `limit` skills already (None, nothing stored).
    /// The count and the insert are one write transaction under the owner's lock
    /// ([`Store::begin_owner_write`]), so concurrent requests never pass the limit together.
    /// A name the owner already uses is a unique violation
    /// ([`super::StoreError::is_unique_violation`]).
    pub async fn create_skill(
        &self,
        owner_id: &str,
        name: &str,
        description: &str,
        private_tools: &[String],
        allowed_public: &[String],
        limit: usize,
    ) -> StoreResult<Option<SkillRow>> {
        let row = SkillRow {
            id: ids::new_id("skl"),
            owner_id: owner_id.to_owned(),
            name: name.to_owned(),
            description: description.to_owned(),
            private_tools: serde_json::to_string(private_tools).unwrap_or_else(|_| "[]".into()),
            allowed_public: serde_json::to_string(allowed_public).unwrap_or_else(|_| "[]".into()),
            created_at: ids::now(),
        };
        let (_turn, mut tx) = self.begin_owner_write(owner_id).await?;
        let owned: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM skills WHERE owner_id = $1")
            .bind(owner_id)
            .fetch_one(tx.conn())
            .await?;
        if usize::try_from(owned).unwrap_or(usize::MAX) >= limit {
            tx.commit().await?;
            return Ok(None);
        }
        sqlx::query(
            "INSERT INTO skills (id, owner_id, name, description, private_tools, allowed_public, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(&row.id)
        .bind(&row.owner_id)
        .bind(&row.name)
        .bind(&row.description)
        .bind(&row.private_tools)
        .bind(&row.allowed_public)
        .bind(&row.created_at)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(Some(row))
    }

    /// The owner's skill, or None (also for another user's skill).
    pub async fn skill_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<SkillRow>> {
        Ok(sqlx::query_as("SELECT * FROM skills WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// The owner's skills by name.
    pub async fn list_skills(&self, owner_id: &str) -> StoreResult<Vec<SkillRow>> {
        Ok(sqlx::query_as("SELECT * FROM skills WHERE owner_id = $1 ORDER BY name")
            .bind(owner_id)
            .fetch_all(self.pool())
            .await?)
    }
}
