//! Storage: one interface over SQLite (the embedded default) and Postgres (hosted).
//!
//! Both back-ends run the same SQL through sqlx's `Any` driver: text ids, text RFC 3339
//! times, text JSON and 64-bit integers only, and `$N` placeholders (which SQLite accepts
//! by name). Where the dialects differ (row locking for claims) the statement is chosen by
//! [`Backend`]. Each back-end owns its migrations under `migrations/<backend>/`.
//!
//! Writes that touch several rows go through [`WriteTx`], which on SQLite takes the write
//! lock up front (`BEGIN IMMEDIATE`) so that concurrent writers wait on the busy timeout
//! instead of failing on a lock upgrade, and which broadcasts the events it appended only
//! after the commit succeeded.

/// The end of a Postgres statement that appends events: given a CTE `v` of new events (`run_id,
/// type, data, h` = content hash`, ord, rn` = place among its run's new events), `k` counts
/// each run's events and gathers their hashes, `l` takes one transaction-scoped advisory lock
/// per run in one fixed order (by the lock's key, so two multi-run statements never wait for
/// each other in a cycle), `c` updates the runs' counters — each row lock taken by the update
/// itself — adding each run's count, moving its `last_hash` along the chain
/// (`mira_event_chain`, migration 0026) and keeping the hash it started from in `chain_base`,
/// and `i` inserts the events numbered below each run's new last id with their `prev_hash` and
/// `hash`, `created_at` the parameter `$time`. `c` answers `id, event_seq` (the new last id),
/// `n`, `chain_base`, `chain`. Used by `APPEND_EVENTS_POSTGRES`, `GROUP_WRITE_POSTGRES` and
/// `GRANT_POSTGRES`.
macro_rules! chain_events_postgres {
    ($time:literal) => {
        concat!(
            "
     k AS (SELECT run_id, COUNT(*) AS n, array_agg(h ORDER BY ord) AS hs FROM v GROUP BY run_id),
     l AS (SELECT s.run_id AS id, pg_advisory_xact_lock(1835627105, hashtext(s.run_id))
           FROM (SELECT run_id FROM k ORDER BY hashtext(run_id), run_id OFFSET 0) s),
     c AS (UPDATE runs SET event_seq = runs.event_seq + k.n, chain_base = runs.last_hash,
                  last_hash = (mira_event_chain(runs.last_hash, runs.event_seq + 1, k.hs))[k.n] FROM k
           WHERE runs.id = k.run_id AND runs.id IN (SELECT id FROM l)
           RETURNING runs.id, runs.event_seq, k.n, runs.chain_base,
                  mira_event_chain(runs.chain_base, runs.event_seq - k.n + 1, k.hs) AS chain),
     i AS (INSERT INTO events (run_id, seq, type, data, created_at, content_hash, prev_hash, hash)
           SELECT v.run_id, c.event_seq - c.n + v.rn, v.type, v.data, ",
            $time,
            ", v.h,
                  CASE WHEN v.rn = 1 THEN COALESCE(c.chain_base, repeat('0', 64)) ELSE c.chain[v.rn - 1] END,
                  c.chain[v.rn]
           FROM v JOIN c ON c.id = v.run_id)
"
        )
    };
}

mod approvals;
mod bundle;
pub mod cache;
mod checkpoint;
mod connections;
mod devices;
mod embeddings;
pub use embeddings::{TASK_PREFIX_CHARS, task_key};
mod events;
mod evidence;
pub mod follow;
mod group;
mod invocations;
mod mail;
mod mcp;
mod metrics;
pub mod news_query;
mod notify;
mod replicas;
mod retention;
mod runs;
mod search;
mod skills;
mod terminal;
mod traces;
mod users;
mod writer;

pub use crate::state::ApprovalRule;
pub use approvals::{ApprovalRow, DecideOutcome, Decider, GrantRequest, HarnessClaim, Viewer};
pub use bundle::{BundleText, RunDocument};
pub use connections::ConnectionRow;
pub use devices::Enrolled;
pub use events::EventRow;
pub use evidence::{EvidenceDraft, EvidenceRow};
pub use group::GroupCommitStats;
pub use invocations::{
    ApprovalRequest, CancelRequest, ClaimedInvocation, FinalStatus, FreezeOutcome, InvocationRow, NewInvocation,
    QueueHead,
};
pub use mail::{MailSendRow, MailSendState, SendClaim};
pub use mcp::{
    MAX_REMOVED_TOOLS_KEPT, McpAccessRow, McpConnectionRow, McpOwnerRow, McpServerRow, McpToolRow, OwnerClaim,
};
pub use replicas::{DEAD_REPLICA_REASON, ReplicaRow};
pub use retention::RetentionCounts;
pub use runs::{
    DeviceRow, MAX_HOST_WORKSPACES_PER_USER, RegistrationRefused, RunRow, RunScopeRow, TurnRow, WorkspaceRow,
};
pub use search::{
    FetchRecord, NEWS_RANK_POOL, NewNewsItem, NewsHit, NewsQuery, NewsSort, NewsSourceRow, SearchConnectionRow,
    UpsertCounts,
};
pub use skills::SkillRow;
pub use terminal::{SessionEnd, SessionLaunch, SessionOrigin, TerminalReport, TerminalSessionRow};
pub use users::{LAST_USED_PRECISION, Roles, TokenIdentity, TokenRow, UserRow};
pub use writer::WriterSlotStats;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{Any, AnyPool, Transaction};

