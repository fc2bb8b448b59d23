//! External MCP servers, their connection state, discovered tools and agent-access
//! switches (migration 0007).

use std::collections::{HashMap, HashSet};

use super::{Backend, Store, StoreResult};
use crate::ids;
use crate::state::{Flag, McpConnectionState, McpOwnerState, McpToolStatus, OptionalFlag};

/// Most `removed` tools kept per server ([`Store::replace_mcp_tools`]): the most recently
/// removed, which explain a projected id that is gone (`mcp_tool_removed`).
pub const MAX_REMOVED_TOOLS_KEPT: usize = 1_000;

/// An installed server (`mcp_servers`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct McpServerRow {
    /// `mcp_…`
    pub id: String,
    /// Owner; None = deployment-wide.
    pub owner_id: Option<String>,
    /// Who installed it.
    pub installed_by: String,
    /// Display name.
    pub name: String,
    /// `stdio` or `http`.
    pub transport: String,
    /// Transport JSON without secret values.
    pub config: String,
    /// Sealed secret values (base64), if any.
    pub secrets: Option<String>,
    /// Id of the key that sealed `secrets`.
    pub secrets_key_id: Option<String>,
    /// Disclaimer text shown before the tools may be used.
    pub disclaimer: Option<String>,
    /// RFC 3339, when the disclaimer was accepted.
    pub disclaimer_accepted_at: Option<String>,
    /// Who accepted it.
    pub disclaimer_accepted_by: Option<String>,
    /// The server is enabled.
    #[sqlx(try_from = "Flag")]
    pub enabled: bool,
    /// Tools without their own switch have agent access.
    #[sqlx(try_from = "Flag")]
    pub default_agent_access: bool,
    /// Timeout of each request to the server, ms.
    pub request_timeout_ms: i64,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// The last known connection of a server (`mcp_connections`).
#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct McpConnectionRow {
    /// The server.
    pub server_id: String,
    /// Where the connection stands.
    pub state: McpConnectionState,
    /// Negotiated protocol version.
    pub protocol_version: Option<String>,
    /// Server implementation info (JSON).
    pub server_info: Option<String>,
    /// Server capabilities (JSON).
    pub capabilities: Option<String>,
    /// Last error sentence.
    pub last_error: Option<String>,
    /// Tail of a stdio server's stderr.
    pub stderr_tail: Option<String>,
    /// Connection attempts since the last success.
    pub attempts: i64,
    /// RFC 3339 of the last successful handshake.
    pub connected_at: Option<String>,
    /// RFC 3339 of the last successful `tools/list`.
    pub discovered_at: Option<String>,
    /// Why the last discovery failed.
    pub discovery_error: Option<String>,
    /// RFC 3339.
    pub updated_at: String,
}

/// A discovered tool (`mcp_tools`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct McpToolRow {
    /// The server.
    pub server_id: String,
    /// Tool name as listed.
    pub name: String,
    /// What the last listing said about it.
    pub status: McpToolStatus,
    /// Why it was rejected.
    pub rejection: Option<String>,
    /// Title.
    pub title: Option<String>,
    /// Description.
    pub description: Option<String>,
    /// inputSchema JSON.
    pub input_schema: Option<String>,
    /// outputSchema JSON.
    pub output_schema: Option<String>,
    /// annotations JSON.
    pub annotations: Option<String>,
    /// RFC 3339 of the first listing that reported it as it is now (a re-listing with the
    /// same definition keeps it).
    pub discovered_at: String,
    /// RFC 3339 of the listing that no longer had it.
    pub removed_at: Option<String>,
    /// Dialect the inputSchema compiled as (`draft-04` … `2020-12`; migration 0010).
    pub schema_dialect: Option<String>,
    /// True when the schema declared its dialect in `$schema` (None without a dialect).
    #[sqlx(try_from = "OptionalFlag")]
    pub schema_declared: Option<bool>,
    /// Why the inputSchema compiles in no dialect (the tool is `schema_unusable`).
    pub schema_problem: Option<String>,
    /// The definition (JSON) that had agent access before a re-discovery changed it; set
    /// while the change waits for the owner's review.
    pub review_previous: Option<String>,
    /// RFC 3339, when the change under review was seen.
    pub review_since: Option<String>,
}

