//! Tool inputs (issue 15): each core tool's input schema is generated from its input type, and
//! the change from hand-written schemas and `str_field` look-ups changed nothing a caller sees.
//!
//! - `tool_schemas_stay_the_same`: every core tool's `input_schema` equals the stored snapshot
//!   `fixtures/tool_schemas.json` (recorded from the hand-written schemas before the change:
//!   descriptions, limits, enums and required lists).
//! - `frozen_inputs_stay_the_same`: a set of calls freezes the same canonical input (and so the
//!   same input hash) as before the change (`fixtures/frozen_inputs.json`, the workspace root
//!   written as `<ws>`).
//! - `schemas_take_their_examples`: each schema validates the example calls and refuses an
//!   unknown field.
//!
//! `MIRA_RECORD_INPUTS=1` rewrites the two snapshots from the running code (only when a change
//! is meant).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{Backend, spawn};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/fixtures").join(name)
}

fn recording() -> bool {
    std::env::var("MIRA_RECORD_INPUTS").is_ok_and(|v| v == "1")
}

/// Compares `actual` with the snapshot `name` (or records it).
fn snapshot(name: &str, actual: &Value) {
    let path = fixture(name);
    if recording() {
        std::fs::write(&path, serde_json::to_string_pretty(actual).unwrap() + "\n").unwrap();
        return;
    }
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let (Value::Object(e), Value::Object(a)) = (&expected, actual) else { panic!("snapshots are objects") };
    let mut differ = Vec::new();
    for key in e.keys().chain(a.keys().filter(|k| !e.contains_key(*k))) {
        if e.get(key) != a.get(key) {
            differ.push(format!(
                "{key}:\n  expected {}\n  actual   {}",
                e.get(key).map_or("(none)".into(), Value::to_string),
                a.get(key).map_or("(none)".into(), Value::to_string)
            ));
        }
    }
    assert!(differ.is_empty(), "{name} differs:\n{}", differ.join("\n"));
}

/// Core tools: every registered tool but MCP projections and test tools.
fn core_schemas(t: &crate::common::TestApp) -> BTreeMap<String, Value> {
    t.app()
        .registry
        .all()
        .iter()
        .filter(|e| !e.spec().id.starts_with("mcp:"))
        .map(|e| (e.spec().id.clone(), e.spec().input_schema.clone()))
        .collect()
}

#[tokio::test]
async fn tool_schemas_stay_the_same() {
    let t = spawn(Backend::Sqlite).await;
    let schemas = core_schemas(&t);
    assert!(schemas.len() >= 10, "{:?}", schemas.keys());
    snapshot("tool_schemas.json", &json!(schemas));
}

