//! The tool embedding cache (`tool_embeddings`, migration 0004): vectors keyed by
//! (model id, SHA-256 of the tool text).

use base64::Engine;

use super::{Backend, Store, StoreError, StoreResult};
use crate::ids;
use crate::state::VectorKind;

/// How much of a task learning from use reads ([`Store::accepted_uses`], [`task_key`]), in
/// characters: all-MiniLM-L6-v2 reads at most 256 tokens, about a thousand characters.
pub const TASK_PREFIX_CHARS: usize = 2048;

/// The key of a user's past task's vector in this cache (learning from use,
/// [`crate::exposure::usage`]): the SHA-256 (hex) of `task`, the owner, and the task's first
/// [`TASK_PREFIX_CHARS`] characters, each followed by a newline. The owner keeps one user's
/// vectors apart from another's (no user can tell by timing whether another already
/// embedded a task); the prefix keeps a task from sharing a key with a tool text.
pub fn task_key(owner_id: &str, task: &str) -> String {
    let prefix: String = task.chars().take(TASK_PREFIX_CHARS).collect();
    mira_core::evidence::sha256_hex(format!("task\n{owner_id}\n{prefix}").as_bytes())
}

/// Most keys looked up in one statement.
const LOOKUP_CHUNK: usize = 200;

impl Store {
    /// The cached vectors of `model_id` for the given text hashes, as (hash, vector) pairs;
    /// hashes without a row are left out. A row that does not decode is `Corrupt`.
    pub async fn tool_vectors(&self, model_id: &str, text_sha256: &[String]) -> StoreResult<Vec<(String, Vec<f32>)>> {
        let mut out = Vec::new();
        for chunk in text_sha256.chunks(LOOKUP_CHUNK) {
            let placeholders: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
            let sql = format!(
                "SELECT text_sha256, dim, vector FROM tool_embeddings WHERE model_id = $1 AND text_sha256 IN ({})",
                placeholders.join(", ")
            );
            let mut q = sqlx::query_as::<_, (String, i64, String)>(sqlx::AssertSqlSafe(sql)).bind(model_id);
            for sha in chunk {
                q = q.bind(sha);
            }
            for (sha, dim, vector) in q.fetch_all(self.pool()).await? {
                out.push((sha, decode_vector(&vector, dim)?));
            }
        }
        Ok(out)
    }

    /// Stores vectors of `model_id` keyed by text hash, as vectors of `kind`; a key that is
    /// already stored (by this or another replica) keeps its row.
    pub async fn put_tool_vectors(
        &self,
        model_id: &str,
        kind: VectorKind,
        rows: &[(String, Vec<f32>)],
    ) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        let now = ids::now();
        for (sha, vector) in rows {
            sqlx::query(
                "INSERT INTO tool_embeddings (model_id, text_sha256, dim, vector, created_at, kind) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (model_id, text_sha256) DO NOTHING",
            )
            .bind(model_id)
            .bind(sha)
            .bind(i64::try_from(vector.len()).unwrap_or(i64::MAX))
            .bind(encode_vector(vector))
            .bind(&now)
            .bind(kind.as_str())
            .execute(tx.conn())
            .await?;
        }
        tx.commit().await
    }

    /// Deletes the tool vectors of `model_id` — rows of kind `tool`, and rows stored before
    /// kinds were kept (migration 0029) — whose text hash is not in `live` and that were
    /// stored before `cutoff` (RFC 3339). Task vectors and other models' rows stay. Returns
    /// how many rows went. A row another replica still holds in its index costs that replica
    /// one embedding after its next restart, nothing before: the rows are a cache.
    pub async fn sweep_tool_vectors(&self, model_id: &str, live: &[String], cutoff: &str) -> StoreResult<u64> {
        let live_rows = match self.backend() {
            Backend::Sqlite => "SELECT value FROM json_each($2)",
            Backend::Postgres => "SELECT json_array_elements_text($2::json)",
        };
        let sql = format!(
            "DELETE FROM tool_embeddings WHERE model_id = $1 AND created_at < $3 AND (kind IS NULL OR kind = $4) \
             AND text_sha256 NOT IN ({live_rows})"
        );
        let mut tx = self.begin_write().await?;
        let removed = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(model_id)
            .bind(serde_json::Value::from(live.to_vec()).to_string())
            .bind(cutoff)
            .bind(VectorKind::Tool.as_str())
            .execute(tx.conn())
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(removed)
    }

    /// Number of vectors cached for `model_id`.
    pub async fn count_tool_vectors(&self, model_id: &str) -> StoreResult<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tool_embeddings WHERE model_id = $1")
            .bind(model_id)
            .fetch_one(self.pool())
            .await?)
    }
}

/// Standard base64 of the little-endian f32 bytes.
fn encode_vector(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn decode_vector(text: &str, dim: i64) -> StoreResult<Vec<f32>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| StoreError::Corrupt(format!("tool_embeddings.vector: {e}")))?;
    if bytes.len() % 4 != 0 || i64::try_from(bytes.len() / 4).ok() != Some(dim) {
        return Err(StoreError::Corrupt(format!(
            "tool_embeddings.vector has {} bytes for dimension {dim}",
            bytes.len()
        )));
    }
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip() {
        let v = vec![0.5f32, -1.25, 3.0e-7, f32::MAX];
        assert_eq!(decode_vector(&encode_vector(&v), 4).unwrap(), v);
        assert!(decode_vector(&encode_vector(&v), 3).is_err());
    }
}
