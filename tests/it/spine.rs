#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The spine end to end over HTTP, on SQLite and on Postgres: exposure, freezing, the Read
//! tools, evidence, events, and every bad input of the spine issue.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, Options, TestTool, read_sse, spawn, spawn_with};
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn read_chain_end_to_end(backend: Backend) {
    let t = spawn(backend).await;
    std::fs::create_dir_all(t.workspace.join("src")).unwrap();
    std::fs::write(t.workspace.join("src/lib.rs"), "pub fn frobnicate() -> u32 {\n    42\n}\n").unwrap();
    let token = t.user("alice").await;
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, "find frobnicate").await;
    assert_eq!(exposure["strategy"], "all");
    let ids: Vec<&str> = exposure["tools"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "delete_path",
            "grep",
            "move_path",
            "read_discover",
            "read_open",
            "replace_block",
            "terminal_session",
            "write_file"
        ]
    );

    let r = t.call(&token, &run, &turn, "grep", "call-1", json!({"pattern": "fn frobnicate"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // Approval-free, and the harness had a free slot: claimed in the freeze's transaction.
    assert_eq!(r.body["status"], "running", "{r:?}");
    assert_eq!(r.body["input_hash"].as_str().unwrap().len(), 64);
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    let m = &done["result"]["output"]["matches"][0];
    assert_eq!((m["path"].as_str(), m["line"].as_u64()), (Some("src/lib.rs"), Some(1)));

    let r = t
        .call(&token, &run, &turn, "read_open", "call-2", json!({"path": "src/lib.rs", "start_line": 1, "end_line": 2}))
        .await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    let out = &done["result"]["output"];
    assert_eq!(out["content"], "pub fn frobnicate() -> u32 {\n    42\n");
    assert_eq!(out["total_lines"], 3);
    let sha = mira::evidence::sha256_hex(&std::fs::read(t.workspace.join("src/lib.rs")).unwrap());
    assert_eq!(out["sha256"], sha);

    let evidence_id = done["evidence_ids"][0].as_str().unwrap().to_owned();
    let ev = t.get(&format!("/v1/evidence/{evidence_id}"), &token).await;
    assert_eq!(ev.body["kind"], "file_excerpt");
    assert_eq!(ev.body["content_sha256"], sha);
    assert_eq!(ev.body["provenance"]["start_line"], 1);
    assert_eq!(ev.body["provenance"]["end_line"], 2);
    let acc = t
        .post(
            &format!("/v1/evidence/{evidence_id}/acceptance"),
            &token,
            json!({"accepted": true, "note": "answers the question"}),
        )
        .await;
    assert_eq!(acc.status, StatusCode::OK, "{acc:?}");
    assert_eq!(acc.body["acceptance"]["accepted"], true);

    let resp = t.client.get(format!("{}/v1/runs/{run}/events", t.base)).bearer_auth(&token).send().await.unwrap();
    let events = read_sse(resp, 10, Duration::from_secs(5)).await;
    let kinds: Vec<&str> = events.iter().map(|(_, k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "exposure.created",
            "invocation.frozen",
            "execution.started",
            "execution.completed",
            "evidence.recorded",
            "invocation.frozen",
            "execution.started",
            "execution.completed",
            "evidence.recorded",
            "evidence.accepted"
        ]
    );
    let ids: Vec<i64> = events.iter().map(|(id, _, _)| *id).collect();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());
}

async fn idempotent_replay_and_call_id_conflict(backend: Backend) {
    let t = spawn(backend).await;
    std::fs::write(t.workspace.join("a.txt"), "alpha\n").unwrap();
    let token = t.user("bob").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read").await;
    let first = t.call(&token, &run, &turn, "read_open", "c", json!({"path": "a.txt"})).await;
    assert_eq!(first.status, StatusCode::CREATED);
    // Same triple (different key order and a redundant "./") → the same invocation, 200.
    let again = t.call(&token, &run, &turn, "read_open", "c", json!({"path": "./a.txt"})).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.body["invocation_id"], first.body["invocation_id"]);
    // Same call id, other input → 409.
    let changed = t.call(&token, &run, &turn, "read_open", "c", json!({"path": "b.txt"})).await;
    assert_eq!((changed.status, changed.code()), (StatusCode::CONFLICT, "tool_call_id_conflict"), "{changed:?}");
    // Same call id, other tool → 409.
    let other_tool = t.call(&token, &run, &turn, "grep", "c", json!({"pattern": "x"})).await;
    assert_eq!((other_tool.status, other_tool.code()), (StatusCode::CONFLICT, "tool_call_id_conflict"));
    // The exposure's function name is accepted in place of the id.
    let by_name = t.call(&token, &run, &turn, "read_open", "d", json!({"path": "a.txt"})).await;
    assert_eq!(by_name.status, StatusCode::CREATED);
}

