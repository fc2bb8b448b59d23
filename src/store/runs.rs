//! Devices, workspaces, runs and turns.

use serde::Serialize;

use super::{Store, StoreResult};
use crate::events::EventKind;
use crate::ids;

/// Most host workspaces a non-admin may hold (each is indexed and watched by the server):
/// one more is 409 `workspace_limit`.
pub const MAX_HOST_WORKSPACES_PER_USER: i64 = 64;

/// Why a non-admin's host workspace registration stored nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationRefused {
    /// The folder is, holds or lies in another user's or a deployment-wide workspace.
    Overlaps,
    /// The owner holds [`MAX_HOST_WORKSPACES_PER_USER`] host workspaces already.
    AtLimit,
}

/// This process's turn of host workspace registrations ([`Store::create_workspace`]): they
/// wait for it before taking a database connection, so a burst of registrations never holds
/// the pool's connections waiting on the advisory lock.
static WORKSPACE_REGISTRATION: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A device a user's work can run on.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct DeviceRow {
    /// `dev_…`
    pub id: String,
    /// Owner.
    pub owner_id: String,
    /// Display name.
    pub name: String,
    /// JSON array of capability strings.
    pub capabilities: String,
    /// RFC 3339.
    pub created_at: String,
    /// The runner's Ed25519 public key (hex) once enrolled.
    pub public_key: Option<String>,
    /// SHA-256 (hex) of the pending one-time enrollment code; never shown.
    #[serde(skip)]
    pub enroll_code_sha256: Option<String>,
    /// When the pending enrollment code expires (RFC 3339).
    pub enroll_expires_at: Option<String>,
    /// When the runner enrolled (RFC 3339).
    pub enrolled_at: Option<String>,
    /// When the device was revoked (RFC 3339); a revoked device is refused for good.
    pub revoked_at: Option<String>,
    /// The last heartbeat of its runner (RFC 3339).
    pub last_seen_at: Option<String>,
    /// What the runner advertised when it last connected (JSON of
    /// `mira_core::remote::Advertised`).
    pub advertised: Option<String>,
    /// The replica (stable node id) that holds the runner's live connection, if any.
    #[serde(skip)]
    pub holder_node_id: Option<String>,
    /// The process of that replica which holds it (`<node id>:<uuid>`).
    #[serde(skip)]
    pub holder_process_id: Option<String>,
    /// SHA-256 (hex) of the live connection's session token; never shown.
    #[serde(skip)]
    pub session_sha256: Option<String>,
}

/// A workspace: a root folder on a device (the server host when `device_id` is NULL).
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct WorkspaceRow {
    /// `ws_…`
    pub id: String,
    /// NULL for deployment-wide workspaces.
    pub owner_id: Option<String>,
    /// Display name (`default` for the one given to `mira serve --workspace`).
    pub name: String,
    /// Absolute root path on its device.
    pub path: String,
    /// The device holding the folder; NULL = the server host.
    pub device_id: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// The root folder's identity, `"<dev>:<ino>"` ([`crate::workspace::RootIdentity`]),
    /// recorded at registration; NULL only on rows from before it was recorded.
    pub root_identity: Option<String>,
    /// When `root_identity` was recorded (RFC 3339): calls frozen before it are refused.
    pub root_registered_at: Option<String>,
}

/// A run: one agent task in one workspace.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct RunRow {
    /// `run_…`
    pub id: String,
    /// Owner.
    pub owner_id: String,
    /// Workspace the run's paths are relative to.
    pub workspace_id: String,
    /// Device the run works on; NULL = the server host.
    pub device_id: Option<String>,
    /// Optional title.
    pub title: Option<String>,
    /// Last event id handed out.
    pub event_seq: i64,
    /// RFC 3339.
    pub created_at: String,
    /// The skill whose sub-run this is (`skl_…`); NULL for a main run.
    pub skill_id: Option<String>,
}

/// A turn with its stored exposure (JSON text, exactly as returned to the Planner).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TurnRow {
    /// `turn_…`
    pub id: String,
    /// The run.
    pub run_id: String,
    /// Owner.
    pub owner_id: String,
    /// The Planner's task text.
    pub task: String,
    /// Optional extra context used for ranking.
    pub context: Option<String>,
    /// The exposure document.
    pub exposure: String,
    /// RFC 3339.
    pub created_at: String,
}