/// What a listing changes of a server's stored tools ([`Store::replace_mcp_tools`]).
struct ListingChange<'a> {
    /// Names stored (not removed) that the listing no longer has.
    gone: Vec<&'a str>,
    /// Listed rows that are new, were removed, or whose definition changed.
    written: Vec<&'a McpToolRow>,
}

impl<'a> ListingChange<'a> {
    /// The change from `stored` (the server's rows that are not `removed`) to `listed`; None
    /// when there is none.
    fn of(stored: &'a [McpToolRow], listed: &'a [McpToolRow]) -> Option<Self> {
        let listed_names: HashSet<&str> = listed.iter().map(|t| t.name.as_str()).collect();
        let gone: Vec<&str> =
            stored.iter().map(|t| t.name.as_str()).filter(|name| !listed_names.contains(name)).collect();
        let current: HashMap<&str, &McpToolRow> = stored.iter().map(|t| (t.name.as_str(), t)).collect();
        let written: Vec<&McpToolRow> =
            listed.iter().filter(|t| !current.get(t.name.as_str()).is_some_and(|old| old.same_definition(t))).collect();
        (!gone.is_empty() || !written.is_empty()).then_some(ListingChange { gone, written })
    }
}

impl McpToolRow {
    /// Whether `other` says the same of the tool as this row: every field but the server,
    /// the name and the two times (what a re-listing of an unchanged tool would write).
    pub fn same_definition(&self, other: &McpToolRow) -> bool {
        // Destructured whole, so that a new field must be placed on one side or the other.
        let McpToolRow {
            server_id: _,
            name: _,
            status,
            rejection,
            title,
            description,
            input_schema,
            output_schema,
            annotations,
            discovered_at: _,
            removed_at: _,
            schema_dialect,
            schema_declared,
            schema_problem,
            review_previous,
            review_since,
        } = self;
        *status == other.status
            && *rejection == other.rejection
            && *title == other.title
            && *description == other.description
            && *input_schema == other.input_schema
            && *output_schema == other.output_schema
            && *annotations == other.annotations
            && *schema_dialect == other.schema_dialect
            && *schema_declared == other.schema_declared
            && *schema_problem == other.schema_problem
            && *review_previous == other.review_previous
            && *review_since == other.review_since
    }
}

/// An agent-access switch (`mcp_agent_access`).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct McpAccessRow {
    /// The server.
    pub server_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Agent access on.
    #[sqlx(try_from = "Flag")]
    pub enabled: bool,
    /// Who set it.
    pub updated_by: String,
    /// RFC 3339.
    pub updated_at: String,
}

impl Store {
    /// Whether user `id` exists and is an admin now (an MCP server's `from_env` references
    /// are read only when its installer is).
    pub async fn user_is_admin(&self, id: &str) -> StoreResult<bool> {
        let row: Option<(i64,)> =
            sqlx::query_as("SELECT is_admin FROM users WHERE id = $1").bind(id).fetch_optional(self.pool()).await?;
        Ok(row.is_some_and(|(a,)| a != 0))
    }

    /// Stores a newly installed server with a `disconnected` connection row.
    pub async fn insert_mcp_server(&self, row: &McpServerRow) -> StoreResult<()> {
        self.insert_mcp_server_held(row, None).await
    }