async fn bad_inputs_are_refused_clearly(backend: Backend) {
    let t = spawn_with(backend, Options { body_limit: 64 * 1024, ..Options::default() }).await;
    let token = t.user("carol").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "anything").await;
    let url = format!("{}/v1/runs/{run}/invocations", t.base);

    // Malformed JSON.
    let r = t
        .client
        .post(&url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .body("{\"turn_id\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_json");
    // Body over the limit.
    let big =
        json!({"turn_id": turn, "tool_id": "grep", "tool_call_id": "x", "input": {"pattern": "a".repeat(100_000)}});
    let r = t.client.post(&url).bearer_auth(&token).json(&big).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "body_too_large");
    // Unknown tool.
    let r = t.call(&token, &run, &turn, "no_such_tool", "u1", json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "not_registered"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["ladder"]["stages"][0]["status"], "blocked");
    // A core tool whose connection is missing: unavailable, with the reason.
    let r = t.call(&token, &run, &turn, "web_search", "u2", json!({"query": "x"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "unavailable"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["ladder"]["reason"]["code"], "no_search_provider");
    // Schema-invalid input.
    let r = t.call(&token, &run, &turn, "grep", "s1", json!({"pattern": 7})).await;
    assert_eq!((r.status, r.code()), (StatusCode::UNPROCESSABLE_ENTITY, "input_invalid"), "{r:?}");
    let r = t.call(&token, &run, &turn, "read_open", "s2", json!({"path": "a", "surprise": true})).await;
    assert_eq!(r.code(), "input_invalid");
    // Path traversal and absolute paths.
    for (i, p) in ["../outside.txt", "/etc/passwd", "a/../../x"].iter().enumerate() {
        let r = t.call(&token, &run, &turn, "read_open", &format!("p{i}"), json!({"path": p})).await;
        assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "outside_workspace"), "{p}: {r:?}");
    }
    // Symlink escape.
    std::os::unix::fs::symlink("/etc", t.workspace.join("etc-link")).unwrap();
    let r = t.call(&token, &run, &turn, "read_open", "sym", json!({"path": "etc-link/passwd"})).await;
    assert_eq!((r.status, r.code()), (StatusCode::BAD_REQUEST, "outside_workspace"), "{r:?}");
    let r = t.call(&token, &run, &turn, "grep", "sym2", json!({"pattern": "root", "path": "etc-link"})).await;
    assert_eq!(r.code(), "outside_workspace", "{r:?}");
    // Missing and wrong token; another user's run.
    let r = t.request(reqwest::Method::GET, &format!("/v1/runs/{run}"), None, None).await;
    assert_eq!((r.status, r.code()), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let r = t.get(&format!("/v1/runs/{run}"), "mira_wrong").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let mallory = t.user("mallory").await;
    for path in [format!("/v1/runs/{run}"), format!("/v1/turns/{turn}"), format!("/v1/runs/{run}/evidence")] {
        let r = t.get(&path, &mallory).await;
        assert_eq!((r.status, r.code()), (StatusCode::NOT_FOUND, "not_found"), "{path}");
    }
    let r = t.call(&mallory, &run, &turn, "grep", "m", json!({"pattern": "x"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // Last-Event-ID from the future.
    let r = t
        .client
        .get(format!("{}/v1/runs/{run}/events", t.base))
        .bearer_auth(&token)
        .header("Last-Event-ID", "999")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "invalid_last_event_id");
    // Nothing above left an invocation behind.
    let list = t.get(&format!("/v1/runs/{run}/invocations"), &token).await;
    assert_eq!(list.body["invocations"].as_array().unwrap().len(), 0, "{list:?}");
}

async fn read_open_answers_large_binary_and_non_utf8_files_clearly(backend: Backend) {
    let t = spawn(backend).await;
    let line =
        "0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstu\n";
    let big: String = line.repeat(50 * 1024 * 1024 / line.len());
    std::fs::write(t.workspace.join("big.txt"), &big).unwrap();
    std::fs::write(t.workspace.join("blob.bin"), [0x7f, b'E', b'L', b'F', 0, 0, 1, 2]).unwrap();
    std::fs::write(t.workspace.join("latin1.txt"), b"caf\xe9\n").unwrap();
    let token = t.user("dave").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "open").await;

    let r = t.call(&token, &run, &turn, "read_open", "big", json!({"path": "big.txt"})).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    let out = &done["result"]["output"];
    assert_eq!(done["status"], "completed");
    assert_eq!(out["truncated"], true);
    assert!(out["content"].as_str().unwrap().len() <= 256 * 1024);
    assert!(out["truncation_marker"].as_str().unwrap().contains("truncated"));
    assert_eq!(out["total_lines"].as_u64().unwrap() as usize, big.len() / line.len());
    assert_eq!(out["sha256"], mira::evidence::sha256_hex(big.as_bytes()));

    let r = t.call(&token, &run, &turn, "read_open", "bin", json!({"path": "blob.bin"})).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(
        (done["status"].as_str(), done["result"]["error"]["code"].as_str()),
        (Some("failed"), Some("binary_file")),
        "{done}"
    );

    let r = t.call(&token, &run, &turn, "read_open", "latin", json!({"path": "latin1.txt"})).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["result"]["error"]["code"], "invalid_utf8", "{done}");

    let r = t.call(&token, &run, &turn, "grep", "g", json!({"pattern": "caf|ELF|xyz0123"})).await;
    let done = t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    let out = &done["result"]["output"];
    assert_eq!(out["skipped_binary"], 1, "{out}");
    assert_eq!(out["skipped_large"], 1, "{out}");
}

