#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `codebase_explore` end to end over HTTP on SQLite and Postgres (availability while the
//! index builds, every query kind, evidence, unknown symbols, restart without re-parsing), and
//! the index itself on real files: incremental updates through the watcher, stale candidates,
//! the bad inputs of the issue (syntax errors, a 20 MB minified file, symlink loops, binary,
//! generated and vendored files) and a generated many-file workspace with progress,
//! cancellation and bounded memory.

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Backend, spawn};
use mira::tools::codebase::index::{CodeGraphs, IndexConfig, Phase, WorkspaceIndex};
use mira::tools::codebase::resolve::ModuleGraph;
use mira::workspace::Workspace;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn sample_project(root: &Path) {
    write(
        root,
        "src/lib.rs",
        "mod store;\nuse crate::store::Store;\n\npub fn serve() {\n    let s = Store::open();\n    s.save();\n    helper();\n}\n\nfn helper() {}\n",
    );
    write(
        root,
        "src/store.rs",
        "pub struct Store;\n\nimpl Store {\n    pub fn open() -> Store {\n        Store\n    }\n\n    pub fn save(&self) {\n        self.flush();\n    }\n\n    fn flush(&self) {}\n}\n",
    );
    write(
        root,
        "py/app.py",
        "from .util import clean\n\nclass App:\n    def run(self):\n        return clean(self.name())\n\n    def name(self):\n        return 'x'\n",
    );
    write(root, "py/util.py", "def clean(s):\n    return s.strip()\n");
    write(root, "web/main.ts", "import { fmt } from './fmt';\nexport function render(): string { return fmt('a'); }\n");
    write(root, "web/fmt.ts", "export function fmt(s: string): string { return s; }\n");
    write(
        root,
        "go/srv/srv.go",
        "package srv\n\ntype Server struct{}\n\nfunc (s *Server) Start() { s.listen() }\n\nfunc (s *Server) listen() {}\n",
    );
}