use crate::events::{EventBus, EventKind, RunSignal};
use mira_core::chain;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database refused or failed a statement (connection lost, constraint, busy…).
    #[error("database error: {0}")]
    Db(sqlx::Error),
    /// Applying migrations failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A stored document could not be decoded (a bug or a hand-edited row).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// The database URL is not one we support.
    #[error("unsupported database url: {0}")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// True when the database cannot be reached for now (connection refused or lost, pool
    /// timed out, Postgres shutting down or restarting): worth retrying later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Db(sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) | sqlx::Error::PoolClosed) => true,
            StoreError::Db(sqlx::Error::Database(d)) => {
                d.code().is_some_and(|c| c.starts_with("57P") || c.starts_with("08"))
            }
            _ => false,
        }
    }

    /// True for a unique-constraint violation (used to turn races into clean conflicts).
    pub fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Db(sqlx::Error::Database(e)) if e.is_unique_violation())
    }
}

impl From<sqlx::Error> for StoreError {
    /// A column that does not decode into its Rust type (a state text this build does not
    /// know, say) is [`StoreError::Corrupt`] naming the column; anything else is
    /// [`StoreError::Db`].
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::ColumnDecode { index, source } => StoreError::Corrupt(format!("column {index}: {source}")),
            e => StoreError::Db(e),
        }
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Corrupt(e.to_string())
    }
}

/// Result of a storage call.
pub type StoreResult<T> = Result<T, StoreError>;

/// The byte budget of one page of a list whose rows carry call inputs, results or approval
/// previews (`GET /v1/runs/{id}/invocations`, `GET /v1/approvals`, the approvals stream's
/// snapshot): 1 MiB of those stored texts. A row can hold megabytes (an input up to the body
/// limit, a result up to 4 MiB), so a page stops after the row that passes the budget —
/// always at least one row — and says there is more; the row limit still applies.
pub const PAGE_MAX_BYTES: i64 = 1024 * 1024;

/// One page of a list read under a byte budget ([`PAGE_MAX_BYTES`]).
#[derive(Debug)]
pub struct Paged<T> {
    /// The page, in the list's order.
    pub rows: Vec<T>,
    /// Whether rows follow the page's last one (cut by the row limit or by the bytes).
    pub more: bool,
}

impl<T> Paged<T> {
    /// The page of a read of at most `limit + 1` candidates (see [`sized_page_sql`]): the rows
    /// the budget let through, at most `limit`; more when a row was left out.
    fn of(rows: Vec<Listed<T>>, limit: i64) -> Paged<T> {
        let limit = usize::try_from(limit).unwrap_or(0);
        let listed = rows.first().map_or(0, |r| usize::try_from(r.listed).unwrap_or(0));
        let more = rows.len() > limit || rows.len() < listed;
        Paged { rows: rows.into_iter().take(limit).map(|r| r.row).collect(), more }
    }
}

/// A row of a byte-bounded read ([`sized_page_sql`]) and how many candidates that read listed.
#[derive(Debug, sqlx::FromRow)]
struct Listed<T> {
    #[sqlx(flatten)]
    row: T,
    listed: i64,
}

/// A statement that reads rows under a byte budget without loading the ones past it. `list`
/// names the page's candidates in order, as `SELECT <key>, <stored size> AS n … ORDER BY <key>
/// LIMIT …` (sizes by `octet_length`, which SQLite takes from the record header and Postgres
/// from the value's header, neither reading the text). A candidate's row is read in full
/// (`SELECT <columns> FROM s <joins>`, `s.k` its key) only while the candidates before it hold
/// fewer than `budget` (a parameter such as `$4`) bytes: the first always, the one that passes
/// the budget too, none after it. Each row also carries `listed`, the number of candidates, so
/// a page cut by its bytes knows rows follow ([`Paged::of`]). One statement, so one snapshot.
fn sized_page_sql(list: &str, key: &str, columns: &str, joins: &str, budget: &str) -> String {
    format!(
        "WITH f AS ({list}),
              s AS (SELECT {key} AS k,
                           SUM(n) OVER (ORDER BY {key} ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before
                    FROM f)
         SELECT {columns}, (SELECT COUNT(*) FROM f) AS listed FROM s {joins}
         WHERE COALESCE(s.before, 0) < {budget} ORDER BY s.k"
    )
}

/// Which SQL dialect the store speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite file in WAL mode (embedded default).
    Sqlite,
    /// A Postgres server (hosted, multi-user, multi-replica).
    Postgres,
}