    /// [`Store::insert_mcp_server`], and for a stdio server installed on a replica, its
    /// owner row `held` by `(node id, process id)` in the same transaction: no other replica
    /// sees the server before it has its owner.
    pub async fn insert_mcp_server_held(&self, row: &McpServerRow, holder: Option<(&str, &str)>) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        sqlx::query(
            "INSERT INTO mcp_servers (id, owner_id, installed_by, name, transport, config, secrets, secrets_key_id,
                disclaimer, disclaimer_accepted_at, disclaimer_accepted_by, enabled, default_agent_access,
                request_timeout_ms, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        )
        .bind(&row.id)
        .bind(&row.owner_id)
        .bind(&row.installed_by)
        .bind(&row.name)
        .bind(&row.transport)
        .bind(&row.config)
        .bind(&row.secrets)
        .bind(&row.secrets_key_id)
        .bind(&row.disclaimer)
        .bind(&row.disclaimer_accepted_at)
        .bind(&row.disclaimer_accepted_by)
        .bind(i64::from(row.enabled))
        .bind(i64::from(row.default_agent_access))
        .bind(row.request_timeout_ms)
        .bind(&row.created_at)
        .bind(&row.updated_at)
        .execute(tx.conn())
        .await?;
        sqlx::query(
            "INSERT INTO mcp_connections (server_id, state, attempts, updated_at) VALUES ($1, 'disconnected', 0, $2)",
        )
        .bind(&row.id)
        .bind(&row.created_at)
        .execute(tx.conn())
        .await?;
        if let Some((node_id, process_id)) = holder {
            sqlx::query(
                "INSERT INTO mcp_owners (server_id, node_id, process_id, state, since) VALUES ($1, $2, $3, 'held', $4)",
            )
            .bind(&row.id)
            .bind(node_id)
            .bind(process_id)
            .bind(&row.created_at)
            .execute(tx.conn())
            .await?;
        }
        tx.commit().await
    }

    /// Every installed server, oldest first.
    pub async fn all_mcp_servers(&self) -> StoreResult<Vec<McpServerRow>> {
        Ok(sqlx::query_as("SELECT * FROM mcp_servers ORDER BY id").fetch_all(self.pool()).await?)
    }

    /// One server.
    pub async fn mcp_server(&self, id: &str) -> StoreResult<Option<McpServerRow>> {
        Ok(sqlx::query_as("SELECT * FROM mcp_servers WHERE id = $1").bind(id).fetch_optional(self.pool()).await?)
    }

    /// Updates the switches of a server (enabled, default access, timeout, disclaimer
    /// acceptance) to the values in `row`.
    pub async fn update_mcp_server(&self, row: &McpServerRow) -> StoreResult<()> {
        sqlx::query(
            "UPDATE mcp_servers SET enabled = $2, default_agent_access = $3, request_timeout_ms = $4,
                disclaimer_accepted_at = $5, disclaimer_accepted_by = $6, updated_at = $7 WHERE id = $1",
        )
        .bind(&row.id)
        .bind(i64::from(row.enabled))
        .bind(i64::from(row.default_agent_access))
        .bind(row.request_timeout_ms)
        .bind(&row.disclaimer_accepted_at)
        .bind(&row.disclaimer_accepted_by)
        .bind(&row.updated_at)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Removes a server with its connection, tools and access switches.
    pub async fn delete_mcp_server(&self, id: &str) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        self.lock_mcp_tools(&mut tx, id).await?;
        for sql in [
            "DELETE FROM mcp_owners WHERE server_id = $1",
            "DELETE FROM mcp_agent_access WHERE server_id = $1",
            "DELETE FROM mcp_tools WHERE server_id = $1",
            "DELETE FROM mcp_connections WHERE server_id = $1",
            "DELETE FROM mcp_servers WHERE id = $1",
        ] {
            sqlx::query(sql).bind(id).execute(tx.conn()).await?;
        }
        tx.commit().await
    }

    /// The connection row of a server.
    pub async fn mcp_connection(&self, server_id: &str) -> StoreResult<Option<McpConnectionRow>> {
        Ok(sqlx::query_as("SELECT * FROM mcp_connections WHERE server_id = $1")
            .bind(server_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Stores the connection row (insert or replace).
    pub async fn save_mcp_connection(&self, c: &McpConnectionRow) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO mcp_connections (server_id, state, protocol_version, server_info, capabilities, last_error,
                stderr_tail, attempts, connected_at, discovered_at, discovery_error, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
             ON CONFLICT (server_id) DO UPDATE SET state = excluded.state,
                protocol_version = excluded.protocol_version, server_info = excluded.server_info,
                capabilities = excluded.capabilities, last_error = excluded.last_error,
                stderr_tail = excluded.stderr_tail, attempts = excluded.attempts,
                connected_at = excluded.connected_at, discovered_at = excluded.discovered_at,
                discovery_error = excluded.discovery_error, updated_at = excluded.updated_at",
        )
        .bind(&c.server_id)
        .bind(c.state)
        .bind(&c.protocol_version)
        .bind(&c.server_info)
        .bind(&c.capabilities)
        .bind(&c.last_error)
        .bind(&c.stderr_tail)
        .bind(c.attempts)
        .bind(&c.connected_at)
        .bind(&c.discovered_at)
        .bind(&c.discovery_error)
        .bind(ids::now())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// The tools recorded for a server, by name.
    pub async fn mcp_tools(&self, server_id: &str) -> StoreResult<Vec<McpToolRow>> {
        Ok(sqlx::query_as("SELECT * FROM mcp_tools WHERE server_id = $1 ORDER BY name")
            .bind(server_id)
            .fetch_all(self.pool())
            .await?)
    }

    /// Replaces a server's tool list with a new listing in one transaction: listed tools
    /// that are new or whose definition changed are upserted (a row listed as it is stored
    /// is not written, and keeps its `discovered_at`), earlier tools missing from it become
    /// `removed`, and of the removed ones only the [`MAX_REMOVED_TOOLS_KEPT`] most recently
    /// removed stay (a server that renames its tools at every listing would otherwise grow
    /// its rows without end). A listing that changes nothing writes nothing and does not
    /// take the writer (on SQLite the one writer is everyone's, and a server may be
    /// re-listed every 2 s). On Postgres replacements of one server's tools (each replica
    /// discovers a Streamable HTTP server itself) take a transaction-scoped advisory lock
    /// on the server first, so one compares against what the other wrote, never a mix.
    pub async fn replace_mcp_tools(&self, server_id: &str, listed: &[McpToolRow]) -> StoreResult<()> {
        const CURRENT: &str = "SELECT * FROM mcp_tools WHERE server_id = $1 AND status <> 'removed'";
        let stored: Vec<McpToolRow> = sqlx::query_as(CURRENT).bind(server_id).fetch_all(self.pool()).await?;
        if ListingChange::of(&stored, listed).is_none() {
            return Ok(());
        }
        let now = ids::now();
        let mut tx = self.begin_write().await?;
        self.lock_mcp_tools(&mut tx, server_id).await?;
        let stored: Vec<McpToolRow> = sqlx::query_as(CURRENT).bind(server_id).fetch_all(tx.conn()).await?;
        let Some(change) = ListingChange::of(&stored, listed) else {
            return tx.commit().await;
        };
        let gone = change.gone;
        if !gone.is_empty() {
            let names = match self.backend() {
                Backend::Sqlite => "SELECT value FROM json_each($3)",
                Backend::Postgres => "SELECT json_array_elements_text($3::json)",
            };
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE mcp_tools SET status = 'removed', removed_at = $2 WHERE server_id = $1 AND name IN ({names})"
            )))
            .bind(server_id)
            .bind(&now)
            .bind(serde_json::Value::from(gone.clone()).to_string())
            .execute(tx.conn())
            .await?;
        }
        for t in change.written {
            sqlx::query(
                "INSERT INTO mcp_tools (server_id, name, status, rejection, title, description, input_schema,
                    output_schema, annotations, discovered_at, removed_at, schema_dialect, schema_declared,
                    schema_problem, review_previous, review_since)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, $11, $12, $13, $14, $15)
                 ON CONFLICT (server_id, name) DO UPDATE SET status = excluded.status, rejection = excluded.rejection,
                    title = excluded.title, description = excluded.description, input_schema = excluded.input_schema,
                    output_schema = excluded.output_schema, annotations = excluded.annotations,
                    discovered_at = excluded.discovered_at, removed_at = NULL,
                    schema_dialect = excluded.schema_dialect, schema_declared = excluded.schema_declared,
                    schema_problem = excluded.schema_problem, review_previous = excluded.review_previous,
                    review_since = excluded.review_since",
            )
            .bind(server_id)
            .bind(&t.name)
            .bind(t.status)
            .bind(&t.rejection)
            .bind(&t.title)
            .bind(&t.description)
            .bind(&t.input_schema)
            .bind(&t.output_schema)
            .bind(&t.annotations)
            .bind(&t.discovered_at)
            .bind(&t.schema_dialect)
            .bind(t.schema_declared.map(i64::from))
            .bind(&t.schema_problem)
            .bind(&t.review_previous)
            .bind(&t.review_since)
            .execute(tx.conn())
            .await?;
        }
        if !gone.is_empty() {
            sqlx::query(
                "DELETE FROM mcp_tools WHERE server_id = $1 AND status = 'removed' AND name NOT IN (
                     SELECT name FROM mcp_tools WHERE server_id = $1 AND status = 'removed'
                     ORDER BY removed_at DESC, name LIMIT $2)",
            )
            .bind(server_id)
            .bind(i64::try_from(MAX_REMOVED_TOOLS_KEPT).unwrap_or(i64::MAX))
            .execute(tx.conn())
            .await?;
        }
        tx.commit().await
    }

    /// On Postgres, takes the transaction-scoped advisory lock on a server's tool rows that
    /// every writer of a whole listing takes first (a re-listing, the server's removal), so
    /// two never interleave; SQLite's one writer needs none. Namespace 1835627106 ("mcp
    /// tools"; 1835627105 is the runs' event chains).
    async fn lock_mcp_tools(&self, tx: &mut super::WriteTx, server_id: &str) -> StoreResult<()> {
        if self.backend() == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock(1835627106, hashtext($1))")
                .bind(server_id)
                .execute(tx.conn())
                .await?;
        }
        Ok(())
    }

    /// The agent-access switches of a server.
    pub async fn mcp_access(&self, server_id: &str) -> StoreResult<Vec<McpAccessRow>> {
        Ok(sqlx::query_as("SELECT * FROM mcp_agent_access WHERE server_id = $1 ORDER BY tool_name")
            .bind(server_id)
            .fetch_all(self.pool())
            .await?)
    }

    /// Sets one tool's agent-access switch; turning it on also ends a pending definition
    /// review of the tool (the owner accepts the definition now listed), in one transaction.
    pub async fn set_mcp_access(&self, server_id: &str, tool: &str, enabled: bool, by: &str) -> StoreResult<()> {
        let mut tx = self.begin_write().await?;
        if enabled {
            sqlx::query(
                "UPDATE mcp_tools SET review_previous = NULL, review_since = NULL WHERE server_id = $1 AND name = $2",
            )
            .bind(server_id)
            .bind(tool)
            .execute(tx.conn())
            .await?;
        }
        sqlx::query(
            "INSERT INTO mcp_agent_access (server_id, tool_name, enabled, updated_by, updated_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (server_id, tool_name) DO UPDATE SET enabled = excluded.enabled,
                updated_by = excluded.updated_by, updated_at = excluded.updated_at",
        )
        .bind(server_id)
        .bind(tool)
        .bind(i64::from(enabled))
        .bind(by)
        .bind(ids::now())
        .execute(tx.conn())
        .await?;
        tx.commit().await
    }
}

