//! One schema truth. The two migration sets (`migrations/sqlite`, `migrations/postgres`)
//! must say the same thing: the same files, line for line, except where a dialect needs its
//! own words — those places are listed in [`DIALECT`] (and integer widths, see [`normalize`]).
//! Every state column's `CHECK` constraint lists exactly the values of its Rust enum
//! (`mira::state`), on both back-ends; and migrated, both back-ends have the same tables and
//! columns with the same nullability.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::{self, Backend, TestDb};
use mira::state::{
    ApprovalRule, ApprovalStatus, InvocationStatus, McpConnectionState, McpOwnerState, McpToolStatus, ReplicaState,
    TerminalSessionState, VectorKind,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Sqlite,
    Postgres,
}

/// Where the sets may differ: `(file, side, first line (a prefix of it), lines)` — that many
/// lines from the first line starting with the prefix are that dialect's own. A file listed
/// with `None` is a dialect's own as a whole (its `CHECK`s are compared by
/// [`check_constraints_list_the_enum_values`]).
const DIALECT: &[(&str, Side, &str, Option<usize>)] = &[
    // News search: FTS5 (an integer rowid key, a virtual table and its triggers) on SQLite,
    // a generated tsvector column with a GIN index on Postgres.
    ("0006_search.sql", Side::Sqlite, "-- collected items, and a full-text index", Some(2)),
    ("0006_search.sql", Side::Postgres, "-- collected items, and a full-text index", Some(2)),
    ("0006_search.sql", Side::Sqlite, "-- sorting use). `n` is", Some(2)),
    ("0006_search.sql", Side::Postgres, "-- sorting use). `search` is", Some(2)),
    ("0006_search.sql", Side::Sqlite, "    n               INTEGER PRIMARY KEY,", Some(2)),
    ("0006_search.sql", Side::Postgres, "    id              TEXT PRIMARY KEY,", Some(1)),
    ("0006_search.sql", Side::Postgres, "    search          tsvector GENERATED", Some(5)),
    ("0006_search.sql", Side::Sqlite, "-- Full-text index over title, summary and content", Some(23)),
    ("0006_search.sql", Side::Postgres, "CREATE INDEX news_items_search ON news_items USING GIN", Some(1)),
    // Phrase search: FTS5 indexes positions; Postgres adds an adjacent-pair column and index.
    ("0020_news_phrase_pairs.sql", Side::Sqlite, "", None),
    ("0020_news_phrase_pairs.sql", Side::Postgres, "", None),
    // CHECK constraints: SQLite rebuilds the tables, Postgres alters them.
    ("0013_state_checks.sql", Side::Sqlite, "", None),
    ("0013_state_checks.sql", Side::Postgres, "", None),
    // The event chain's link function: SQLite's single writer computes the links in the server.
    ("0026_event_chain.sql", Side::Postgres, "-- The link hashes of events first_seq", Some(18)),
];

fn dir(side: Side) -> PathBuf {
    let name = match side {
        Side::Sqlite => "sqlite",
        Side::Postgres => "postgres",
    };
    Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations").join(name)
}

fn files(side: Side) -> BTreeMap<String, String> {
    std::fs::read_dir(dir(side))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// Integer widths are dialect: SQLite's INTEGER is 64-bit, Postgres spells that BIGINT.
fn normalize(line: &str) -> String {
    line.trim_end().replace("BIGINT", "INTEGER")
}

/// The lines of `text` that are `side`'s own in `file`, by index.
fn dialect_lines(file: &str, side: Side, text: &str) -> BTreeSet<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut own = BTreeSet::new();
    for (f, s, first, count) in DIALECT {
        if *f != file || *s != side {
            continue;
        }
        let Some(count) = count else {
            return (0..lines.len()).collect();
        };
        let start = lines.iter().position(|l| l.starts_with(first)).unwrap_or_else(|| {
            panic!("{file} ({side:?}): the dialect block starting {first:?} is gone; update DIALECT")
        });
        own.extend(start..start + count);
    }
    own
}