impl Backend {
    /// `sqlite` or `postgres`, as reported by `/readyz`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// The store: a connection pool plus the event bus it wakes after commits.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    bus: EventBus,
    /// Serialises this process's News Hub fetch writes on SQLite, whose single writer would
    /// otherwise make concurrent fetches wait in its busy handler's sleeps.
    news_writes: Arc<tokio::sync::Mutex<()>>,
    /// The news search's window boundaries and when they were read ([`search::NewsCuts`]).
    news_cuts: Arc<std::sync::Mutex<Option<search::NewsCuts>>>,
    /// On SQLite, held by every [`WriteTx`] of this process ([`writer`]).
    sqlite_writer: Arc<writer::WriterSlot>,
    /// SQLite: the one connection every [`WriteTx`] runs on, apart from the readers' pool, so
    /// a write never waits for a connection behind reads, and its statement cache holds the
    /// write statements. It checkpoints nothing itself ([`checkpoint::Checkpointer`]).
    sqlite_write_pool: Option<AnyPool>,
    /// SQLite: the writer connection of the group commit ([`SqliteWriteBatch`]),
    /// kept out of the pool; used only under the writer slot.
    sqlite_batch_conn: Arc<tokio::sync::Mutex<Option<sqlx::AnyConnection>>>,
    /// SQLite: copies committed WAL frames into the database file after write transactions,
    /// on a reader connection, so the writer never waits for a checkpoint's syncs.
    checkpointer: Option<Arc<checkpoint::Checkpointer>>,
    /// Recently authenticated tokens ([`cache`]).
    identities: Arc<cache::IdentityCache>,
    /// Freezes and execution results waiting for their group commit (`group`): both kinds
    /// share one transaction, so the run event counters are taken once per commit.
    writes: Arc<group::GroupQueue<invocations::PendingWrite, invocations::WriteOutcome>>,
    /// What those group commits did ([`Store::group_commit_stats`]).
    group_counters: Arc<group::GroupCounters>,
    /// Postgres: sends committed events' notifications to the other replicas ([`notify`]).
    notifier: Option<notify::Notifier>,
}

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