/// Calls whose frozen input is compared, by name: (tool, input).
fn calls() -> Vec<(&'static str, &'static str, Value)> {
    vec![
        ("discover_default", "read_discover", json!({})),
        (
            "discover_full",
            "read_discover",
            json!({"query": "a", "path": "src", "kind": "file", "max_depth": 3, "limit": 5}),
        ),
        ("discover_cursor", "read_discover", json!({"path": "./src/", "cursor": "o2", "kind": "dir"})),
        ("open_default", "read_open", json!({"path": "a.txt"})),
        ("open_range", "read_open", json!({"path": "./a.txt", "start_line": 2, "end_line": 3, "max_bytes": 10})),
        ("open_float", "read_open", json!({"path": "a.txt", "start_line": 2.0})),
        ("grep_default", "grep", json!({"pattern": "two"})),
        (
            "grep_full",
            "grep",
            json!({"pattern": "t.o", "path": "src", "literal": false, "case_insensitive": true,
            "glob": "*.rs", "context": 2, "limit": 7, "max_per_file": 3}),
        ),
        ("grep_globs", "grep", json!({"pattern": "x", "glob": ["*.rs", "!b.rs"], "literal": true})),
        ("explore_definitions", "codebase_explore", json!({"kind": "definitions", "symbol": "main"})),
        (
            "explore_references",
            "codebase_explore",
            json!({"kind": "references", "path": "src/b.rs", "line": 1, "column": 4}),
        ),
        ("explore_impact", "codebase_explore", json!({"kind": "impact", "path": "src/b.rs", "depth": 2, "limit": 9})),
        ("explore_overview", "codebase_explore", json!({"kind": "overview", "max_tokens": 500})),
        ("write_new", "write_file", json!({"path": "new.txt", "content": "hello\n"})),
        ("write_dirs", "write_file", json!({"path": "d/e/new.txt", "content": "x", "create_dirs": true})),
        (
            "write_over",
            "write_file",
            json!({"path": "a.txt", "content": "y",
            "expected_sha256": "B6285C57E8797DB5D4C51C80D6F11938AFDA9B11C6A003549709189E9B4B92A2"}),
        ),
        ("replace_one", "replace_block", json!({"path": "a.txt", "old": "two", "new": "2"})),
        (
            "replace_many",
            "replace_block",
            json!({"path": "src/b.rs", "old": "x", "new": "y", "expected_occurrences": 2}),
        ),
        ("delete_file", "delete_path", json!({"path": "a.txt"})),
        ("delete_dir", "delete_path", json!({"path": "src", "recursive": true})),
        ("move_file", "move_path", json!({"from": "a.txt", "to": "c.txt"})),
        ("move_over", "move_path", json!({"from": "a.txt", "to": "src/b.rs", "overwrite": true})),
        (
            "term_start",
            "terminal_session",
            json!({"action": "start", "command": "echo", "args": ["hi"], "cwd": "src",
            "env": {"A": "1", "B": null}, "timeout_ms": 5000, "cols": 80, "rows": 24, "settle_ms": 0}),
        ),
        ("term_start_default", "terminal_session", json!({"action": "start", "command": "ls"})),
        ("term_input", "terminal_session", json!({"action": "input", "session_id": "pty_1", "data": "ls\n"})),
        (
            "term_input_settle",
            "terminal_session",
            json!({"action": "input", "session_id": "pty_1", "data": "", "settle_ms": 7}),
        ),
        ("term_signal", "terminal_session", json!({"action": "signal", "session_id": "pty_1", "signal": "eof"})),
        (
            "term_resize",
            "terminal_session",
            json!({"action": "resize", "session_id": "pty_1", "cols": 100, "rows": 30}),
        ),
        ("term_wait", "terminal_session", json!({"action": "wait", "session_id": "pty_1"})),
        (
            "term_wait_idle",
            "terminal_session",
            json!({"action": "wait", "session_id": "pty_1", "until": "idle", "timeout_ms": 900000}),
        ),
        (
            "term_wait_idle_ms",
            "terminal_session",
            json!({"action": "wait", "session_id": "pty_1", "until": "idle", "idle_ms": 20}),
        ),
        ("term_kill", "terminal_session", json!({"action": "kill", "session_id": "pty_1"})),
        ("term_output", "terminal_session", json!({"action": "output", "session_id": "pty_1"})),
        (
            "term_output_page",
            "terminal_session",
            json!({"action": "output", "session_id": "pty_1", "from": 3, "to": 90, "max_bytes": 10}),
        ),
        (
            "term_output_search",
            "terminal_session",
            json!({"action": "output", "session_id": "pty_1", "pattern": "e+", "max_matches": 4}),
        ),
        (
            "term_output_search_ci",
            "terminal_session",
            json!({"action": "output", "session_id": "pty_1", "pattern": "E", "case_insensitive": true}),
        ),
    ]
}

/// Replaces the workspace root (`<ws>`) or the session id (`<session>`) in every string of
/// `v`.
fn placeholder(v: &Value, root: &str) -> Value {
    let name = if root.starts_with('/') { "<ws>" } else { "<session>" };
    match v {
        Value::String(s) => Value::String(s.replace(root, name)),
        Value::Array(a) => Value::Array(a.iter().map(|x| placeholder(x, root)).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), placeholder(x, root))).collect()),
        other => other.clone(),
    }
}