#[test]
fn migration_sets_differ_only_in_dialect() {
    let (sqlite, postgres) = (files(Side::Sqlite), files(Side::Postgres));
    assert_eq!(
        sqlite.keys().collect::<Vec<_>>(),
        postgres.keys().collect::<Vec<_>>(),
        "both back-ends must have the same migration files"
    );
    let mut problems = Vec::new();
    for (file, lite) in &sqlite {
        let pg = &postgres[file];
        let keep = |side: Side, text: &str| -> Vec<String> {
            let own = dialect_lines(file, side, text);
            text.lines()
                .enumerate()
                .filter(|(i, l)| !own.contains(i) && !l.trim().is_empty())
                .map(|(_, l)| normalize(l))
                .collect()
        };
        let (a, b) = (keep(Side::Sqlite, lite).join("\n"), keep(Side::Postgres, pg).join("\n"));
        if a != b {
            let diff = similar::TextDiff::from_lines(&a, &b);
            let shown: Vec<String> = diff
                .iter_all_changes()
                .filter(|c| c.tag() != similar::ChangeTag::Equal)
                .map(|c| {
                    let sign = if c.tag() == similar::ChangeTag::Delete { "sqlite  " } else { "postgres" };
                    format!("  {sign} | {}", c.value().trim_end())
                })
                .collect();
            problems.push(format!("{file}:\n{}", shown.join("\n")));
        }
    }
    assert!(
        problems.is_empty(),
        "the migration sets differ outside the dialect allow-list (tests/it/schema.rs DIALECT):\n{}",
        problems.join("\n")
    );
}

/// `CHECK (column IN ('a', 'b'))` as the migrations write it.
fn check_text<T: Copy>(column: &str, values: &[T], text: impl Fn(T) -> &'static str) -> String {
    let list: Vec<String> = values.iter().map(|v| format!("'{}'", text(*v))).collect();
    format!("CHECK ({column} IN ({}))", list.join(", "))
}

#[test]
fn check_constraints_list_the_enum_values() {
    let expected = [
        ("invocations", check_text("status", InvocationStatus::ALL, InvocationStatus::as_str)),
        ("invocations", "CHECK (approval_required IN (0, 1))".to_owned()),
        ("approvals", check_text("status", ApprovalStatus::ALL, ApprovalStatus::as_str)),
        ("approvals", check_text("rule", ApprovalRule::ALL, ApprovalRule::as_str)),
        ("mcp_connections", check_text("state", McpConnectionState::ALL, McpConnectionState::as_str)),
        ("mcp_tools", check_text("status", McpToolStatus::ALL, McpToolStatus::as_str)),
        ("mcp_tools", "CHECK (schema_declared IN (0, 1))".to_owned()),
        ("terminal_sessions", check_text("state", TerminalSessionState::ALL, TerminalSessionState::as_str)),
        ("replicas", check_text("state", ReplicaState::ALL, ReplicaState::as_str)),
        ("mcp_owners", check_text("state", McpOwnerState::ALL, McpOwnerState::as_str)),
        ("tool_embeddings", check_text("kind", VectorKind::ALL, VectorKind::as_str)),
    ];
    for side in [Side::Sqlite, Side::Postgres] {
        let all: String = files(side).into_values().collect::<Vec<_>>().join("\n");
        let found = all.matches("CHECK (").count();
        for (table, check) in &expected {
            assert!(all.contains(check.as_str()), "{side:?}: no `{check}` on {table}");
        }
        // Nothing else is checked in one dialect only (SQLite repeats the rule's check of
        // 0009 in its rebuild of approvals).
        let extra = usize::from(side == Side::Sqlite);
        assert_eq!(found, expected.len() + extra, "{side:?}: CHECK constraints beyond the enums'");
    }
}