impl Store {
    /// Connects to `url` (`sqlite://PATH?mode=rwc` or `postgres://…`). For SQLite the file
    /// is switched to WAL mode. Does not migrate; call [`Store::migrate`].
    pub async fn connect(url: &str, bus: EventBus) -> StoreResult<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(StoreError::UnsupportedUrl(redact_url(url)));
        };
        let options = AnyConnectOptions::from_str(url)?;
        let mut sqlite_write = None;
        let sqlite_writer: Arc<writer::WriterSlot> = Arc::default();
        let pool = match backend {
            Backend::Sqlite => {
                // WAL is a property of the file: set it once, before the pool opens more
                // connections (changing it needs an exclusive lock).
                let pool = sqlite_pool_options(8, SqliteCheckpoints::Automatic).connect_with(options.clone()).await?;
                // A new (empty) file gets `auto_vacuum = INCREMENTAL`, so retention can give
                // deleted rows' pages back (`Store::reclaim_space`). The mode is fixed when the
                // first table is created, and remembered only by the connection that set it, so
                // the empty file is rewritten (VACUUM) on that connection right away. Existing
                // files keep their mode (converting them is a VACUUM of the whole file: see
                // docs/retention.md).
                {
                    let mut conn = pool.acquire().await?;
                    let objects: i64 =
                        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master").fetch_one(&mut *conn).await?;
                    if objects == 0 {
                        sqlx::query("PRAGMA auto_vacuum = INCREMENTAL").execute(&mut *conn).await?;
                        sqlx::query("VACUUM").execute(&mut *conn).await?;
                    }
                }
                sqlx::query("PRAGMA journal_mode = WAL").execute(&pool).await?;
                let writer = sqlite_pool_options(1, SqliteCheckpoints::Off).connect_with(options).await?;
                sqlite_write =
                    Some((writer, Arc::new(checkpoint::Checkpointer::new(pool.clone(), Arc::clone(&sqlite_writer)))));
                pool
            }
            Backend::Postgres => {
                // One direct connection first: a server that is down fails at once (refused)
                // instead of after the pool's acquire timeout.
                sqlx::Connection::close(<sqlx::AnyConnection as sqlx::Connection>::connect_with(&options).await?)
                    .await?;
                // A request waits at most 5 s for a connection: past that (the database away,
                // or overloaded) it is answered 503 `store_unavailable`.
                pool_options().max_connections(16).acquire_timeout(Duration::from_secs(5)).connect_with(options).await?
            }
        };
        Ok(Store {
            backend,
            bus,
            news_writes: Arc::default(),
            news_cuts: Arc::default(),
            sqlite_writer,
            checkpointer: sqlite_write.as_ref().map(|(_, c)| Arc::clone(c)),
            sqlite_write_pool: sqlite_write.map(|(w, _)| w),
            sqlite_batch_conn: Arc::default(),
            identities: Arc::default(),
            // SQLite has one writer: a second flush would only queue behind the first.
            writes: Arc::new(group::GroupQueue::new(match backend {
                Backend::Sqlite => 1,
                Backend::Postgres => GROUP_FLUSHES_POSTGRES,
            })),
            group_counters: Arc::default(),
            notifier: (backend == Backend::Postgres).then(|| notify::Notifier::spawn(pool.clone())),
            pool,
        })
    }

    /// On Postgres, warns (in the log) when the server's `autovacuum` is off: nothing then
    /// removes the dead row versions every status change leaves in the invocations and runs
    /// tables and their indexes, nor refreshes the planner's statistics — a statement the
    /// server prepared while its tables were small keeps the plan it got then. Measured on
    /// `mira bench invocations`: the lookup of a run's call id kept reading every invocation of
    /// the run, and an `ANALYZE` every 1.5 s cut Postgres' CPU per call from 0.79 to 0.58 ms.
    /// Errors reading the setting are logged at debug level and otherwise ignored.
    pub async fn warn_without_autovacuum(&self) {
        if self.backend != Backend::Postgres {
            return;
        }
        match sqlx::query_scalar::<_, String>("SHOW autovacuum").fetch_one(self.pool()).await {
            Ok(setting) if setting == "off" => tracing::warn!(
                "Postgres runs with autovacuum off: run VACUUM ANALYZE regularly (or turn autovacuum on), \
                 or dead row versions and stale planner statistics will slow every invocation"
            ),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "reading the autovacuum setting failed"),
        }
    }

    /// Applies this back-end's pending migrations.
    ///
    /// On SQLite every connection the pools opened before is closed afterwards: a connection
    /// that read the schema before a migration changed a table prepares against its old
    /// schema, and SQLite re-prepares the statement when it runs — with the new columns, which
    /// sqlx's cached column list for the statement lacks (a `SELECT *` of a table that gained
    /// a column panicked in sqlx's worker thread: "index out of bounds: the len is 20 but the
    /// index is 20"). New connections read the migrated schema.
    pub async fn migrate(&self) -> StoreResult<()> {
        let migrator = match self.backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator.run(&self.pool).await?;
        if self.backend == Backend::Sqlite {
            for pool in std::iter::once(&self.pool).chain(self.sqlite_write_pool.as_ref()) {
                // Nothing else uses the store while it migrates: every connection is idle.
                for _ in 0..pool.size() {
                    let conn = pool.acquire().await?;
                    sqlx::Connection::close(conn.detach()).await?;
                }
            }
        }
        Ok(())
    }

    /// What this store's group commits (freezes and execution results) did since it was
    /// opened: how many transactions, items, and where their time went.
    pub fn group_commit_stats(&self) -> GroupCommitStats {
        self.group_counters.snapshot()
    }

    /// SQLite: how this process's writer slot was used since the store opened ([`writer`]);
    /// None on Postgres.
    pub fn writer_slot_stats(&self) -> Option<WriterSlotStats> {
        (self.backend == Backend::Sqlite).then(|| self.sqlite_writer.stats())
    }

    /// Which dialect this store speaks.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The bus this store wakes after commits.
    pub fn bus(&self) -> &EventBus {
        &self.bus
    }

    /// Bytes the database uses on Postgres (`pg_database_size`); 0 on SQLite, whose file
    /// lies in the data folder.
    pub async fn database_size(&self) -> StoreResult<u64> {
        match self.backend {
            Backend::Sqlite => Ok(0),
            Backend::Postgres => {
                let n: i64 =
                    sqlx::query_scalar("SELECT pg_database_size(current_database())").fetch_one(&self.pool).await?;
                Ok(u64::try_from(n).unwrap_or(0))
            }
        }
    }

    /// How many invocations have `status` (for benchmarks and operators).
    pub async fn count_invocations_with_status(&self, status: crate::state::InvocationStatus) -> StoreResult<u64> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM invocations WHERE status = $1")
            .bind(status)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// A cheap round trip, for `/readyz`.
    pub async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes the pools (waits for checked-out connections to return).
    pub async fn close(&self) {
        // The group commit's own writer connection, under the writer slot (no batch is open).
        let (_writer, _) = self.sqlite_writer.acquire().await;
        if let Some(conn) = self.sqlite_batch_conn.lock().await.take()
            && let Err(e) = sqlx::Connection::close(conn).await
        {
            tracing::warn!(error = %e, "closing the group commit's writer connection failed");
        }
        if let Some(writer) = &self.sqlite_write_pool {
            writer.close().await;
        }
        self.pool.close().await;
    }

    /// Starts a write transaction (see the module docs).
    pub async fn begin_write(&self) -> StoreResult<WriteTx> {
        let (tx, writer) = match self.backend {
            Backend::Sqlite => {
                let (writer, _) = self.sqlite_writer.acquire().await;
                let pool = self.sqlite_write_pool.as_ref().unwrap_or(&self.pool);
                (pool.begin_with("BEGIN IMMEDIATE").await?, Some(writer))
            }
            Backend::Postgres => (self.pool.begin().await?, None),
        };
        Ok(WriteTx {
            tx,
            backend: self.backend,
            appended: Vec::new(),
            bus: self.bus.clone(),
            notifier: self.notifier.clone(),
            checkpointer: self.checkpointer.clone(),
            _writer: writer,
        })
    }

    /// SQLite: the writer slot and connection for a [`SqliteWriteBatch`], whose caller sends
    /// `BEGIN IMMEDIATE` with its first statements and `COMMIT` with its last.
    pub(crate) async fn begin_sqlite_batch(&self) -> StoreResult<SqliteWriteBatch> {
        let (writer, slot_wait) = self.sqlite_writer.acquire().await;
        // Never contended: every holder holds the writer slot first.
        let mut conn = Arc::clone(&self.sqlite_batch_conn).lock_owned().await;
        if conn.is_none() {
            // Taken out of the writer pool once (so it has the pool's settings) and kept: going
            // back to a pool and out again costs a task hand-off each time.
            let pool = self.sqlite_write_pool.as_ref().unwrap_or(&self.pool);
            *conn = Some(pool.acquire().await?.detach());
        }
        Ok(SqliteWriteBatch {
            conn,
            committed: false,
            checkpointer: self.checkpointer.clone(),
            slot_wait,
            _writer: writer,
        })
    }

    /// Wakes the subscribers of events committed outside a [`WriteTx`] (one statement run on
    /// its own), as [`WriteTx::commit`] does after its commit.
    pub(crate) fn publish_committed(&self, signals: Vec<RunSignal>) {
        for signal in signals {
            if let Some(notifier) = &self.notifier {
                notifier.send(self.bus.payload(&signal));
            }
            self.bus.publish(signal);
        }
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }
}