/// The replica holding a stdio MCP server's process (`mcp_owners`, migration 0019).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct McpOwnerRow {
    /// `mcp_…`
    pub server_id: String,
    /// The owner replica's stable node id (its data directory's `node.id`).
    pub node_id: String,
    /// The owner's process id (`<node id>:<uuid>`) that claimed it last.
    pub process_id: String,
    /// `held`, or `lost` once that replica was declared dead.
    pub state: McpOwnerState,
    /// RFC 3339: when this owner claimed it.
    pub since: String,
}

/// How a replica asks for a stdio MCP server's process ([`Store::claim_mcp_owner`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerClaim {
    /// A supervisor about to connect by itself (start, backoff, enable): it gets a server
    /// nobody holds, or one its own replica (node id) holds — never another replica's, and
    /// never its own once `lost`.
    Automatic,
    /// An explicit connect (`POST /v1/mcp/servers/{id}/connect`): also takes a server whose
    /// owner is `lost`, whose replica is `dead`, or whose replica's heartbeat is older than
    /// the given cut-off.
    Explicit,
}

impl Store {
    /// The owner of a stdio MCP server, if any replica ever claimed it.
    pub async fn mcp_owner(&self, server_id: &str) -> StoreResult<Option<McpOwnerRow>> {
        Ok(sqlx::query_as("SELECT * FROM mcp_owners WHERE server_id = $1")
            .bind(server_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Every owner row, by server id.
    pub async fn mcp_owners(&self) -> StoreResult<Vec<McpOwnerRow>> {
        Ok(sqlx::query_as("SELECT * FROM mcp_owners ORDER BY server_id").fetch_all(self.pool()).await?)
    }

    /// Claims stdio MCP server `server_id` for process `process_id` of replica `node_id`
    /// (see [`OwnerClaim`]; `stale_before`, RFC 3339, is the heartbeat cut-off under which
    /// an explicit claim may take another replica's server). Each step is one conditional
    /// statement, so of several replicas claiming at once exactly one holds it afterwards.
    /// Returns true when this process holds it now.
    pub async fn claim_mcp_owner(
        &self,
        server_id: &str,
        node_id: &str,
        process_id: &str,
        how: OwnerClaim,
        stale_before: &str,
    ) -> StoreResult<bool> {
        let now = ids::now();
        let explicit = i64::from(how == OwnerClaim::Explicit);
        sqlx::query(
            "INSERT INTO mcp_owners (server_id, node_id, process_id, state, since) VALUES ($1, $2, $3, 'held', $4)
             ON CONFLICT (server_id) DO NOTHING",
        )
        .bind(server_id)
        .bind(node_id)
        .bind(process_id)
        .bind(&now)
        .execute(self.pool())
        .await?;
        // Its own replica's server (a restart of the same data directory resumes it; a lost
        // one only when asked).
        sqlx::query(
            "UPDATE mcp_owners SET process_id = $1, state = 'held', since = $2
             WHERE server_id = $3 AND node_id = $4 AND process_id <> $1 AND (state = 'held' OR $5 = 1)",
        )
        .bind(process_id)
        .bind(&now)
        .bind(server_id)
        .bind(node_id)
        .bind(explicit)
        .execute(self.pool())
        .await?;
        if how == OwnerClaim::Explicit {
            sqlx::query(
                "UPDATE mcp_owners SET node_id = $1, process_id = $2, state = 'held', since = $3
                 WHERE server_id = $4 AND (node_id = $1 AND state = 'lost' OR node_id <> $1 AND (state = 'lost'
                    OR NOT EXISTS (SELECT 1 FROM replicas r WHERE r.node_id = mcp_owners.node_id
                                   AND r.state = 'alive' AND r.heartbeat_at >= $5)))",
            )
            .bind(node_id)
            .bind(process_id)
            .bind(&now)
            .bind(server_id)
            .bind(stale_before)
            .execute(self.pool())
            .await?;
        }
        Ok(self
            .mcp_owner(server_id)
            .await?
            .is_some_and(|o| o.process_id == process_id && o.state == McpOwnerState::Held))
    }

    /// Marks the stdio servers replica `node_id` held as `lost` (it was declared dead).
    /// Returns how many.
    pub async fn lose_mcp_owners(&self, node_id: &str) -> StoreResult<u64> {
        let done = sqlx::query("UPDATE mcp_owners SET state = 'lost' WHERE node_id = $1 AND state = 'held'")
            .bind(node_id)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}
