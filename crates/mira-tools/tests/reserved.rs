//! The server's own folders (its data dir: admin token, secret key, database) where they lie
//! inside a workspace, as with `mira serve`'s defaults: `read_discover` neither lists nor
//! walks them, and no Edit tool deletes or moves a folder that holds one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use mira_core::commit::CommitGate;
use mira_core::error_code::ErrorCode;
use mira_core::tool::{ExecContext, PrepareContext, Tool, ToolError, ToolOutput};
use mira_core::workspace::{self, Workspace};
use mira_tools::edit::delete_path::DeletePath;
use mira_tools::edit::fs::{Parents, locate, walk_tree};
use mira_tools::edit::move_path::MovePath;
use mira_tools::read::discover::ReadDiscover;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// A fresh workspace `<tmp>/ws` holding `srv/data` (with an `admin.token`; reserved when
/// `reserved`) and `other/notes.txt`; returns the folder to remove and the workspace.
fn layout(name: &str, reserved: bool) -> (PathBuf, Workspace) {
    let base = std::env::temp_dir().join(format!("mira-reserved-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let ws = base.join("ws");
    std::fs::create_dir_all(ws.join("srv/data")).unwrap();
    std::fs::create_dir_all(ws.join("other")).unwrap();
    std::fs::write(ws.join("srv/data/admin.token"), "ADMIN-TOKEN\n").unwrap();
    std::fs::write(ws.join("srv/readme.txt"), "beside the data dir\n").unwrap();
    std::fs::write(ws.join("other/notes.txt"), "notes\n").unwrap();
    std::os::unix::fs::symlink("srv", ws.join("s")).unwrap();
    std::os::unix::fs::symlink("srv/data", ws.join("d")).unwrap();
    if reserved {
        workspace::reserve(&ws.join("srv/data")).unwrap();
    }
    (base, Workspace::open(&ws).unwrap())
}

fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

fn prepare(tool: &dyn Tool, ws: &Workspace, input: Value) -> Result<Value, ToolError> {
    let ctx = PrepareContext { workspace: Some(ws), owner_id: "usr_test", run_id: "run_test" };
    run(tool.prepare(input, &ctx)).map(|p| p.input)
}

fn execute(tool: &dyn Tool, ws: &Workspace, input: &Value) -> Result<ToolOutput, ToolError> {
    let ctx = ExecContext {
        workspace: Some(ws.clone()),
        owner_id: "usr_test".into(),
        run_id: "run_test".into(),
        invocation_id: "inv_test".into(),
        cancel: CancellationToken::new(),
        commit: CommitGate::new(),
    };
    run(tool.execute(input, &ctx))
}

fn assert_reserved(r: Result<impl std::fmt::Debug, ToolError>, what: &str) {
    let e = r.expect_err(what);
    assert_eq!((e.code, &e.details["reserved"]), (ErrorCode::OutsideWorkspace, &json!(true)), "{what}: {e}");
}

fn listed(out: &ToolOutput) -> Vec<String> {
    out.output["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap().to_owned()).collect()
}

/// `read_discover` lists neither the data dir nor anything in it — from the root, from the
/// folder holding it (also through a symlink to that folder), by a name query — and starting
/// in it (also through a symlink to it) is `outside_workspace`.
#[test]
fn read_discover_does_not_list_the_data_dir() {
    let (base, ws) = layout("discover", true);
    let discover = ReadDiscover::new();
    for input in [
        json!({}),
        json!({"path": "srv"}),
        json!({"path": "s"}),
        json!({"query": "admin token"}),
        json!({"kind": "dir"}),
    ] {
        let frozen = prepare(&discover, &ws, input.clone()).unwrap();
        let out = execute(&discover, &ws, &frozen).unwrap();
        let paths = listed(&out);
        assert!(paths.iter().all(|p| !p.contains("data") && !p.contains("admin.token")), "{input}: {paths:?}");
        assert!(!out.evidence[0].excerpt.contains("admin.token"), "{input}: {:?}", out.evidence[0].excerpt);
    }
    let all = listed(&execute(&discover, &ws, &prepare(&discover, &ws, json!({})).unwrap()).unwrap());
    assert!(all.contains(&"srv/readme.txt".to_owned()) && all.contains(&"other/notes.txt".to_owned()), "{all:?}");
    for path in ["srv/data", "srv/data/.", "d", "s/data"] {
        let r = prepare(&discover, &ws, json!({"path": path})).and_then(|f| execute(&discover, &ws, &f));
        assert_reserved(r, path);
    }
    std::fs::remove_dir_all(&base).unwrap();
}

/// A recursive delete or a move of a folder that holds the data dir would take it along:
/// refused when the target is located (at freeze and again at execution) and when its tree is
/// walked, while the folder beside it is deleted as usual.
#[test]
fn a_folder_holding_the_data_dir_is_neither_deleted_nor_moved() {
    let (base, ws) = layout("holding", true);
    let root = base.join("ws");
    for rel in ["srv", "srv/data", "srv/data/admin.token"] {
        assert_reserved(locate(&ws, rel, Parents::MustExist).map(|l| l.name), rel);
    }
    assert_reserved(walk_tree(ws.dir(), "srv", "srv").map(|t| t.files), "walk srv");
    assert!(walk_tree(ws.dir(), "other", "other").is_ok());

    let delete = DeletePath::new();
    let moving = MovePath::new();
    assert_reserved(prepare(&delete, &ws, json!({"path": "srv", "recursive": true})), "delete srv");
    assert_reserved(prepare(&moving, &ws, json!({"from": "srv", "to": "moved"})), "move srv");
    // Frozen before its folder was the data dir (a call approved earlier): refused at
    // execution.
    let (later, later_ws) = layout("holding-later", false);
    let frozen = prepare(&delete, &later_ws, json!({"path": "srv", "recursive": true})).unwrap();
    workspace::reserve(&later.join("ws/srv/data")).unwrap();
    assert_reserved(execute(&delete, &later_ws, &frozen), "delete srv at execution");
    assert!(later.join("ws/srv/data/admin.token").is_file());

    // Nothing moved or went; the folder beside it is deleted as usual.
    assert!(root.join("srv/data/admin.token").is_file() && !root.join("moved").exists());
    let frozen = prepare(&delete, &ws, json!({"path": "other", "recursive": true})).unwrap();
    execute(&delete, &ws, &frozen).unwrap();
    assert!(!Path::new(&root.join("other")).exists());
    std::fs::remove_dir_all(&base).unwrap();
    std::fs::remove_dir_all(&later).unwrap();
}