/// Group-commit flushes at once on Postgres (see `group`): one transaction's statements run
/// while the other commits.
const GROUP_FLUSHES_POSTGRES: usize = 2;

/// A connection idle at least this long is pinged before it is handed out.
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Whether a SQLite connection checkpoints the log itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SqliteCheckpoints {
    /// SQLite's default: the commit that crosses 1,000 log pages checkpoints.
    Automatic,
    /// `wal_autocheckpoint = 0`: the writer's, whose checkpoints `checkpoint` runs beside it.
    Off,
}

/// A SQLite pool of at most `max` connections. `synchronous` is a property of each
/// connection, not of the file: in WAL mode NORMAL syncs at checkpoints instead of at every
/// commit (a commit survives a crash of the process; a power loss may lose the last ones).
fn sqlite_pool_options(max: u32, checkpoints: SqliteCheckpoints) -> AnyPoolOptions {
    pool_options().max_connections(max).acquire_timeout(Duration::from_secs(30)).after_connect(move |conn, _| {
        Box::pin(async move {
            sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *conn).await?;
            if checkpoints == SqliteCheckpoints::Off {
                sqlx::query("PRAGMA wal_autocheckpoint = 0").execute(&mut *conn).await?;
            }
            Ok(())
        })
    })
}

/// Pool options both back-ends share. sqlx's default pings every connection before handing
/// it out — one extra round trip per statement outside a transaction, which under load was
/// a third of the freeze path's round trips. Only a connection idle for
/// [`PING_IDLE_AFTER`] is pinged now (a connection that broke while in use is closed when it
/// is returned, which sqlx checks with a ping of its own).
fn pool_options() -> AnyPoolOptions {
    AnyPoolOptions::new().test_before_acquire(false).before_acquire(|conn, meta| {
        Box::pin(async move {
            if meta.idle_for >= PING_IDLE_AFTER {
                sqlx::Connection::ping(conn).await?;
            }
            Ok(true)
        })
    })
}

/// [`WriteTx::append_events`] on Postgres. `$1` is a JSON array of the events
/// (`run_id`, `type`, `data` as text, `h` its content hash
/// ([`mira_core::chain::event_content_hash`]), `ord` = position in the call), `$2` the time;
/// numbered in `ord` order below each run's new last id and hash-chained by
/// [`chain_events_postgres!`] (a `FOR UPDATE` of the runs' rows before their update made the
/// update meet its own lock through an older snapshot, queued behind other waiters — a
/// deadlock — so the update takes the row locks itself); the previous hash is read under the
/// same row lock that hands out the ids. Returns `(run id, last id)` per run. A single-row
/// append ([`WriteTx::append_event`]) takes no advisory lock: it holds one counter only, so it
/// closes no cycle.
const APPEND_EVENTS_POSTGRES: &str = concat!(
    "WITH v AS (SELECT x.run_id, x.type, x.data, x.h, x.ord,
                  ROW_NUMBER() OVER (PARTITION BY x.run_id ORDER BY x.ord) AS rn
           FROM json_to_recordset($1::json) AS x(run_id text, type text, data text, h text, ord bigint)),",
    chain_events_postgres!("$2"),
    "SELECT id, event_seq FROM c"
);

