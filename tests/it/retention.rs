//! Retention (`--retention-days`, src/retention.rs): runs idle past the cut-off go with
//! everything that belongs to them; recent runs, runs touched since, and runs with a call
//! waiting or running stay; a removed run answers 404; SQLite gives the pages back. Also
//! prints the database bytes one frozen and executed `read_open` call takes on each back-end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{self, Backend, Options, TestApp};

/// Freezes `calls` `read_open` calls in a new run and waits until all are executed.
async fn completed_run(t: &TestApp, token: &str, calls: usize) -> (String, Vec<String>) {
    let run = t.run(token).await;
    let (turn, _) = t.turn(token, &run, "read the notes").await;
    let mut ids = Vec::new();
    for c in 0..calls {
        let r = t.call(token, &run, &turn, "read_open", &format!("c{c}"), json!({"path": "notes.txt"})).await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        ids.push(r.body["invocation_id"].as_str().unwrap().to_owned());
    }
    for id in &ids {
        assert_eq!(t.wait_final(token, id).await["status"], "completed");
    }
    (run, ids)
}

/// A run whose one call waits for approval.
async fn waiting_run(t: &TestApp, token: &str) -> (String, String) {
    let run = t.run(token).await;
    let (turn, _) = t.turn(token, &run, "write a file").await;
    let r = t.call(token, &run, &turn, "write_file", "w1", json!({"path": "out.txt", "content": "x"})).await;
    assert_eq!((r.status, r.body["status"].as_str()), (StatusCode::CREATED, Some("awaiting_approval")), "{r:?}");
    (run, r.body["invocation_id"].as_str().unwrap().to_owned())
}

/// Waits until the store's clock reads later than `t` (times have millisecond precision).
async fn after(t: &str) -> String {
    loop {
        let now = mira::ids::now();
        if now.as_str() > t {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

async fn gone(t: &TestApp, token: &str, run: &str, invocation: &str) {
    for path in [format!("/v1/runs/{run}"), format!("/v1/runs/{run}/events"), format!("/v1/invocations/{invocation}")] {
        let r = t.get(&path, token).await;
        assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{path}: {r:?}");
    }
}

async fn sweep_removes_old_runs_and_keeps_recent_and_active(backend: Backend) {
    let t = common::spawn(backend).await;
    std::fs::write(t.workspace.join("notes.txt"), "one\ntwo\nthree\n").unwrap();
    let token = t.user("ret").await;
    let store = t.app().store.clone();

    // Disk per call: 100 frozen and executed read_open calls in one run.
    const CALLS: usize = 100;
    let before = store.database_bytes().await.unwrap();
    let mut old = vec![completed_run(&t, &token, CALLS).await];
    let grown = store.database_bytes().await.unwrap() - before;
    eprintln!(
        "disk per frozen+executed read_open call ({backend:?}): {} bytes ({grown} bytes for {CALLS} calls, database file)",
        grown / CALLS as i64
    );
    old.push(completed_run(&t, &token, 2).await);
    old.push(completed_run(&t, &token, 1).await);
    let (active, waiting) = waiting_run(&t, &token).await;
    let (touched, _) = completed_run(&t, &token, 1).await;

    let cutoff = after(&mira::ids::now()).await;
    after(&cutoff).await;
    // Touched since the cut-off: a new turn.
    let (_, _) = t.turn(&token, &touched, "again").await;
    let (recent, _) = completed_run(&t, &token, 1).await;
    let full = store.database_bytes().await.unwrap();

    // Task vectors of learning from use (docs/architecture.md): the removed turns' go with them.
    let owner = t.get("/v1/me", &token).await.body["id"].as_str().unwrap().to_owned();
    let (read_key, kept_key) =
        (mira::store::task_key(&owner, "read the notes"), mira::store::task_key(&owner, "write a file"));
    store
        .put_tool_vectors(
            "m",
            mira::state::VectorKind::Task,
            &[(read_key.clone(), vec![1.0, 0.0]), (kept_key.clone(), vec![0.0, 1.0])],
        )
        .await
        .unwrap();

    let report = mira::retention::sweep(&store, &cutoff, 2).await.unwrap();
    assert_eq!(report.removed.runs, 3, "{report:?}");
    let left: Vec<String> =
        store.tool_vectors("m", &[read_key, kept_key.clone()]).await.unwrap().into_iter().map(|(k, _)| k).collect();
    assert_eq!(left, vec![kept_key], "the removed turns' task vector is gone, the active run's stays");
    assert_eq!(report.batches, 2, "two runs per batch: {report:?}");
    assert_eq!(report.removed.invocations, CALLS as u64 + 3, "{report:?}");
    assert_eq!(report.removed.turns, 3, "{report:?}");
    assert!(report.removed.events > report.removed.invocations, "{report:?}");
    assert!(report.removed.evidence > 0, "{report:?}");
    for (run, calls) in &old {
        gone(&t, &token, run, &calls[0]).await;
    }
    for run in [&active, &touched, &recent] {
        assert_eq!(t.get(&format!("/v1/runs/{run}"), &token).await.status, StatusCode::OK);
    }
    assert_eq!(t.get(&format!("/v1/invocations/{waiting}"), &token).await.body["status"], "awaiting_approval");
    let runs = t.get("/v1/runs", &token).await;
    let listed: Vec<&str> = runs.body["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(listed.len(), 3, "{listed:?}");

    let shrunk = store.database_bytes().await.unwrap();
    match backend {
        // A new SQLite file is auto_vacuum=INCREMENTAL: the pages go back to the file system.
        Backend::Sqlite => {
            assert_eq!(store.sqlite_auto_vacuum().await.unwrap(), Some(2));
            assert_eq!(report.free_pages, 0, "{report:?}");
            assert!(shrunk < full, "the file shrank: {full} -> {shrunk} bytes");
        }
        // Postgres: deleted rows' space is reused after (auto)vacuum; the size does not drop.
        Backend::Postgres => assert_eq!(report.free_pages, 0),
    }
    eprintln!("database after retention ({backend:?}): {full} -> {shrunk} bytes");

    let again = mira::retention::sweep(&store, &cutoff, 2).await.unwrap();
    assert_eq!(again.removed.runs, 0, "nothing left to remove: {again:?}");
}

async fn the_background_job_removes_idle_runs(backend: Backend) {
    let mut options = Options::default();
    options.runtime.retention = Some(mira::retention::RetentionPolicy {
        max_age: Duration::from_secs(1),
        interval: Duration::from_millis(100),
        batch: 10,
    });
    let t = common::spawn_with(backend, options).await;
    std::fs::write(t.workspace.join("notes.txt"), "one\n").unwrap();
    let token = t.user("ret").await;
    let (old, calls) = completed_run(&t, &token, 1).await;
    let (active, waiting) = waiting_run(&t, &token).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while t.get(&format!("/v1/runs/{old}"), &token).await.status == StatusCode::OK {
        assert!(Instant::now() < deadline, "the idle run was not removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gone(&t, &token, &old, &calls[0]).await;
    // As old as the removed one, but its call waits for approval.
    let r = t.get(&format!("/v1/invocations/{waiting}"), &token).await;
    assert_eq!((r.status, r.body["status"].clone()), (StatusCode::OK, Value::from("awaiting_approval")), "{r:?}");
    assert_eq!(t.get(&format!("/v1/runs/{active}"), &token).await.status, StatusCode::OK);
}

both_backends!(sweep_removes_old_runs_and_keeps_recent_and_active, the_background_job_removes_idle_runs);