#[tokio::test]
async fn frozen_inputs_stay_the_same() {
    let t = spawn(Backend::Sqlite).await;
    std::fs::write(t.workspace.join("a.txt"), "one\ntwo\nthree\n").unwrap();
    std::fs::create_dir_all(t.workspace.join("src")).unwrap();
    std::fs::write(t.workspace.join("src/b.rs"), "fn main() { let x = 1; let x = 2; }\n").unwrap();
    t.code_graph_ready().await;
    let token = t.admin_token.clone();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read, edit and run commands").await;
    let root = t.workspace.to_string_lossy().into_owned();
    // The session the actions on a session go to (`pty_1` in `calls`, `<session>` in the
    // snapshot).
    let start =
        t.call(&token, &run, &turn, "terminal_session", "session", json!({"action": "start", "command": "cat"})).await;
    assert_eq!(start.status, StatusCode::CREATED, "{start:?}");
    let grant = t
        .post(
            &format!("/v1/approvals/{}/grant", start.body["approval_id"].as_str().unwrap()),
            &token,
            json!({"tool_id": "terminal_session", "tool_call_id": "session", "input_hash": start.body["input_hash"]}),
        )
        .await;
    assert_eq!(grant.status, StatusCode::OK, "{grant:?}");
    let started = t.wait_final(&token, start.body["invocation_id"].as_str().unwrap()).await;
    let session = started["result"]["output"]["session_id"].as_str().expect("a session").to_owned();
    let mut frozen = serde_json::Map::new();
    for (name, tool, input) in calls() {
        let input: Value = serde_json::from_str(&input.to_string().replace("pty_1", &session)).unwrap();
        let r = t.call(&token, &run, &turn, tool, name, input).await;
        assert_eq!(r.status, StatusCode::CREATED, "{name}: {r:?}");
        let mut input = placeholder(&placeholder(&r.body["input"], &root), &session);
        // What `start` resolves from this machine (its PATH, its environment, its sandbox)
        // is left out; what the call gave is compared.
        if let Some(o) = input.as_object_mut().filter(|o| o.get("action") == Some(&json!("start"))) {
            for machine in ["program", "sandbox"] {
                o.remove(machine);
            }
            if let Some(Value::Object(env)) = o.get_mut("env") {
                env.retain(|k, _| k == "A" || k == "B");
            }
        }
        let paths_free = !r.body["input"].to_string().contains(&root) && tool != "terminal_session";
        let hash = if paths_free { r.body["input_hash"].clone() } else { Value::Null };
        frozen.insert(name.to_owned(), json!({"tool": tool, "input": input, "input_hash": hash}));
    }
    snapshot("frozen_inputs.json", &Value::Object(frozen));
}

/// Example calls of each tool, all valid.
fn examples() -> Vec<(&'static str, Value)> {
    let mut out: Vec<(&str, Value)> = calls().into_iter().map(|(_, tool, input)| (tool, input)).collect();
    out.extend([
        ("web_search", json!({"query": "rust", "count": 5, "freshness": "week", "site": "docs.rs", "language": "pt-BR"})),
        ("web_search", json!({"query": "x"})),
        ("news_search", json!({"query": "rust", "since": "7d", "until": "2025-06-10", "source": "feed", "sort": "time", "limit": 3})),
        ("news_search", json!({"query": "x"})),
    ]);
    out
}

#[tokio::test]
async fn schemas_take_their_examples() {
    let t = spawn(Backend::Sqlite).await;
    let registry = &t.app().registry;
    let mut seen = std::collections::BTreeSet::new();
    for (tool, input) in examples() {
        let entry = registry.get_any(tool).unwrap_or_else(|| panic!("{tool} is registered"));
        assert_eq!(entry.validate(&input), Ok(()), "{tool} takes {input}");
        let mut unknown = input.clone();
        unknown["no_such_field"] = json!(1);
        assert!(entry.validate(&unknown).is_err(), "{tool} refuses an unknown field");
        seen.insert(tool);
    }
    // Every public core tool has examples (legacy entries take any object on purpose).
    for (id, _) in core_schemas(&t) {
        let kind = registry.get_any(&id).unwrap().spec().kind;
        if kind == mira::registry::ToolKind::Public {
            assert!(seen.contains(id.as_str()), "{id} has no example");
        }
    }
    // A few wrong inputs each schema refuses: a missing required field, a value out of range,
    // a value outside an enum.
    for (tool, input) in [
        ("read_open", json!({})),
        ("read_open", json!({"path": "a", "max_bytes": 0})),
        ("read_discover", json!({"kind": "socket"})),
        ("grep", json!({"pattern": "x", "glob": [1]})),
        ("codebase_explore", json!({"kind": "everything"})),
        ("write_file", json!({"path": "a"})),
        ("write_file", json!({"path": "a", "content": "", "expected_sha256": "abc"})),
        ("replace_block", json!({"path": "a", "old": "", "new": "x"})),
        ("move_path", json!({"from": "a"})),
        ("delete_path", json!({"path": ""})),
        ("terminal_session", json!({"session_id": "x"})),
        ("terminal_session", json!({"action": "start", "cols": 1})),
        ("terminal_session", json!({"action": "signal", "session_id": "x", "signal": "hup"})),
        ("terminal_session", json!({"action": "start", "env": {"A": 1}})),
        ("web_search", json!({"query": "x", "freshness": "hour"})),
        ("news_search", json!({"query": "x", "sort": "random"})),
    ] {
        let entry = registry.get_any(tool).unwrap();
        assert!(entry.validate(&input).is_err(), "{tool} refuses {input}");
    }
}