/// SQLite: a write transaction on the writer connection, under the writer slot, whose
/// `BEGIN IMMEDIATE` and `COMMIT` travel in the same commands as its first and last
/// statements — two hand-offs to the connection's thread fewer than a [`WriteTx`] (for the
/// group commit, `Store::write_group_in_two_commands`). The caller broadcasts
/// what it appended ([`Store::publish_committed`]) after [`SqliteWriteBatch::committed`].
/// Its connection is the store's own for these batches, kept out of the writer pool. Dropped
/// before [`SqliteWriteBatch::committed`] (a statement failed, or the commit did), the
/// connection is closed, and SQLite rolls its open transaction back.
pub(crate) struct SqliteWriteBatch {
    /// The store's batch connection (None until first used, and after a failed batch).
    conn: tokio::sync::OwnedMutexGuard<Option<sqlx::AnyConnection>>,
    committed: bool,
    checkpointer: Option<Arc<checkpoint::Checkpointer>>,
    slot_wait: Duration,
    /// Released after the connection (declared last).
    _writer: writer::WriterHold,
}

impl SqliteWriteBatch {
    /// The writer connection. Errors: the batch is committed already.
    pub(crate) fn conn(&mut self) -> StoreResult<&mut sqlx::AnyConnection> {
        match self.conn.as_mut() {
            Some(conn) if !self.committed => Ok(conn),
            _ => Err(StoreError::Corrupt("a committed write batch was used again".into())),
        }
    }

    /// How long the batch waited for the writer slot.
    pub(crate) fn slot_wait(&self) -> Duration {
        self.slot_wait
    }

    /// After the command carrying `COMMIT` succeeded: the checkpointer is told of the commit.
    pub(crate) fn committed(mut self) {
        self.committed = true;
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.committed();
        }
    }
}

impl Drop for SqliteWriteBatch {
    fn drop(&mut self) {
        if !self.committed {
            // Closing the connection rolls its transaction back; the next batch takes a new one.
            drop(self.conn.take());
        }
    }
}

/// A write transaction that appends events and broadcasts them after commit.
pub struct WriteTx {
    tx: Transaction<'static, Any>,
    backend: Backend,
    appended: Vec<RunSignal>,
    bus: EventBus,
    notifier: Option<notify::Notifier>,
    /// SQLite: told of every commit ([`checkpoint::Checkpointer::committed`]).
    checkpointer: Option<Arc<checkpoint::Checkpointer>>,
    /// SQLite: this process's writer slot ([`writer`]), released after the transaction
    /// (declared last: dropped after `tx`).
    _writer: Option<writer::WriterHold>,
}