async fn wait_available(t: &common::TestApp, token: &str, turn: &str) -> Value {
    for _ in 0..400 {
        let v = t.get(&format!("/v1/tools/codebase_explore?turn={turn}"), token).await;
        if v.body["state"] == "available" || v.body["state"] == "exposed" {
            return v.body;
        }
        assert_eq!(v.body["state"], "unavailable", "{v:?}");
        assert_eq!(v.body["reason"]["code"], "index_building", "{v:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the code graph never became available");
}

async fn explore(t: &common::TestApp, token: &str, run: &str, turn: &str, id: &str, input: Value) -> Value {
    let r = t.call(token, run, turn, "codebase_explore", id, input).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let done = t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    done
}

fn names(out: &Value) -> Vec<String> {
    let mut v: Vec<String> =
        out["results"].as_array().unwrap().iter().map(|r| r["qualified_name"].as_str().unwrap().to_owned()).collect();
    v.sort();
    v
}

async fn explore_over_http(backend: Backend) {
    let mut t = spawn(backend).await;
    sample_project(&t.workspace);
    let token = t.user("ada").await;
    let run = t.run(&token).await;
    // The first question about the workspace starts its index: not exposed in this turn.
    let (turn, exposure) = t.turn(&token, &run, "what calls Store::save").await;
    assert!(!exposure.to_string().contains("codebase_explore"), "{exposure}");
    let r = t.call(&token, &run, &turn, "codebase_explore", "early", json!({"kind": "overview"})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert!(matches!(r.code(), "unavailable" | "not_exposed"), "{r:?}");
    let view = wait_available(&t, &token, &turn).await;
    assert_eq!(view["state"], "available", "ready but not exposed in the turn that saw it building");

    let (turn, exposure) = t.turn(&token, &run, "what calls Store::save").await;
    assert!(exposure.to_string().contains("codebase_explore"), "{exposure}");

    let done = explore(&t, &token, &run, &turn, "d1", json!({"kind": "definitions", "symbol": "Store::save"})).await;
    let out = &done["result"]["output"];
    let hit = &out["results"][0];
    assert_eq!(
        (hit["path"].as_str(), hit["line"].as_u64(), hit["kind"].as_str()),
        (Some("src/store.rs"), Some(8), Some("method"))
    );
    assert_eq!(hit["verification"]["status"], "verified");
    let sha = mira::evidence::sha256_hex(&std::fs::read(t.workspace.join("src/store.rs")).unwrap());
    assert_eq!(hit["verification"]["file_sha256"], sha);
    let ev = t.get(&format!("/v1/evidence/{}", done["evidence_ids"][0].as_str().unwrap()), &token).await;
    assert_eq!(ev.body["kind"], "code_location");
    assert_eq!(ev.body["content_sha256"], sha);
    assert_eq!(ev.body["provenance"]["start_line"], 8);
    assert!(ev.body["excerpt"].as_str().unwrap().contains("pub fn save(&self)"), "{ev:?}");

    let out = explore(&t, &token, &run, &turn, "c1", json!({"kind": "callers", "symbol": "Store::save"})).await;
    assert_eq!(names(&out["result"]["output"]), ["serve"]);
    let out =
        explore(&t, &token, &run, &turn, "c2", json!({"kind": "callers", "symbol": "Store::flush", "depth": 3})).await;
    assert_eq!(names(&out["result"]["output"]), ["Store::save", "serve"]);
    let out = explore(&t, &token, &run, &turn, "c3", json!({"kind": "callees", "symbol": "serve"})).await;
    assert_eq!(names(&out["result"]["output"]), ["Store::open", "Store::save", "helper"]);
    let out = explore(&t, &token, &run, &turn, "c4", json!({"kind": "callers", "symbol": "clean"})).await;
    assert_eq!(names(&out["result"]["output"]), ["App::run"]);
    let out = explore(&t, &token, &run, &turn, "c5", json!({"kind": "callers", "symbol": "fmt"})).await;
    assert_eq!(names(&out["result"]["output"]), ["render"]);
    let out = explore(&t, &token, &run, &turn, "c6", json!({"kind": "callees", "symbol": "Server.Start"})).await;
    assert_eq!(names(&out["result"]["output"]), ["Server::listen"]);

    let out = explore(
        &t,
        &token,
        &run,
        &turn,
        "r1",
        json!({"kind": "references", "path": "src/store.rs", "line": 1, "column": 12}),
    )
    .await;
    let refs = &out["result"]["output"];
    assert_eq!(refs["symbol"], "Store");
    assert!(refs["results"].as_array().unwrap().iter().any(|r| r["path"] == "src/lib.rs" && r["line"] == 5), "{refs}");

    let out = explore(&t, &token, &run, &turn, "dep", json!({"kind": "dependencies", "path": "src/store.rs"})).await;
    let deps = &out["result"]["output"];
    assert_eq!(deps["imported_by"].as_array().unwrap().len(), 2, "{deps}");
    assert!(deps["imported_by"].as_array().unwrap().iter().all(|e| e["from"] == "src/lib.rs"));

    let out = explore(&t, &token, &run, &turn, "imp", json!({"kind": "impact", "symbol": "Store::flush"})).await;
    let imp = &out["result"]["output"]["results"];
    assert_eq!(imp[0]["qualified_name"], "Store::save");
    assert_eq!(imp[0]["distance"], 1);
    assert!(imp.as_array().unwrap().iter().any(|r| r["qualified_name"] == "serve" && r["distance"] == 2), "{imp}");

    let out = explore(&t, &token, &run, &turn, "ov", json!({"kind": "overview", "max_tokens": 512})).await;
    let ov = &out["result"]["output"];
    let modules: Vec<&str> = ov["modules"].as_array().unwrap().iter().map(|m| m["module"].as_str().unwrap()).collect();
    for m in ["src/", "py/", "web/", "go/"] {
        assert!(modules.contains(&m), "{ov}");
    }
    assert!(ov["map"].as_str().unwrap().len() <= 512 * 4);
    assert!(ov["edges"].as_array().unwrap().is_empty() || ov["edges"][0]["weight"].is_number());

    // Unknown symbol: an empty result with suggestions, not an error.
    let out = explore(&t, &token, &run, &turn, "u1", json!({"kind": "callers", "symbol": "Store::sav"})).await;
    let unk = &out["result"]["output"];
    assert_eq!(unk["results"], json!([]));
    assert!(unk["suggestions"].as_array().unwrap().iter().any(|s| s == "save"), "{unk}");
    // Missing required fields per kind → 400 with a stable code, nothing frozen.
    let r = t.call(&token, &run, &turn, "codebase_explore", "bad1", json!({"kind": "callers"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "missing_field"), "{r:?}");
    let r = t
        .call(&token, &run, &turn, "codebase_explore", "bad2", json!({"kind": "dependencies", "path": "../etc"}))
        .await;
    assert_eq!(r.code(), "outside_workspace", "{r:?}");
    let r = t.call(&token, &run, &turn, "codebase_explore", "bad3", json!({"kind": "everything"})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");

    // An edit on disk (what an Edit tool does) is picked up before the next query.
    write(
        &t.workspace,
        "src/store.rs",
        "pub struct Store;\n\nimpl Store {\n    pub fn open() -> Store {\n        Store\n    }\n\n    // moved down by a line\n    pub fn save(&self) {\n        self.flush();\n    }\n\n    fn flush(&self) {}\n\n    pub fn compact(&self) {}\n}\n",
    );
    let mut found = false;
    for i in 0..100 {
        let out =
            explore(&t, &token, &run, &turn, &format!("e{i}"), json!({"kind": "definitions", "symbol": "compact"}))
                .await;
        if out["result"]["output"]["results"].as_array().is_some_and(|r| !r.is_empty()) {
            found = true;
            let save = explore(
                &t,
                &token,
                &run,
                &turn,
                &format!("s{i}"),
                json!({"kind": "definitions", "symbol": "Store::save"}),
            )
            .await;
            assert_eq!(save["result"]["output"]["results"][0]["line"], 9);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(found, "the edit was not indexed");

    // A restart reads the index file: nothing is parsed again.
    t.restart().await;
    let (turn, _) = t.turn(&token, &run, "again").await;
    wait_available(&t, &token, &turn).await;
    let (turn, _) = t.turn(&token, &run, "again").await;
    let out =
        explore(&t, &token, &run, &turn, "after-restart", json!({"kind": "definitions", "symbol": "compact"})).await;
    // (The edited file is parsed again only if the index file was saved before the edit
    // reached it; every unchanged file is reused.)
    let index = &out["result"]["output"]["index"];
    assert!(index["parsed_at_start"].as_u64().unwrap() <= 1, "{index}");
    assert_eq!(index["reused_at_start"].as_u64().unwrap() + index["parsed_at_start"].as_u64().unwrap(), 7, "{index}");
    assert_eq!(out["result"]["output"]["results"][0]["path"], "src/store.rs");
}

both_backends!(explore_over_http);

fn config(watch: bool) -> IndexConfig {
    IndexConfig { watch, workers: 2, ..IndexConfig::default() }
}

fn ready(graphs: &CodeGraphs, root: &Path) -> Arc<WorkspaceIndex> {
    let ix = graphs.ensure(root).unwrap();
    let t = Instant::now();
    while ix.phase() != Phase::Ready {
        assert!(t.elapsed() < Duration::from_secs(60), "not ready: {:?}", ix.phase());
        assert!(!matches!(ix.phase(), Phase::Failed { .. } | Phase::Cancelled), "{:?}", ix.phase());
        std::thread::sleep(Duration::from_millis(5));
    }
    ix
}

fn query(ix: &WorkspaceIndex, input: Value) -> Value {
    let ws = Workspace::open(ix.root()).unwrap();
    let mg = ModuleGraph::build(&ix.graph());
    let out = mira::tools::codebase::run(ix, &ws, &mg, &input).unwrap();
    let verified = out.output["results"]
        .as_array()
        .map_or(0, |r| r.iter().filter(|x| x["verification"]["status"] == "verified").count());
    assert!(out.evidence.len() >= verified.min(1), "verified results carry evidence");
    out.output
}

#[test]
fn stale_candidates_are_not_given_as_verified() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    write(&root, "a.rs", "fn caller() {\n    target();\n}\n\nfn target() {}\n");
    let graphs = CodeGraphs::new(tmp.path().join("data"), CancellationToken::new(), config(false));
    let ix = ready(&graphs, &std::fs::canonicalize(&root).unwrap());
    // Moved by two lines: relocated by name, still verified, at its new line.
    write(&root, "a.rs", "// one\n// two\nfn caller() {\n    target();\n}\n\nfn target() {}\n");
    let out = query(&ix, json!({"kind": "definitions", "symbol": "target"}));
    assert_eq!(out["results"][0]["line"], 7);
    assert_eq!(out["results"][0]["verification"]["relocated"], true);
    // Gone from the file: stale, not a result.
    write(&root, "a.rs", "fn caller() {}\n");
    let out = query(&ix, json!({"kind": "definitions", "symbol": "target"}));
    assert_eq!(out["results"], json!([]));
    assert_eq!(out["stale"][0]["verification"]["status"], "stale");
    assert_eq!(out["stale"][0]["verification"]["reason"], "symbol_not_found");
    // File deleted: stale with the boundary's code.
    std::fs::remove_file(root.join("a.rs")).unwrap();
    let out = query(&ix, json!({"kind": "callers", "symbol": "target"}));
    assert_eq!(out["results"], json!([]));
    assert!(out["stale"].as_array().unwrap().iter().any(|s| s["verification"]["reason"] == "not_found"), "{out}");
}

#[test]
fn restart_reuses_the_index_file_by_content_hash() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    sample_project(&root);
    let root = std::fs::canonicalize(&root).unwrap();
    let shutdown = CancellationToken::new();
    let graphs = CodeGraphs::new(tmp.path().join("data"), shutdown.clone(), config(false));
    let ix = ready(&graphs, &root);
    assert_eq!((ix.timings().parsed, ix.timings().reused), (7, 0));
    shutdown.cancel();
    while !ix.finished() {
        std::thread::sleep(Duration::from_millis(5));
    }
    // One file changes while the server is down.
    write(&root, "py/util.py", "def clean(s):\n    return s.strip().lower()\n");
    let graphs = CodeGraphs::new(tmp.path().join("data"), CancellationToken::new(), config(false));
    let ix = ready(&graphs, &root);
    assert_eq!((ix.timings().parsed, ix.timings().reused), (1, 6));
    let out = query(&ix, json!({"kind": "callers", "symbol": "clean"}));
    assert_eq!(out["results"][0]["qualified_name"], "App::run");
}

#[test]
fn watcher_updates_incrementally_and_stops_with_shutdown() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    write(&root, "pkg/m.py", "def one():\n    return 1\n");
    let shutdown = CancellationToken::new();
    let graphs = CodeGraphs::new(tmp.path().join("data"), shutdown.clone(), config(true));
    let ix = ready(&graphs, &std::fs::canonicalize(&root).unwrap());
    assert!(ix.watched_dirs() >= 2, "root and pkg/ are watched");
    let has = |name: &str| {
        let g = ix.graph();
        g.name_id(name).is_some_and(|id| !g.defs_named(id).is_empty())
    };
    let wait = |cond: &dyn Fn() -> bool| {
        let t = Instant::now();
        while !cond() {
            assert!(t.elapsed() < Duration::from_secs(10), "the watcher did not apply the change");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    write(&root, "pkg/m.py", "def one():\n    return 1\n\ndef two():\n    return one()\n");
    wait(&|| has("two"));
    // A new folder is walked and watched; a deleted file leaves the graph.
    write(&root, "pkg/sub/new.go", "package sub\n\nfunc Fresh() {}\n");
    wait(&|| has("Fresh"));
    write(&root, "pkg/sub/new.go", "package sub\n\nfunc Fresher() {}\n");
    wait(&|| has("Fresher") && !has("Fresh"));
    std::fs::remove_file(root.join("pkg/m.py")).unwrap();
    wait(&|| !has("two"));
    assert!(ix.timings().updated >= 3);
    // Ignored files never enter.
    write(&root, ".gitignore", "ignored/\n");
    write(&root, "ignored/x.rs", "fn hidden_fn() {}\n");
    std::thread::sleep(Duration::from_millis(400));
    assert!(ix.sync() == 0 || !has("hidden_fn"));
    assert!(!has("hidden_fn"));
    // Shutdown ends the watcher thread.
    shutdown.cancel();
    wait(&|| ix.finished());
    assert_eq!(ix.watched_dirs(), 0);
}

#[test]
fn bad_inputs_are_skipped_or_indexed_partially() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    write(&root, "broken.rs", "fn fine() {}\nfn broken( {\n  let x = ;\n}\nfn after_error() { fine(); }\n");
    write(&root, "broken.py", "def ok():\n    pass\ndef bad(:\n    pass\n");
    // 20 MB of minified JavaScript: skipped as too large and reported.
    let big = format!("var a=1;{}", "function f(){return 1};".repeat(20 * 1024 * 1024 / 23));
    write(&root, "dist/app.js", &big);
    // Minified but small enough: skipped as minified.
    write(&root, "lib.js", &"a=b+c;".repeat(2000));
    write(&root, "gen.go", "// Code generated by protoc-gen-go. DO NOT EDIT.\npackage gen\nfunc Generated() {}\n");
    std::fs::write(root.join("bin.rs"), b"fn x() {}\0\x01\x02").unwrap();
    write(&root, "node_modules/dep/index.js", "function vendored() {}\n");
    write(&root, ".gitignore", "target/\n");
    write(&root, "target/debug/build.rs", "fn build_output() {}\n");
    // Symlink loops: a folder linking to its parent and a link to itself.
    std::os::unix::fs::symlink("..", root.join("dist/loop")).unwrap();
    std::os::unix::fs::symlink("self", root.join("self")).unwrap();
    let graphs = CodeGraphs::new(tmp.path().join("data"), CancellationToken::new(), config(true));
    let ix = ready(&graphs, &std::fs::canonicalize(&root).unwrap());
    let skipped = ix.skipped();
    assert_eq!(skipped.too_large, 1, "{skipped:?}");
    assert!(skipped.examples.iter().any(|e| e.path == "dist/app.js" && e.reason == "too_large"));
    assert_eq!((skipped.minified, skipped.generated, skipped.binary), (1, 1, 1), "{skipped:?}");
    assert_eq!(skipped.vendored_dirs, 1);
    let g = ix.graph();
    let files: Vec<String> = {
        let mut v: Vec<String> = g.files().map(|(_, f)| f.path.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(files, ["broken.py", "broken.rs"]);
    assert_eq!(g.stats().files_with_syntax_errors, 2);
    drop(g);
    let out = query(&ix, json!({"kind": "callers", "symbol": "fine"}));
    assert_eq!(out["results"][0]["qualified_name"], "after_error", "{out}");
    let out = query(&ix, json!({"kind": "definitions", "symbol": "ok"}));
    assert_eq!(out["results"][0]["path"], "broken.py");
    let out = query(&ix, json!({"kind": "overview"}));
    assert_eq!(out["index"]["skipped"]["too_large"], 1);
}

#[test]
fn many_files_report_progress_stay_bounded_and_cancel() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    // The 200,000-file workspace, scaled down (the benchmark runs it at full size).
    let n = 4000;
    mira::tools::codebase::synthetic::generate_workspace(&root, n).unwrap();
    let root = std::fs::canonicalize(&root).unwrap();
    let graphs = CodeGraphs::new(tmp.path().join("data"), CancellationToken::new(), config(false));
    let ix = graphs.ensure(&root).unwrap();
    let mut partial = None;
    let t = Instant::now();
    while ix.phase() != Phase::Ready {
        let (done, total) = ix.progress();
        if ix.phase() == Phase::Parsing && done > 0 && done < total {
            let a = ix.availability();
            partial.get_or_insert(format!("{a:?}"));
        }
        assert!(t.elapsed() < Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(1));
    }
    let msg = partial.expect("progress was observed while parsing");
    assert!(msg.contains("index_building") && msg.contains(&format!("of {n} files")), "{msg}");
    let stats = ix.graph().stats();
    assert_eq!(stats.files, n);
    assert!(stats.approx_bytes / n < 4096, "graph memory per small file stays small: {}", stats.approx_bytes / n);
    // Callers across packages resolve (each file calls the next one's function).
    let out = query(&ix, json!({"kind": "callers", "symbol": "f5"}));
    assert_eq!(out["results"][0]["qualified_name"], "S4::run", "{out}");

    // A second build (no index file) cancelled part-way stops promptly and says so.
    let graphs2 = CodeGraphs::new(tmp.path().join("data2"), CancellationToken::new(), config(false));
    let ix2 = graphs2.ensure(&root).unwrap();
    while ix2.progress().0 < n / 10 && ix2.phase() != Phase::Ready {
        std::thread::sleep(Duration::from_millis(1));
    }
    ix2.cancel();
    let t = Instant::now();
    while !ix2.finished() {
        assert!(t.elapsed() < Duration::from_secs(5), "cancellation did not stop the build");
        std::thread::sleep(Duration::from_millis(1));
    }
    if ix2.phase() != Phase::Ready {
        assert_eq!(ix2.phase(), Phase::Cancelled);
        match ix2.availability() {
            mira::availability::Availability::Unavailable { code, .. } => assert_eq!(code, "index_failed"),
            other => panic!("{other:?}"),
        }
    }
}