async fn legacy_entries_are_internal_only(backend: Backend) {
    let t = spawn(backend).await;
    std::fs::write(t.workspace.join("notes.md"), "one\ntwo\nthree\n").unwrap();
    let token = t.user("erin").await;
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, "read notes").await;
    assert!(!exposure.to_string().contains("read_slice"));
    let r = t.call(&token, &run, &turn, "read_slice", "l1", json!({"path": "notes.md", "start": 2, "end": 3})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "not_public"), "{r:?}");
    assert_eq!(r.body["error"]["details"]["replacement"], "read_open");
    let view = t.get("/v1/tools/read_slice", &token).await;
    assert_eq!(
        (view.body["state"].as_str(), view.body["replacement"].as_str()),
        (Some("not_public"), Some("read_open"))
    );

    // An internal caller still gets the old shape served by the new tool.
    let app = t.app();
    let me = t.get("/v1/me", &token).await;
    let run_row = app.store.run_for(me.body["id"].as_str().unwrap(), &run).await.unwrap().unwrap();
    let ws = app.workspace_of(&run_row).await.unwrap();
    let out = app
        .harness
        .call_internal(&run_row.owner_id, &run, "read_slice", ws, json!({"path": "notes.md", "start": 2, "end": 3}))
        .await
        .unwrap();
    assert_eq!(out.output["content"], "two\nthree\n");
    assert_eq!(out.output["served_by"], "read_open");
}