/// `table → column → not null` of a migrated store (primary keys count as not null).
async fn columns(backend: Backend) -> BTreeMap<String, BTreeMap<String, bool>> {
    let tmp = tempfile::tempdir().unwrap();
    let db = TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    store.close().await;
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let sql = match backend {
        Backend::Sqlite => {
            "SELECT m.name, p.name, CASE WHEN p.\"notnull\" <> 0 OR p.pk > 0 THEN 1 ELSE 0 END
             FROM sqlite_master m JOIN pragma_table_info(m.name) p
             WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%' AND m.name NOT LIKE 'news_items_fts%'
               AND m.name <> '_sqlx_migrations'"
        }
        Backend::Postgres => {
            "SELECT table_name::text, column_name::text, CASE WHEN is_nullable = 'NO' THEN 1 ELSE 0 END
             FROM information_schema.columns
             WHERE table_schema = 'public' AND table_name <> '_sqlx_migrations'"
        }
    };
    let rows: Vec<(String, String, i64)> = sqlx::query_as(sql).fetch_all(&pool).await.unwrap();
    pool.close().await;
    drop(db);
    let mut out: BTreeMap<String, BTreeMap<String, bool>> = BTreeMap::new();
    for (table, column, not_null) in rows {
        out.entry(table).or_default().insert(column, not_null != 0);
    }
    out
}

#[tokio::test]
async fn migrated_back_ends_have_the_same_columns() {
    let mut sqlite = columns(Backend::Sqlite).await;
    let mut postgres = columns(Backend::Postgres).await;
    // Dialect: SQLite's FTS5 index refers to an integer rowid; Postgres keeps a tsvector.
    assert!(sqlite.get_mut("news_items").unwrap().remove("n").is_some());
    assert!(postgres.get_mut("news_items").unwrap().remove("search").is_some());
    assert!(postgres.get_mut("news_items").unwrap().remove("phrase_pairs").is_some());
    assert!(!sqlite.is_empty());
    assert_eq!(sqlite, postgres);
    let _ = common::admin_url();
}

async fn exec(pool: &sqlx::AnyPool, sql: String) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await.map(|_| ())
}

/// `sql` fails on a CHECK constraint.
async fn refused(pool: &sqlx::AnyPool, sql: String) {
    let err = exec(pool, sql.clone()).await.expect_err(&sql);
    let kind = err.as_database_error().map(|e| e.kind());
    assert!(matches!(kind, Some(sqlx::error::ErrorKind::CheckViolation)), "{sql}: {err}");
}