impl Store {
    /// Creates a device owned by `owner_id`.
    pub async fn create_device(&self, owner_id: &str, name: &str, capabilities: &[String]) -> StoreResult<DeviceRow> {
        let row = DeviceRow {
            id: ids::new_id("dev"),
            owner_id: owner_id.to_owned(),
            name: name.to_owned(),
            capabilities: serde_json::to_string(capabilities)?,
            created_at: ids::now(),
            public_key: None,
            enroll_code_sha256: None,
            enroll_expires_at: None,
            enrolled_at: None,
            revoked_at: None,
            last_seen_at: None,
            advertised: None,
            holder_node_id: None,
            holder_process_id: None,
            session_sha256: None,
        };
        sqlx::query("INSERT INTO devices (id, owner_id, name, capabilities, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(&row.id)
            .bind(&row.owner_id)
            .bind(&row.name)
            .bind(&row.capabilities)
            .bind(&row.created_at)
            .execute(self.pool())
            .await?;
        Ok(row)
    }

    /// The caller's device, or None (also for another user's device).
    pub async fn device_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<DeviceRow>> {
        Ok(sqlx::query_as("SELECT * FROM devices WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// The caller's devices, oldest first.
    pub async fn list_devices(&self, owner_id: &str) -> StoreResult<Vec<DeviceRow>> {
        Ok(sqlx::query_as("SELECT * FROM devices WHERE owner_id = $1 ORDER BY id")
            .bind(owner_id)
            .fetch_all(self.pool())
            .await?)
    }

    /// Registers (or moves) the deployment-wide `default` workspace at `path` with root
    /// identity `identity`. The identity's time is renewed only when the path or the
    /// identity changed, so a restart on the same folder keeps pending calls valid.
    pub async fn upsert_default_workspace(&self, path: &str, identity: &str) -> StoreResult<WorkspaceRow> {
        let mut tx = self.begin_write().await?;
        let existing: Option<WorkspaceRow> =
            sqlx::query_as("SELECT * FROM workspaces WHERE owner_id IS NULL AND name = 'default'")
                .fetch_optional(tx.conn())
                .await?;
        let row = match existing {
            Some(row) if row.path == path && row.root_identity.as_deref() == Some(identity) => row,
            Some(mut row) if row.path == path && row.root_identity.is_none() => {
                // A row from before identities were recorded: adopted as first registered.
                sqlx::query("UPDATE workspaces SET root_identity = $1, root_registered_at = created_at WHERE id = $2")
                    .bind(identity)
                    .bind(&row.id)
                    .execute(tx.conn())
                    .await?;
                row.root_identity = Some(identity.to_owned());
                row.root_registered_at = Some(row.created_at.clone());
                row
            }
            Some(mut row) => {
                let now = ids::now();
                sqlx::query(
                    "UPDATE workspaces SET path = $1, root_identity = $2, root_registered_at = $3 WHERE id = $4",
                )
                .bind(path)
                .bind(identity)
                .bind(&now)
                .bind(&row.id)
                .execute(tx.conn())
                .await?;
                row.path = path.to_owned();
                row.root_identity = Some(identity.to_owned());
                row.root_registered_at = Some(now);
                row
            }
            None => {
                let row = WorkspaceRow {
                    id: ids::new_id("ws"),
                    owner_id: None,
                    name: "default".to_owned(),
                    path: path.to_owned(),
                    device_id: None,
                    created_at: ids::now(),
                    root_identity: Some(identity.to_owned()),
                    root_registered_at: Some(ids::now()),
                };
                sqlx::query(
                    "INSERT INTO workspaces (id, owner_id, name, path, device_id, created_at, root_identity, \
                     root_registered_at) VALUES ($1, NULL, $2, $3, NULL, $4, $5, $6)",
                )
                .bind(&row.id)
                .bind(&row.name)
                .bind(&row.path)
                .bind(&row.created_at)
                .bind(&row.root_identity)
                .bind(&row.root_registered_at)
                .execute(tx.conn())
                .await?;
                row
            }
        };
        tx.commit().await?;
        Ok(row)
    }

    /// Creates a workspace owned by `owner_id` on the server host at the canonical folder
    /// `path`, with root identity `identity`. Every host registration runs in one write
    /// transaction serialised with all the others (this process's turn, then on Postgres a
    /// transaction-scoped advisory lock with a fixed key, namespace 1835627108 "workspace
    /// registration"; SQLite's write transaction is serialised already), so two registrations
    /// of nested folders at once cannot both pass the check. With `exclusive` (a non-admin's
    /// registration) the folder may not be, contain or lie inside another user's host
    /// workspace or a deployment-wide one (every user reads those: a private workspace inside
    /// one would not be private), nor be one by identity (`identity` equal to its recorded
    /// one), and the owner may hold at most [`MAX_HOST_WORKSPACES_PER_USER`] host workspaces:
    /// else nothing is stored and the answer says why. The owner's own workspaces and those
    /// on devices do not count as overlaps.
    pub async fn create_workspace(
        &self,
        owner_id: &str,
        name: &str,
        path: &str,
        identity: &str,
        exclusive: bool,
    ) -> StoreResult<Result<WorkspaceRow, RegistrationRefused>> {
        let _turn = WORKSPACE_REGISTRATION.lock().await;
        let mut tx = self.begin_write().await?;
        if self.backend == super::Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock(1835627108, 0)").execute(tx.conn()).await?;
        }
        if exclusive {
            let held: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM workspaces WHERE device_id IS NULL AND owner_id = $1")
                    .bind(owner_id)
                    .fetch_one(tx.conn())
                    .await?;
            if held >= MAX_HOST_WORKSPACES_PER_USER {
                return Ok(Err(RegistrationRefused::AtLimit));
            }
            let others: Vec<(String, Option<String>)> = sqlx::query_as(
                "SELECT path, root_identity FROM workspaces \
                 WHERE device_id IS NULL AND (owner_id IS NULL OR owner_id <> $1)",
            )
            .bind(owner_id)
            .fetch_all(tx.conn())
            .await?;
            let new = std::path::Path::new(path);
            let overlaps = |(other, other_identity): &(String, Option<String>)| {
                let other = std::path::Path::new(other);
                new.starts_with(other) || other.starts_with(new) || other_identity.as_deref() == Some(identity)
            };
            if others.iter().any(overlaps) {
                return Ok(Err(RegistrationRefused::Overlaps));
            }
        }
        let now = ids::now();
        let row = WorkspaceRow {
            id: ids::new_id("ws"),
            owner_id: Some(owner_id.to_owned()),
            name: name.to_owned(),
            path: path.to_owned(),
            device_id: None,
            created_at: now.clone(),
            root_identity: Some(identity.to_owned()),
            root_registered_at: Some(now),
        };
        sqlx::query(
            "INSERT INTO workspaces (id, owner_id, name, path, device_id, created_at, root_identity, \
             root_registered_at) VALUES ($1, $2, $3, $4, NULL, $5, $6, $7)",
        )
        .bind(&row.id)
        .bind(owner_id)
        .bind(&row.name)
        .bind(&row.path)
        .bind(&row.created_at)
        .bind(&row.root_identity)
        .bind(&row.root_registered_at)
        .execute(tx.conn())
        .await?;
        tx.commit().await?;
        Ok(Ok(row))
    }

    /// Records `identity` as workspace `id`'s root identity, now (an admin re-registered it,
    /// or it had none). Returns the updated row, None when there is no such workspace.
    pub async fn record_root_identity(&self, id: &str, identity: &str) -> StoreResult<Option<WorkspaceRow>> {
        sqlx::query("UPDATE workspaces SET root_identity = $1, root_registered_at = $2 WHERE id = $3")
            .bind(identity)
            .bind(ids::now())
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE id = $1").bind(id).fetch_optional(self.pool()).await?)
    }

    /// Records `identity` for workspace `id` if it has none yet (a row from before identities
    /// were recorded), as of the row's creation, so calls frozen since stay valid. Returns
    /// whether it did.
    pub async fn adopt_root_identity(&self, id: &str, identity: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE workspaces SET root_identity = $1, root_registered_at = created_at \
             WHERE id = $2 AND root_identity IS NULL",
        )
        .bind(identity)
        .bind(id)
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Every workspace on the server host (no device), oldest first.
    pub async fn host_workspaces(&self) -> StoreResult<Vec<WorkspaceRow>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE device_id IS NULL ORDER BY id")
            .fetch_all(self.pool())
            .await?)
    }

    /// Workspaces the caller may use: their own and the deployment-wide ones.
    pub async fn list_workspaces(&self, owner_id: &str) -> StoreResult<Vec<WorkspaceRow>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE owner_id = $1 OR owner_id IS NULL ORDER BY id")
            .bind(owner_id)
            .fetch_all(self.pool())
            .await?)
    }

    /// Paths of the workspaces owned by users other than `owner_id` (what a sandbox of
    /// theirs must not show, wherever they lie).
    pub async fn other_users_workspace_paths(&self, owner_id: &str) -> StoreResult<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT path FROM workspaces WHERE owner_id IS NOT NULL AND owner_id <> $1 ORDER BY path",
        )
        .bind(owner_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// A workspace the caller may use, or None.
    pub async fn workspace_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<WorkspaceRow>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE id = $1 AND (owner_id = $2 OR owner_id IS NULL)")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// Any workspace by id, whoever owns it (for admin actions), or None.
    pub async fn workspace_by_id(&self, id: &str) -> StoreResult<Option<WorkspaceRow>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE id = $1").bind(id).fetch_optional(self.pool()).await?)
    }

    /// The deployment-wide default workspace, if one was registered.
    pub async fn default_workspace(&self) -> StoreResult<Option<WorkspaceRow>> {
        Ok(sqlx::query_as("SELECT * FROM workspaces WHERE owner_id IS NULL AND name = 'default'")
            .fetch_optional(self.pool())
            .await?)
    }

    /// Creates a run.
    pub async fn create_run(
        &self,
        owner_id: &str,
        workspace_id: &str,
        device_id: Option<&str>,
        title: Option<&str>,
        skill_id: Option<&str>,
    ) -> StoreResult<RunRow> {
        let row = RunRow {
            id: ids::new_id("run"),
            owner_id: owner_id.to_owned(),
            workspace_id: workspace_id.to_owned(),
            device_id: device_id.map(str::to_owned),
            title: title.map(str::to_owned),
            event_seq: 0,
            created_at: ids::now(),
            skill_id: skill_id.map(str::to_owned),
        };
        sqlx::query("INSERT INTO runs (id, owner_id, workspace_id, device_id, title, event_seq, created_at, skill_id) VALUES ($1, $2, $3, $4, $5, 0, $6, $7)")
            .bind(&row.id)
            .bind(&row.owner_id)
            .bind(&row.workspace_id)
            .bind(row.device_id.as_deref())
            .bind(row.title.as_deref())
            .bind(&row.created_at)
            .bind(row.skill_id.as_deref())
            .execute(self.pool())
            .await?;
        Ok(row)
    }

    /// The caller's run, or None (also for another user's run).
    pub async fn run_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<RunRow>> {
        Ok(sqlx::query_as("SELECT * FROM runs WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }

    /// The caller's runs, newest first, `limit` at a time after `cursor` (a run id).
    pub async fn list_runs(&self, owner_id: &str, cursor: Option<&str>, limit: i64) -> StoreResult<Vec<RunRow>> {
        Ok(sqlx::query_as(
            "SELECT * FROM runs WHERE owner_id = $1 AND ($2 IS NULL OR id < $2) ORDER BY id DESC LIMIT $3",
        )
        .bind(owner_id)
        // An empty cursor is no cursor (as it always was).
        .bind(cursor.filter(|c| !c.is_empty()))
        .bind(limit)
        .fetch_all(self.pool())
        .await?)
    }

    /// Stores a turn with its exposure and appends `exposure.created`, atomically.
    pub async fn create_turn(
        &self,
        run: &RunRow,
        task: &str,
        context: Option<&str>,
        exposure: &serde_json::Value,
    ) -> StoreResult<TurnRow> {
        let row = TurnRow {
            id: ids::new_id("turn"),
            run_id: run.id.clone(),
            owner_id: run.owner_id.clone(),
            task: task.to_owned(),
            context: context.map(str::to_owned),
            exposure: exposure.to_string(),
            created_at: ids::now(),
        };
        let mut tx = self.begin_write().await?;
        sqlx::query("INSERT INTO turns (id, run_id, owner_id, task, context, exposure, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(&row.id)
            .bind(&row.run_id)
            .bind(&row.owner_id)
            .bind(&row.task)
            .bind(row.context.as_deref())
            .bind(&row.exposure)
            .bind(&row.created_at)
            .execute(tx.conn())
            .await?;
        let summary = serde_json::json!({
            "turn_id": row.id,
            "exposure_sha256": mira_core::chain::json_sha256(exposure),
            "strategy": exposure.get("strategy"),
            "candidate_count": exposure.get("candidate_count"),
            "tool_ids": exposure.get("tools").and_then(|t| t.as_array()).map(|tools| {
                tools.iter().filter_map(|t| t.get("id").cloned()).collect::<Vec<_>>()
            }),
        });
        tx.append_event(&row.run_id, EventKind::ExposureCreated, &summary).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// The caller's turn, or None.
    pub async fn turn_for(&self, owner_id: &str, id: &str) -> StoreResult<Option<TurnRow>> {
        Ok(sqlx::query_as("SELECT * FROM turns WHERE id = $1 AND owner_id = $2")
            .bind(id)
            .bind(owner_id)
            .fetch_optional(self.pool())
            .await?)
    }
}

/// A run read together with its workspace (see [`Store::run_scope_for`]).
#[derive(Debug, Clone)]
pub struct RunScopeRow {
    /// The run.
    pub run: RunRow,
    /// Its workspace, None when the row is gone (or is another user's).
    pub workspace: Option<WorkspaceRow>,
    /// The id of the run's invocation with the call id asked about, if any.
    pub invocation_id: Option<String>,
    /// Whether the run's owner has skills (their private tools change the ladder).
    pub owner_has_skills: bool,
}

/// The joined row of [`Store::run_scope_for`].
#[derive(sqlx::FromRow)]
struct JoinedRunScope {
    r_id: String,
    r_owner_id: String,
    r_workspace_id: String,
    r_device_id: Option<String>,
    r_title: Option<String>,
    r_event_seq: i64,
    r_created_at: String,
    r_skill_id: Option<String>,
    skill_count: i64,
    w_id: Option<String>,
    w_owner_id: Option<String>,
    w_name: Option<String>,
    w_path: Option<String>,
    w_device_id: Option<String>,
    w_created_at: Option<String>,
    w_root_identity: Option<String>,
    w_root_registered_at: Option<String>,
    invocation_id: Option<String>,
}

impl Store {
    /// The caller's run with its workspace (the row [`Store::workspace_for`] gives for the
    /// run's owner) and, when `tool_call_id` is given, the id of the run's invocation with
    /// that call id — one round trip instead of three, for the freeze path and the harness.
    /// None when the run is not the caller's.
    ///
    /// The call id is looked up as [`Store::invocation_by_call`] does, by the unique index
    /// whatever the planner's statistics.
    pub async fn run_scope_for(
        &self,
        owner_id: &str,
        run_id: &str,
        tool_call_id: Option<&str>,
    ) -> StoreResult<Option<RunScopeRow>> {
        let row: Option<JoinedRunScope> = sqlx::query_as(
            "SELECT r.id AS r_id, r.owner_id AS r_owner_id, r.workspace_id AS r_workspace_id,
                    r.device_id AS r_device_id, r.title AS r_title, r.event_seq AS r_event_seq,
                    r.created_at AS r_created_at, r.skill_id AS r_skill_id,
                    (SELECT COUNT(*) FROM skills s WHERE s.owner_id = r.owner_id) AS skill_count,
                    w.id AS w_id, w.owner_id AS w_owner_id, w.name AS w_name, w.path AS w_path,
                    w.device_id AS w_device_id, w.created_at AS w_created_at,
                    w.root_identity AS w_root_identity, w.root_registered_at AS w_root_registered_at,
                    (SELECT i.id FROM invocations i WHERE $3 IS NOT NULL AND i.run_id = r.id AND i.tool_call_id = $3
                         AND (i.run_id, i.tool_call_id) >= (r.id, $3)) AS invocation_id
             FROM runs r
             LEFT JOIN workspaces w ON w.id = r.workspace_id AND (w.owner_id = r.owner_id OR w.owner_id IS NULL)
             WHERE r.id = $1 AND r.owner_id = $2",
        )
        .bind(run_id)
        .bind(owner_id)
        .bind(tool_call_id)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|j| {
            let workspace = match (j.w_id, j.w_name, j.w_path, j.w_created_at) {
                (Some(id), Some(name), Some(path), Some(created_at)) => Some(WorkspaceRow {
                    id,
                    owner_id: j.w_owner_id,
                    name,
                    path,
                    device_id: j.w_device_id,
                    created_at,
                    root_identity: j.w_root_identity,
                    root_registered_at: j.w_root_registered_at,
                }),
                _ => None,
            };
            RunScopeRow {
                run: RunRow {
                    id: j.r_id,
                    owner_id: j.r_owner_id,
                    workspace_id: j.r_workspace_id,
                    device_id: j.r_device_id,
                    title: j.r_title,
                    event_seq: j.r_event_seq,
                    created_at: j.r_created_at,
                    skill_id: j.r_skill_id,
                },
                workspace,
                invocation_id: j.invocation_id,
                owner_has_skills: j.skill_count > 0,
            }
        }))
    }
}