impl WriteTx {
    /// Appends an event to `run_id`'s log and returns its id (monotonic per run). The per-run
    /// counter row is locked by the update, so concurrent appends to one run serialize and
    /// commit in id order.
    pub async fn append_event(&mut self, run_id: &str, kind: EventKind, data: &serde_json::Value) -> StoreResult<i64> {
        let now = crate::ids::now();
        let content = chain::event_content_hash(run_id, kind.as_str(), &now, data);
        let (seq, prev, hash): (i64, Option<String>, String) = match self.backend {
            Backend::Postgres => {
                sqlx::query_as(
                    "UPDATE runs SET event_seq = event_seq + 1, chain_base = last_hash,
                         last_hash = (mira_event_chain(last_hash, event_seq + 1, ARRAY[$2::text]))[1]
                     WHERE id = $1 RETURNING event_seq, chain_base, last_hash",
                )
                .bind(run_id)
                .bind(&content)
                .fetch_one(&mut *self.tx)
                .await?
            }
            Backend::Sqlite => {
                let (seq, prev): (i64, Option<String>) = sqlx::query_as(
                    "UPDATE runs SET event_seq = event_seq + 1 WHERE id = $1 RETURNING event_seq, last_hash",
                )
                .bind(run_id)
                .fetch_one(&mut *self.tx)
                .await?;
                let hash = chain::event_link(prev.as_deref().unwrap_or(chain::GENESIS), seq, &content);
                sqlx::query("UPDATE runs SET last_hash = $1 WHERE id = $2")
                    .bind(&hash)
                    .bind(run_id)
                    .execute(&mut *self.tx)
                    .await?;
                (seq, prev, hash)
            }
        };
        sqlx::query(
            "INSERT INTO events (run_id, seq, type, data, created_at, content_hash, prev_hash, hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(run_id)
        .bind(seq)
        .bind(kind.as_str())
        .bind(data.to_string())
        .bind(&now)
        .bind(&content)
        .bind(prev.as_deref().unwrap_or(chain::GENESIS))
        .bind(&hash)
        .execute(&mut *self.tx)
        .await?;
        self.appended.push(RunSignal { run_id: run_id.to_owned(), seq, kind });
        Ok(seq)
    }

    /// Appends several events in one go and returns their ids in the order given. Ids stay
    /// monotonic per run and gapless; events of one run get consecutive ids in the order
    /// given. For a batch of claims, where
    /// [`WriteTx::append_event`] would cost two round trips per event.
    ///
    /// Make it the transaction's last statement: it locks the counters of the events' runs
    /// (on Postgres in one fixed order, so two transactions never wait for each other in a
    /// cycle), and
    /// they stay locked until the commit, so another transaction appending to one of these
    /// runs waits from here to the commit. On Postgres it is one statement of fixed text
    /// (the events travel as one JSON parameter): the counters are updated and the events
    /// inserted in one round trip, by a statement the connection has prepared already. On
    /// SQLite (one writer, no round trips) it is a read of the counters and last hashes, a
    /// multi-row insert of the hash-chained events and one update of the counters and hashes.
    pub async fn append_events<S: AsRef<str>>(
        &mut self,
        events: &[(S, EventKind, serde_json::Value)],
    ) -> StoreResult<Vec<i64>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // How many events each run gets, runs in id order.
        let mut per_run: Vec<(&str, i64)> = Vec::new();
        for (run_id, _, _) in events {
            let run_id = run_id.as_ref();
            match per_run.iter_mut().find(|(r, _)| *r == run_id) {
                Some((_, n)) => *n += 1,
                None => per_run.push((run_id, 1)),
            }
        }
        per_run.sort_unstable();
        let now = crate::ids::now();
        let contents: Vec<String> = events
            .iter()
            .map(|(run_id, kind, data)| chain::event_content_hash(run_id.as_ref(), kind.as_str(), &now, data))
            .collect();
        // SQLite: each run's last hash before these events.
        let mut prev_hashes: Vec<(String, Option<String>)> = Vec::new();
        let last: Vec<(String, i64)> = match self.backend {
            Backend::Postgres => {
                let rows: Vec<serde_json::Value> = events
                    .iter()
                    .zip(&contents)
                    .enumerate()
                    .map(|(i, ((run_id, kind, data), h))| {
                        serde_json::json!({"run_id": run_id.as_ref(), "type": kind.as_str(),
                                           "data": data.to_string(), "h": h, "ord": i})
                    })
                    .collect();
                sqlx::query_as(APPEND_EVENTS_POSTGRES)
                    .bind(serde_json::Value::Array(rows).to_string())
                    .bind(&now)
                    .fetch_all(&mut *self.tx)
                    .await?
            }
            Backend::Sqlite => {
                // The counts are parameters too: the text depends only on how many runs, so
                // the connection's statement cache keeps it.
                let mut case = String::from("CASE id");
                let mut ids = Vec::with_capacity(per_run.len());
                for i in 0..per_run.len() {
                    case.push_str(&format!(" WHEN ${} THEN ${}", 2 * i + 1, 2 * i + 2));
                    ids.push(format!("${}", 2 * i + 1));
                }
                // Read (this transaction is the only writer: BEGIN IMMEDIATE); the counters and
                // last hashes are written by one update after the insert.
                let sql = format!(
                    "SELECT id, event_seq + {case} ELSE 0 END, last_hash FROM runs WHERE id IN ({})",
                    ids.join(", ")
                );
                let mut select = sqlx::query_as::<_, (String, i64, Option<String>)>(sqlx::AssertSqlSafe(sql));
                for (run_id, n) in &per_run {
                    select = select.bind(*run_id).bind(*n);
                }
                let rows = select.fetch_all(&mut *self.tx).await?;
                prev_hashes = rows.iter().map(|(id, _, h)| (id.clone(), h.clone())).collect();
                rows.into_iter().map(|(id, seq, _)| (id, seq)).collect()
            }
        };
        // The first id each run's new events take.
        let mut next: Vec<(&str, i64)> = Vec::with_capacity(per_run.len());
        for (run_id, n) in &per_run {
            let (_, seq) = last.iter().find(|(id, _)| id == run_id).ok_or(StoreError::Db(sqlx::Error::RowNotFound))?;
            next.push((run_id, seq - n + 1));
        }
        let mut seqs = Vec::with_capacity(events.len());
        for (run_id, _, _) in events {
            let slot =
                next.iter_mut().find(|(r, _)| *r == run_id.as_ref()).ok_or(StoreError::Db(sqlx::Error::RowNotFound))?;
            seqs.push(slot.1);
            slot.1 += 1;
        }
        if self.backend == Backend::Sqlite {
            // The chain, run by run in the order given: each event links to the one before.
            let mut links = Vec::with_capacity(events.len());
            for (((run_id, _, _), seq), content) in events.iter().zip(&seqs).zip(&contents) {
                let slot = prev_hashes
                    .iter_mut()
                    .find(|(r, _)| r == run_id.as_ref())
                    .ok_or(StoreError::Db(sqlx::Error::RowNotFound))?;
                let prev = slot.1.clone().unwrap_or_else(|| chain::GENESIS.to_owned());
                let hash = chain::event_link(&prev, *seq, content);
                slot.1 = Some(hash.clone());
                links.push((prev, hash));
            }
            let mut sql = String::from(
                "INSERT INTO events (run_id, seq, type, data, content_hash, prev_hash, hash, created_at) VALUES ",
            );
            for i in 0..events.len() {
                let b = i * 7;
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!(
                    "(${}, ${}, ${}, ${}, ${}, ${}, ${}, ${})",
                    b + 1,
                    b + 2,
                    b + 3,
                    b + 4,
                    b + 5,
                    b + 6,
                    b + 7,
                    events.len() * 7 + 1
                ));
            }
            let mut insert = sqlx::query(sqlx::AssertSqlSafe(sql));
            for ((((run_id, kind, data), seq), content), (prev, hash)) in
                events.iter().zip(&seqs).zip(&contents).zip(&links)
            {
                insert = insert
                    .bind(run_id.as_ref())
                    .bind(*seq)
                    .bind(kind.as_str())
                    .bind(data.to_string())
                    .bind(content)
                    .bind(prev)
                    .bind(hash);
            }
            insert.bind(now).execute(&mut *self.tx).await?;
            // Each run's counter and last hash, in one statement.
            let (mut seq_case, mut hash_case, mut ids) = (String::from("CASE id"), String::from("CASE id"), Vec::new());
            for (i, (_, n)) in per_run.iter().enumerate() {
                seq_case.push_str(&format!(" WHEN ${} THEN {n}", 2 * i + 1));
                hash_case.push_str(&format!(" WHEN ${} THEN ${}", 2 * i + 1, 2 * i + 2));
                ids.push(format!("${}", 2 * i + 1));
            }
            let sql = format!(
                "UPDATE runs SET event_seq = event_seq + {seq_case} ELSE 0 END, last_hash = {hash_case} ELSE last_hash END
                 WHERE id IN ({})",
                ids.join(", ")
            );
            let mut update = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (run_id, _) in &per_run {
                let hash = prev_hashes.iter().find(|(r, _)| r == run_id).and_then(|(_, h)| h.clone());
                update = update.bind(*run_id).bind(hash);
            }
            update.execute(&mut *self.tx).await?;
        }
        for ((run_id, kind, _), seq) in events.iter().zip(&seqs) {
            self.appended.push(RunSignal { run_id: run_id.as_ref().to_owned(), seq: *seq, kind: *kind });
        }
        Ok(seqs)
    }

    /// Commits, then wakes subscribers of every run that got events: on this replica through
    /// the bus, on the others (Postgres) through a notification sent after the commit
    /// ([`notify`]; a `pg_notify` inside the transaction would serialise every commit).
    pub async fn commit(self) -> StoreResult<()> {
        self.tx.commit().await?;
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.committed();
        }
        for signal in self.appended {
            if let Some(notifier) = &self.notifier {
                notifier.send(self.bus.payload(&signal));
            }
            self.bus.publish(signal);
        }
        Ok(())
    }

    /// Locks invocation `id` when it is still `running` and says whether it is: the fence
    /// of writes made on behalf of an execution after it started (progress events). An
    /// invocation that finished or was interrupted — its lease taken over after its replica
    /// died — never runs again, so a late write of the old execution is dropped.
    pub async fn invocation_still_running(&mut self, id: &str) -> StoreResult<bool> {
        let done = sqlx::query("UPDATE invocations SET updated_at = updated_at WHERE id = $1 AND status = 'running'")
            .bind(id)
            .execute(&mut *self.tx)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) fn conn(&mut self) -> &mut sqlx::AnyConnection {
        &mut self.tx
    }
}