/// Every state column refuses a value its enum does not name (and takes one it does), on
/// both back-ends; a value that got in anyway (SQLite with its checks switched off) is read
/// as `StoreError::Corrupt`, naming the column and the value.
async fn states_outside_the_enums_are_refused(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let db = TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let user = store.create_user("u", false, &mira::auth::hash_token("t")).await.unwrap();
    let ws = store.upsert_default_workspace(tmp.path().to_str().unwrap(), "1:1").await.unwrap();
    let run = store.create_run(&user.id, &ws.id, None, None, None).await.unwrap();
    let turn =
        store.create_turn(&run, "task", None, &serde_json::json!({"strategy": "all", "tools": []})).await.unwrap();
    let input = serde_json::json!({"n": 1});
    let new = mira::store::NewInvocation {
        run_id: run.id.clone(),
        turn_id: turn.id.clone(),
        owner_id: user.id.clone(),
        tool_id: "t".into(),
        tool_call_id: "c1".into(),
        input: input.to_string(),
        input_hash: mira::invocation::canonical::input_hash("t", &input),
        approval: Some(mira::store::ApprovalRequest::new(serde_json::json!({}), mira::ids::now_plus_ms(60_000))),
        queue_tag: 0,
    };
    let mira::store::FreezeOutcome::Created(inv, Some(apr)) = store.freeze_invocation(&new).await.unwrap() else {
        panic!("a new invocation with an approval")
    };
    assert_eq!(inv.status, InvocationStatus::AwaitingApproval);
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let (inv, u) = (inv.id, user.id);

    refused(&pool, format!("UPDATE invocations SET status = 'Queued' WHERE id = '{inv}'")).await;
    refused(&pool, format!("UPDATE invocations SET status = '' WHERE id = '{inv}'")).await;
    refused(&pool, format!("UPDATE invocations SET approval_required = 2 WHERE id = '{inv}'")).await;
    refused(&pool, format!("UPDATE approvals SET status = 'approved' WHERE id = '{apr}'")).await;
    refused(&pool, format!("UPDATE approvals SET rule = 'anyone' WHERE id = '{apr}'")).await;
    exec(&pool, format!("UPDATE approvals SET status = 'granted' WHERE id = '{apr}'")).await.unwrap();
    exec(&pool, format!("UPDATE invocations SET status = 'queued' WHERE id = '{inv}'")).await.unwrap();

    exec(
        &pool,
        format!(
            "INSERT INTO mcp_servers (id, owner_id, installed_by, name, transport, config, enabled,
                default_agent_access, request_timeout_ms, created_at, updated_at)
             VALUES ('mcp_t', NULL, '{u}', 'm', 'stdio', '{{}}', 1, 0, 1000, 'x', 'x')"
        ),
    )
    .await
    .unwrap();
    let conn = |state: &str| {
        format!(
            "INSERT INTO mcp_connections (server_id, state, attempts, updated_at) VALUES ('mcp_t', '{state}', 0, 'x')"
        )
    };
    refused(&pool, conn("up")).await;
    exec(&pool, conn("connected")).await.unwrap();
    let tool = |status: &str| {
        format!("INSERT INTO mcp_tools (server_id, name, status, discovered_at) VALUES ('mcp_t', 't', '{status}', 'x')")
    };
    refused(&pool, tool("listed")).await;
    exec(&pool, tool("ok")).await.unwrap();
    refused(&pool, "UPDATE mcp_tools SET schema_declared = 2".to_owned()).await;
    exec(&pool, "UPDATE mcp_tools SET schema_declared = 1".to_owned()).await.unwrap();

    let session = |id: &str, state: &str| {
        format!(
            "INSERT INTO terminal_sessions (id, owner_id, run_id, invocation_id, node_id, command, args, cwd, env,
                cols, rows, timeout_ms, state, started_at)
             VALUES ('{id}', '{u}', 'r', '{inv}', 'n', 'sh', '[]', '/', '{{}}', 80, 24, 1000, '{state}', 'x')"
        )
    };
    refused(&pool, session("term_1", "done")).await;
    exec(&pool, session("term_1", "timed_out")).await.unwrap();

    if backend == Backend::Sqlite {
        let mut conn = pool.acquire().await.unwrap();
        sqlx::query("PRAGMA ignore_check_constraints = ON").execute(&mut *conn).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("UPDATE invocations SET status = 'bogus' WHERE id = '{inv}'")))
            .execute(&mut *conn)
            .await
            .unwrap();
        let err = store.invocation_by_id(&inv).await.unwrap_err();
        assert!(
            matches!(&err, mira::store::StoreError::Corrupt(m) if m.contains("status") && m.contains("bogus")),
            "{err}"
        );
    }
    pool.close().await;
    store.close().await;
}