async fn exposure_all_runs_no_ranker_and_ranked_keeps_twenty(backend: Backend) {
    struct Panicking;
    impl mira::exposure::Ranker for Panicking {
        fn name(&self) -> String {
            "panicking".into()
        }
        fn strategy(&self) -> mira::exposure::Strategy {
            mira::exposure::Strategy::Ranked
        }
        fn score(&self, _: &str, _: &[&mira::registry::ToolSpec]) -> Vec<f64> {
            panic!("ranking ran with 20 or fewer candidates")
        }
    }
    let t = spawn(backend).await;
    let token = t.user("frank").await;
    let app = t.app();
    t.code_graph_ready().await;
    // The core tools plus dynamic ones = 20 candidates, plus a skill-private tool that must
    // never appear.
    let core = mira::exposure::candidates(&app.registry, &app.availability_context("x", None).await.unwrap()).len();
    let fill = 20 - core;
    for i in 0..fill {
        app.registry.register(Arc::new(TestTool::new(&format!("dyn_{i:02}"), "a dynamic capability", false))).unwrap();
    }
    app.registry
        .register(Arc::new(
            TestTool::new("skill_tool", "private helper of a skill", false)
                .kind(mira::registry::ToolKind::SkillPrivate),
        ))
        .unwrap();
    let candidates = mira::exposure::candidates(&app.registry, &app.availability_context("x", None).await.unwrap());
    let exposure = mira::exposure::expose(&candidates, "anything", &Panicking, None);
    assert_eq!((exposure.strategy, exposure.tools.len()), (mira::exposure::Strategy::All, 20));
    assert!(exposure.tools.iter().all(|t| t.id != "skill_tool"));

    // 25 candidates → exactly 20, best first, the relevant one on top, deterministic.
    for i in fill..fill + 4 {
        app.registry.register(Arc::new(TestTool::new(&format!("dyn_{i:02}"), "a dynamic capability", false))).unwrap();
    }
    app.registry
        .register(Arc::new(TestTool::new(
            "weather_forecast",
            "Weather forecast for a city: temperature and rain",
            false,
        )))
        .unwrap();
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, "what will the weather be in Paris tomorrow, rain?").await;
    assert_eq!(exposure["strategy"], "ranked_lexical");
    assert_eq!(exposure["candidate_count"], 25);
    let tools = exposure["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 20);
    assert_eq!(tools[0]["id"], "weather_forecast");
    assert!(tools.iter().all(|t| t["score"].is_number() && t["id"] != "skill_tool"));
    let scores: Vec<f64> = tools.iter().map(|t| t["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]));
    let (_, again) = t.turn(&token, &run, "what will the weather be in Paris tomorrow, rain?").await;
    assert_eq!(again["tools"], exposure["tools"]);
    // The stored exposure is returned exactly.
    let stored = t.get(&format!("/v1/turns/{turn}"), &token).await;
    assert_eq!(stored.body["exposure"], exposure);
    // A tool left out of the 20 is `available`, not `exposed`, and a call to it is 409 not_exposed.
    let all = t.get(&format!("/v1/tools?turn={turn}"), &token).await;
    let left_out = all.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["state"] == "available")
        .map(|v| v["id"].as_str().unwrap().to_owned())
        .unwrap();
    assert!(!tools.iter().any(|t| t["id"] == left_out.as_str()));
    let view = t.get(&format!("/v1/tools/{left_out}?turn={turn}"), &token).await;
    assert_eq!(view.body["state"], "available");
    assert_eq!(view.body["reason"]["code"], "not_exposed");
    let r = t.call(&token, &run, &turn, &left_out, "n1", json!({})).await;
    assert_eq!((r.status, r.code()), (StatusCode::CONFLICT, "not_exposed"));
    let skill = t.get("/v1/tools/skill_tool", &token).await;
    assert_eq!(skill.body["state"], "not_public");
}

async fn events_resume_without_loss_or_repeats(backend: Backend) {
    let t = spawn(backend).await;
    std::fs::write(t.workspace.join("f.txt"), "x\n").unwrap();
    let token = t.user("gina").await;
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "t").await;
    for i in 0..3 {
        let r = t.call(&token, &run, &turn, "read_open", &format!("c{i}"), json!({"path": "f.txt"})).await;
        t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    }
    let url = format!("{}/v1/runs/{run}/events", t.base);
    let first = read_sse(t.client.get(&url).bearer_auth(&token).send().await.unwrap(), 6, Duration::from_secs(5)).await;
    assert_eq!(first.len(), 6);
    let last = first.last().unwrap().0;
    // Reconnect while new events are being produced.
    let resumed =
        t.client.get(&url).bearer_auth(&token).header("Last-Event-ID", last.to_string()).send().await.unwrap();
    let r = t.call(&token, &run, &turn, "read_open", "late", json!({"path": "f.txt"})).await;
    t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;
    let total = 1 + 4 * 4;
    let rest = read_sse(resumed, total - 6, Duration::from_secs(5)).await;
    let ids: Vec<i64> = first.iter().chain(rest.iter()).map(|e| e.0).collect();
    assert_eq!(ids, (1..=total as i64).collect::<Vec<_>>());
    // ?after= works the same way.
    let tail = read_sse(
        t.client.get(format!("{url}?after={}", total - 2)).bearer_auth(&token).send().await.unwrap(),
        2,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(tail.iter().map(|e| e.0).collect::<Vec<_>>(), [total as i64 - 1, total as i64]);
}

async fn running_invocations_become_interrupted_after_a_crash(backend: Backend) {
    let mut t = spawn(backend).await;
    let token = t.user("hank").await;
    let slow = TestTool { delay: Duration::from_secs(60), ..TestTool::new("slow_tool", "takes a minute", false) };
    t.app().registry.register(Arc::new(slow)).unwrap();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "slow").await;
    let r = t.call(&token, &run, &turn, "slow_tool", "s", json!({})).await;
    let id = r.body["invocation_id"].as_str().unwrap().to_owned();
    for _ in 0..100 {
        if t.get(&format!("/v1/invocations/{id}"), &token).await.body["status"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Graceful stop: the running invocation is interrupted, never re-run.
    t.stop().await;
    // A crash: a previous incarnation of this node claimed an invocation and died.
    let store = mira::server::open_store(&t.data_dir, &t.db.url).await.unwrap();
    let me_id = store.identity_by_token(&mira::auth::hash_token(&token)).await.unwrap().unwrap().user_id;
    let new = mira::store::NewInvocation {
        run_id: run.clone(),
        turn_id: turn.clone(),
        owner_id: me_id,
        tool_id: "slow_tool".into(),
        tool_call_id: "crashed".into(),
        input: "{}".into(),
        input_hash: mira::invocation::canonical::input_hash("slow_tool", &json!({})),
        approval: None,
        queue_tag: 0,
    };
    store.freeze_invocation(&new).await.unwrap();
    let stable = std::fs::read_to_string(t.data_dir.join("node.id")).unwrap();
    let claimed = store.claim_next(&format!("{}:crashed-boot", stable.trim()), 60_000).await.unwrap().unwrap();
    assert_eq!(claimed.tool_call_id, "crashed");
    store.close().await;
    t.restart().await;
    for inv in [id, claimed.id] {
        let after = t.get(&format!("/v1/invocations/{inv}"), &token).await;
        assert_eq!(after.body["status"], "interrupted", "{after:?}");
        assert_eq!(after.body["result"]["error"]["code"], "interrupted");
    }
}

/// A run's list shows each invocation with the approval and evidence ids its own view has (the
/// list reads them for the whole page at once), and nothing of another run.
async fn the_list_links_each_invocation_to_its_own_approval_and_evidence(backend: Backend) {
    let t = spawn(backend).await;
    std::fs::write(t.workspace.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(t.workspace.join("b.txt"), "beta\n").unwrap();
    let token = t.user("lena").await;
    let (run, other) = (t.run(&token).await, t.run(&token).await);
    let (turn, _) = t.turn(&token, &run, "read the files and write one").await;
    let (other_turn, _) = t.turn(&token, &other, "read a file").await;
    let mut ids = Vec::new();
    for (i, path) in ["a.txt", "b.txt"].iter().enumerate() {
        let r = t.call(&token, &run, &turn, "read_open", &format!("r{i}"), json!({"path": path})).await;
        let id = r.body["invocation_id"].as_str().unwrap().to_owned();
        assert_eq!(t.wait_final(&token, &id).await["status"], "completed");
        ids.push(id);
    }
    let w = t.call(&token, &run, &turn, "write_file", "w", json!({"path": "c.txt", "content": "x"})).await;
    assert_eq!(w.body["status"], "awaiting_approval", "{w:?}");
    ids.push(w.body["invocation_id"].as_str().unwrap().to_owned());
    let r = t.call(&token, &other, &other_turn, "read_open", "o", json!({"path": "a.txt"})).await;
    t.wait_final(&token, r.body["invocation_id"].as_str().unwrap()).await;

    let list = t.get(&format!("/v1/runs/{run}/invocations"), &token).await;
    let listed = list.body["invocations"].as_array().unwrap();
    assert_eq!(listed.iter().map(|v| v["invocation_id"].as_str().unwrap()).collect::<Vec<_>>(), ids, "{list:?}");
    for entry in listed {
        let one = t.get(&format!("/v1/invocations/{}", entry["invocation_id"].as_str().unwrap()), &token).await;
        assert_eq!(entry["approval_id"], one.body["approval_id"]);
        assert_eq!(entry["evidence_ids"], one.body["evidence_ids"]);
    }
    let (reads, write) = (&listed[..2], &listed[2]);
    for read in reads {
        assert!(read["approval_id"].is_null(), "{read}");
        let evidence = read["evidence_ids"].as_array().unwrap();
        assert_eq!(evidence.len(), 1, "{read}");
        let e = t.get(&format!("/v1/evidence/{}", evidence[0].as_str().unwrap()), &token).await;
        assert_eq!(e.body["invocation_id"], read["invocation_id"], "{e:?}");
    }
    assert_eq!(write["approval_id"], w.body["approval_id"]);
    assert!(write["approval_id"].as_str().is_some_and(|a| a.starts_with("apr_")), "{write}");
    assert_eq!(write["evidence_ids"], json!([]));
    // A page of one still carries its links.
    let page = t.get(&format!("/v1/runs/{run}/invocations?limit=1&cursor={}", ids[1]), &token).await;
    assert_eq!(page.body["invocations"][0]["approval_id"], w.body["approval_id"], "{page:?}");
}

/// One execution slot, held; user A queues ten calls, then user B one: B's call runs with the
/// first of A's, not after all ten (the queue is claimed users in turn, `harness::fair`).
async fn the_execution_queue_takes_users_in_turn(backend: Backend) {
    let mut options = Options::default();
    options.runtime.execution_concurrency = 1;
    let t = spawn_with(backend, options).await;
    // The slot is held until every call is queued, however slow the machine.
    let (hold, release) = TestTool::new("hold", "holds the one slot", false).gated();
    t.app().registry.register(Arc::new(hold)).unwrap();
    t.app().registry.register(Arc::new(TestTool::new("quick", "answers at once", false))).unwrap();
    let (a, b) = (t.user("ann").await, t.user("bert").await);
    let (run_a, run_b) = (t.run(&a).await, t.run(&b).await);
    let ((turn_a, _), (turn_b, _)) = (t.turn(&a, &run_a, "work").await, t.turn(&b, &run_b, "work").await);
    let held = t.call(&a, &run_a, &turn_a, "hold", "h", json!({})).await;
    assert_eq!(held.body["status"], "running", "{held:?}");
    let mut ids = Vec::new();
    for i in 0..10 {
        let r = t.call(&a, &run_a, &turn_a, "quick", &format!("a{i}"), json!({})).await;
        assert_eq!(r.body["status"], "queued", "{r:?}");
        ids.push(r.body["invocation_id"].as_str().unwrap().to_owned());
    }
    let r = t.call(&b, &run_b, &turn_b, "quick", "b", json!({})).await;
    assert_eq!(r.body["status"], "queued", "{r:?}");
    release.add_permits(1);
    let b_done = t.wait_final(&b, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(b_done["status"], "completed", "{b_done}");
    // `execution` counts the quick tool's runs: A's first call may go before B's, no more.
    let b_order = b_done["result"]["output"]["execution"].as_u64().unwrap();
    assert!(b_order <= 2, "b's call ran as number {b_order} of 11");
    for id in ids {
        assert_eq!(t.wait_final(&a, &id).await["status"], "completed");
    }
}

/// A user holds at most their share of the execution slots (`--max-running-per-user`): their
/// further calls wait in the queue while another user's call runs at once.
async fn a_user_holds_at_most_their_share_of_the_slots(backend: Backend) {
    let mut options = Options::default();
    options.runtime.execution_concurrency = 4;
    options.runtime.max_running_per_user = Some(2);
    let t = spawn_with(backend, options).await;
    // A's calls hold their slots until the test releases them, however slow the machine.
    let (hold, release) = TestTool::new("hold", "holds a slot", false).gated();
    t.app().registry.register(Arc::new(hold)).unwrap();
    t.app().registry.register(Arc::new(TestTool::new("quick", "answers at once", false))).unwrap();
    let (a, b) = (t.user("ann").await, t.user("bert").await);
    let (run_a, run_b) = (t.run(&a).await, t.run(&b).await);
    let ((turn_a, _), (turn_b, _)) = (t.turn(&a, &run_a, "work").await, t.turn(&b, &run_b, "work").await);
    let mut held = Vec::new();
    for i in 0..3 {
        let r = t.call(&a, &run_a, &turn_a, "hold", &format!("h{i}"), json!({})).await;
        let expected = if i < 2 { "running" } else { "queued" };
        assert_eq!(r.body["status"], expected, "call {i}: {r:?}");
        held.push(r.body["invocation_id"].as_str().unwrap().to_owned());
    }
    // B's call completes while both of A's running calls still hold their slots.
    let r = t.call(&b, &run_b, &turn_b, "quick", "b", json!({})).await;
    let b_done = t.wait_final(&b, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(b_done["status"], "completed", "{b_done}");
    let third = t.get(&format!("/v1/invocations/{}", held[2]), &a).await;
    assert_eq!(third.body["status"], "queued", "a's third call waits for one of a's slots: {third:?}");
    release.add_permits(3);
    let mut done = Vec::new();
    for id in &held {
        let v = t.wait_final(&a, id).await;
        assert_eq!(v["status"], "completed", "{v}");
        done.push(v);
    }
    // By the stored times: a's third call started only after one of the first two finished.
    let at = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap_or_else(|| panic!("{field}: {v}"))).unwrap()
    };
    let first_free = at(&done[0], "finished_at").min(at(&done[1], "finished_at"));
    assert!(at(&done[2], "started_at") >= first_free, "a's third call ran beside the first two: {done:#?}");
}

/// The claim loop passes over the queued calls of a user who holds their share of the slots:
/// when a slot frees, another user's call queued after theirs takes it.
async fn the_claim_loop_passes_over_a_user_at_their_share(backend: Backend) {
    let mut options = Options::default();
    options.runtime.execution_concurrency = 2;
    options.runtime.max_running_per_user = Some(1);
    let t = spawn_with(backend, options).await;
    // Both holds last until the test releases them, however slow the machine.
    let (hold, release_hold) = TestTool::new("hold", "holds a slot", false).gated();
    let (brief, release_brief) = TestTool::new("brief", "holds a slot briefly", false).gated();
    t.app().registry.register(Arc::new(hold)).unwrap();
    t.app().registry.register(Arc::new(brief)).unwrap();
    t.app().registry.register(Arc::new(TestTool::new("quick", "answers at once", false))).unwrap();
    let (a, b, c) = (t.user("ann").await, t.user("bert").await, t.user("cleo").await);
    let (run_a, run_b, run_c) = (t.run(&a).await, t.run(&b).await, t.run(&c).await);
    let (turn_a, _) = t.turn(&a, &run_a, "work").await;
    let (turn_b, _) = t.turn(&b, &run_b, "work").await;
    let (turn_c, _) = t.turn(&c, &run_c, "work").await;
    let a1 = t.call(&a, &run_a, &turn_a, "hold", "a1", json!({})).await;
    assert_eq!(a1.body["status"], "running", "{a1:?}");
    let a2 = t.call(&a, &run_a, &turn_a, "quick", "a2", json!({})).await;
    assert_eq!(a2.body["status"], "queued", "a holds their share: {a2:?}");
    let c1 = t.call(&c, &run_c, &turn_c, "brief", "c1", json!({})).await;
    assert_eq!(c1.body["status"], "running", "{c1:?}");
    let b1 = t.call(&b, &run_b, &turn_b, "quick", "b1", json!({})).await;
    assert_eq!(b1.body["status"], "queued", "every slot is busy: {b1:?}");
    // C's slot frees; a's hold still runs.
    release_brief.add_permits(1);
    let b_done = t.wait_final(&b, b1.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(b_done["status"], "completed", "{b_done}");
    let a2_id = a2.body["invocation_id"].as_str().unwrap();
    let a2_now = t.get(&format!("/v1/invocations/{a2_id}"), &a).await;
    assert_eq!(a2_now.body["status"], "queued", "b's call took c's slot past a's queued call: {a2_now:?}");
    let a1_now = t.get(&format!("/v1/invocations/{}", a1.body["invocation_id"].as_str().unwrap()), &a).await;
    assert_eq!(a1_now.body["status"], "running", "{a1_now:?}");
    release_hold.add_permits(1);
    assert_eq!(t.wait_final(&a, a2_id).await["status"], "completed");
}

both_backends!(
    the_claim_loop_passes_over_a_user_at_their_share,
    a_user_holds_at_most_their_share_of_the_slots,
    the_execution_queue_takes_users_in_turn,
    the_list_links_each_invocation_to_its_own_approval_and_evidence,
    read_chain_end_to_end,
    idempotent_replay_and_call_id_conflict,
    bad_inputs_are_refused_clearly,
    read_open_answers_large_binary_and_non_utf8_files_clearly,
    legacy_entries_are_internal_only,
    exposure_all_runs_no_ranker_and_ranked_keeps_twenty,
    events_resume_without_loss_or_repeats,
    running_invocations_become_interrupted_after_a_crash,
);