/// This process's turns of the owners' limited creates ([`Store::begin_owner_write`]), striped
/// by owner.
static OWNER_TURNS: [tokio::sync::Mutex<()>; 64] = [const { tokio::sync::Mutex::const_new(()) }; 64];

impl Store {
    /// A write transaction that counts `owner_id`'s rows against a per-user limit and inserts
    /// one (connections, skills), serialised with every other such transaction of the owner
    /// until it ends; with it the process's turn of the owner, to keep until the commit. In
    /// this process the owner's creates wait for their turn before they take a database
    /// connection, so a burst of one user's requests never holds the pool's connections
    /// waiting on a lock. Across replicas Postgres serialises them with a transaction-scoped
    /// advisory lock on the owner (namespace 1835627107, "a user's limits"; 1835627105 is the
    /// runs' event chains, 1835627106 the MCP tool rows): under READ COMMITTED two
    /// transactions would both count the old number and both insert. SQLite's write
    /// transaction (`BEGIN IMMEDIATE` under the writer slot) is serialised already.
    pub(crate) async fn begin_owner_write(
        &self,
        owner_id: &str,
    ) -> StoreResult<(tokio::sync::MutexGuard<'static, ()>, WriteTx)> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        owner_id.hash(&mut h);
        let stripe = usize::try_from(h.finish() % OWNER_TURNS.len() as u64).unwrap_or(0);
        let turn = OWNER_TURNS[stripe].lock().await;
        let mut tx = self.begin_write().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock(1835627107, hashtext($1))")
                .bind(owner_id)
                .execute(tx.conn())
                .await?;
        }
        Ok((turn, tx))
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let creds = &url[scheme_end + 3..at];
            match creds.find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme_end + 3], &creds[..colon], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Decodes a JSON text column (a stored document that fails to parse is `Corrupt`).
pub fn json_col(text: &str) -> StoreResult<serde_json::Value> {
    Ok(serde_json::from_str(text)?)
}