/// Migration 0013 keeps every row (and the rows that refer to the rebuilt tables: SQLite
/// drops and re-creates them), the indexes, and foreign-key enforcement.
async fn state_checks_keep_existing_rows(backend: Backend) {
    sqlx::any::install_default_drivers();
    let tmp = tempfile::tempdir().unwrap();
    let db = TestDb::new(backend, tmp.path()).await;
    let side = if backend == Backend::Sqlite { Side::Sqlite } else { Side::Postgres };
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let migrator = sqlx::migrate::Migrator::new(dir(side)).await.unwrap();
    migrator.run_to(12, &pool).await.unwrap();
    let t = "2026-01-01T00:00:00.000Z";
    for sql in [
        format!("INSERT INTO users (id, name, is_admin, created_at) VALUES ('usr_1', 'u', 0, '{t}')"),
        format!("INSERT INTO workspaces (id, owner_id, name, path, created_at) VALUES ('wsp_1', NULL, 'w', '/', '{t}')"),
        format!("INSERT INTO runs (id, owner_id, workspace_id, created_at) VALUES ('run_1', 'usr_1', 'wsp_1', '{t}')"),
        format!(
            "INSERT INTO turns (id, run_id, owner_id, task, exposure, created_at)
             VALUES ('trn_1', 'run_1', 'usr_1', 'task', '{{}}', '{t}')"
        ),
        format!(
            "INSERT INTO invocations (id, run_id, turn_id, owner_id, tool_id, tool_call_id, input, input_hash,
                approval_required, status, created_at, updated_at, cancel_requested_by)
             VALUES ('inv_1', 'run_1', 'trn_1', 'usr_1', 't', 'c1', '{{}}', 'h', 1, 'awaiting_approval', '{t}', '{t}', 'x')"
        ),
        format!(
            "INSERT INTO approvals (id, invocation_id, run_id, owner_id, tool_id, tool_call_id, input_hash, status,
                expires_at, created_at, rule, rule_domain)
             VALUES ('apr_1', 'inv_1', 'run_1', 'usr_1', 't', 'c1', 'h', 'pending', '{t}', '{t}', 'four_eyes', 'edit')"
        ),
        format!(
            "INSERT INTO evidence (id, run_id, invocation_id, owner_id, tool_id, kind, provenance, content_sha256,
                excerpt, created_at, accepted)
             VALUES ('evd_1', 'run_1', 'inv_1', 'usr_1', 't', 'k', '{{}}', 's', 'e', '{t}', 0)"
        ),
        format!(
            "INSERT INTO terminal_sessions (id, owner_id, run_id, invocation_id, node_id, command, args, cwd, env,
                cols, rows, timeout_ms, state, started_at)
             VALUES ('term_1', 'usr_1', 'run_1', 'inv_1', 'n', 'sh', '[]', '/', '{{}}', 80, 24, 1000, 'exited', '{t}')"
        ),
        "INSERT INTO terminal_chunks (session_id, start_offset, end_offset, data) VALUES ('term_1', 0, 2, 'aGk=')"
            .to_owned(),
        "INSERT INTO terminal_reports (invocation_id, session_id, start_offset, end_offset)
         VALUES ('inv_1', 'term_1', 0, 2)"
            .to_owned(),
        format!(
            "INSERT INTO mcp_servers (id, owner_id, installed_by, name, transport, config, enabled,
                default_agent_access, request_timeout_ms, created_at, updated_at)
             VALUES ('mcp_1', NULL, 'usr_1', 'm', 'stdio', '{{}}', 1, 0, 1000, '{t}', '{t}')"
        ),
        format!("INSERT INTO mcp_connections (server_id, state, attempts, updated_at) VALUES ('mcp_1', 'failed', 3, '{t}')"),
        format!(
            "INSERT INTO mcp_tools (server_id, name, status, discovered_at, schema_declared)
             VALUES ('mcp_1', 't', 'rejected', '{t}', 1)"
        ),
    ] {
        exec(&pool, sql.clone()).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let tables = [
        "invocations",
        "approvals",
        "evidence",
        "terminal_sessions",
        "terminal_chunks",
        "terminal_reports",
        "mcp_connections",
        "mcp_tools",
    ];
    let count = |table: &str| {
        let pool = pool.clone();
        let sql = format!("SELECT COUNT(*) FROM {table}");
        async move { sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql)).fetch_one(&pool).await.unwrap() }
    };
    for table in tables {
        assert_eq!(count(table).await, 1, "{table} before 0013");
    }
    pool.close().await;

    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let count = |table: &str| {
        let pool = pool.clone();
        let sql = format!("SELECT COUNT(*) FROM {table}");
        async move { sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql)).fetch_one(&pool).await.unwrap() }
    };
    for table in tables {
        assert_eq!(count(table).await, 1, "{table} after 0013");
    }
    let inv = store.invocation_by_id("inv_1").await.unwrap().unwrap();
    assert_eq!(
        (inv.status, inv.approval_required, inv.cancel_requested_by.as_deref()),
        (InvocationStatus::AwaitingApproval, true, Some("x"))
    );
    let apr = store.approval_of_invocation("inv_1").await.unwrap().unwrap();
    assert_eq!(
        (apr.status, apr.rule(), apr.rule_domain.as_deref()),
        (ApprovalStatus::Pending, ApprovalRule::FourEyes, Some("edit"))
    );
    let tools = store.mcp_tools("mcp_1").await.unwrap();
    assert_eq!((tools[0].status, tools[0].schema_declared), (McpToolStatus::Rejected, Some(true)));
    let conn = store.mcp_connection("mcp_1").await.unwrap().unwrap();
    assert_eq!((conn.state, conn.attempts), (McpConnectionState::Failed, 3));

    let index_sql = match backend {
        Backend::Sqlite => "SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_%'",
        Backend::Postgres => "SELECT indexname::text FROM pg_indexes WHERE schemaname = 'public'",
    };
    let indexes: BTreeSet<String> = sqlx::query_scalar(index_sql).fetch_all(&pool).await.unwrap().into_iter().collect();
    for index in [
        "invocations_status",
        "invocations_run",
        "approvals_owner_status",
        "approvals_expiry",
        "approvals_rule_status",
        "terminal_sessions_owner",
        "terminal_sessions_state",
    ] {
        assert!(indexes.contains(index), "index {index} missing after 0013: {indexes:?}");
    }
    // 0032: the status index holds only the invocations still acted on.
    let status_index_sql = match backend {
        Backend::Sqlite => "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = 'invocations_status'",
        Backend::Postgres => "SELECT indexdef::text FROM pg_indexes WHERE indexname = 'invocations_status'",
    };
    let definition: String = sqlx::query_scalar(status_index_sql).fetch_one(&pool).await.unwrap();
    for status in ["awaiting_approval", "queued", "running"] {
        assert!(definition.contains(&format!("'{status}'")), "{definition}");
    }
    assert!(!definition.contains("completed"), "{definition}");
    // Foreign keys still hold: a row naming a missing parent is refused…
    let orphan = exec(
        &pool,
        format!(
            "INSERT INTO evidence (id, run_id, invocation_id, owner_id, tool_id, kind, provenance, content_sha256,
                excerpt, created_at) VALUES ('evd_2', 'run_1', 'inv_missing', 'usr_1', 't', 'k', '{{}}', 's', 'e', '{t}')"
        ),
    )
    .await
    .expect_err("an evidence row naming no invocation");
    assert!(
        matches!(orphan.as_database_error().map(|e| e.kind()), Some(sqlx::error::ErrorKind::ForeignKeyViolation)),
        "{orphan}"
    );
    // …and deleting a session still cascades to its chunks and reports.
    exec(&pool, "DELETE FROM terminal_sessions WHERE id = 'term_1'".to_owned()).await.unwrap();
    assert_eq!((count("terminal_chunks").await, count("terminal_reports").await), (0, 0));
    if backend == Backend::Sqlite {
        let dangling: Vec<(String,)> =
            sqlx::query_as("SELECT \"table\" FROM pragma_foreign_key_check").fetch_all(&pool).await.unwrap();
        assert!(dangling.is_empty(), "{dangling:?}");
    }
    pool.close().await;
    store.close().await;
}

both_backends!(states_outside_the_enums_are_refused, state_checks_keep_existing_rows);
