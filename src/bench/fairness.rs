//! `mira bench fairness`: one user's calls and turns while another user floods the server.
//!
//! Starts a server in-process (SQLite in a temporary directory, or a fresh database on a given
//! Postgres server). Two users, A (the flood) and B, each with a run. In each part B first
//! works alone (the reference), then beside A's flood of `flood` loops for `seconds`:
//!
//! 1. **Calls.** Each of A's loops freezes `read_open` calls one after another without
//!    waiting for their execution, so a queue builds up when A freezes faster than the server
//!    executes; B freezes one `read_open` call at a time and waits for its result
//!    (`GET /v1/invocations/{id}?wait_ms=…`). Measured: B's freeze → completed.
//! 2. **Turns.** A deployment-wide stdio MCP server of `tools` tools is installed
//!    (`tests/mcp/many_tools.py` run by the MCP test venv's Python, from
//!    `scripts/setup-mcp.sh`), so every turn ranks about `tools` + 11 candidates; with the
//!    embedding model of the environment ([`mira::embedding::EmbeddingConfig::from_env`]) the
//!    benchmark waits until every tool is embedded and turns rank hybrid, else lexically. Each
//!    of A's loops starts a turn when its last one answered (201, or 429 `too_many_turns`);
//!    B runs turns one after another. Measured: B's turn latency.
//!
//! Prints B's p50/p99/max alone and beside the flood, the slowdown, and what A got done.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::{Api, BenchServer, Percentiles, percentiles};

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct FairnessBench {
    /// A's concurrent loops (of freezes, then of turns).
    #[arg(long, default_value_t = 64)]
    pub flood: usize,
    /// Seconds of A's flood in each part.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// B's calls and turns alone (the reference).
    #[arg(long, default_value_t = 100)]
    pub alone: usize,
    /// Tools of the MCP server of the turns part (at most 1,000, the listing limit); 0 skips
    /// the part.
    #[arg(long, default_value_t = 1000)]
    pub tools: usize,
    /// The server's `--max-turns-per-user`.
    #[arg(long, default_value_t = mira::limits::HttpLimits::default().turns_per_user)]
    pub max_turns_per_user: usize,
    /// The server's `--max-running-per-user` (default the server's default, half of the
    /// executions).
    #[arg(long)]
    pub max_running_per_user: Option<usize>,
    /// Python with the `mcp` SDK (default `$MIRA_MCP_PYTHON`).
    #[arg(long)]
    pub python: Option<String>,
    /// The MCP server script (default `$MIRA_MCP_SERVERS/many_tools.py`).
    #[arg(long)]
    pub script: Option<String>,
    /// Run the server on a new database of this Postgres server (a URL naming a database the
    /// user may create databases from; dropped at the end) instead of SQLite.
    #[arg(long)]
    pub postgres: Option<String>,
}

/// Tasks the users' turns rank for, in turn.
const TASKS: [&str; 6] = [
    "create a new invoice for the customer",
    "list every flight to Berlin next week",
    "archive old support tickets",
    "update the payroll record of an employee",
    "read the file README.md and search for the word grant",
    "delete an outdated hotel booking",
];

/// Runs the benchmark and prints its figures.
pub async fn run(opts: FairnessBench) -> anyhow::Result<()> {
    let server_command = if opts.tools > 0 {
        let env = |k: &str| {
            std::env::var(k)
                .with_context(|| format!("{k} is unset: eval \"$(bash scripts/setup-mcp.sh)\" or --tools 0"))
        };
        let python = match &opts.python {
            Some(p) => p.clone(),
            None => env("MIRA_MCP_PYTHON")?,
        };
        let script = match &opts.script {
            Some(s) => s.clone(),
            None => format!("{}/many_tools.py", env("MIRA_MCP_SERVERS")?),
        };
        Some((python, script))
    } else {
        None
    };
    let mut runtime =
        mira::config::RuntimeConfig { embedding: mira::embedding::EmbeddingConfig::from_env(), ..Default::default() };
    runtime.http.turns_per_user = opts.max_turns_per_user;
    runtime.max_running_per_user = opts.max_running_per_user;
    let hybrid = runtime.embedding.model_dir.is_some() || runtime.embedding.model.is_some();
    let execution_concurrency = runtime.execution_concurrency;
    let per_user = runtime.running_per_user();
    let bench = BenchServer::start_on("fairness", runtime, opts.postgres.as_deref()).await?;
    let result = async {
        std::fs::write(bench.dir.join("ws").join("file.txt"), "line one\nline two\n")?;
        let a = Arc::new(User::create(&bench.api, "flooding-user").await?);
        let b = User::create(&bench.api, "other-user").await?;
        let back_end = if opts.postgres.is_some() { "Postgres" } else { "SQLite" };
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        println!(
            "fairness: {back_end}, {cores} cores, {execution_concurrency} executions at once ({per_user} tools of one user), A floods with {} loops for {} s",
            opts.flood, opts.seconds
        );
        calls(&opts, &bench.server.app.store, &a, &b).await?;
        if let Some((python, script)) = &server_command {
            turns(&opts, &bench.api, &a, &b, python, script, hybrid).await?;
        }
        anyhow::Ok(())
    }
    .await;
    bench.stop().await;
    result
}

/// Part 1: B's calls beside A's flood of freezes.
async fn calls(opts: &FairnessBench, store: &mira::store::Store, a: &Arc<User>, b: &User) -> anyhow::Result<()> {
    let a_turn = a.turn_id("read the file file.txt").await?;
    let b_turn = b.turn_id("read the file file.txt").await?;
    let mut seq = 0u64;
    for _ in 0..5 {
        seq += 1;
        b.call(&b_turn, &format!("b{seq}")).await?; // warm-up
    }
    let mut alone = Vec::with_capacity(opts.alone);
    let mut alone_steps = Vec::with_capacity(opts.alone);
    for _ in 0..opts.alone {
        seq += 1;
        let t = Instant::now();
        alone_steps.push(b.call(&b_turn, &format!("b{seq}")).await?);
        alone.push(t.elapsed());
    }

    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let frozen = Arc::new(AtomicU64::new(0));
    let mut loops = Vec::with_capacity(opts.flood);
    for l in 0..opts.flood {
        let (a, a_turn, frozen) = (a.clone(), a_turn.clone(), frozen.clone());
        loops.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                if a.freeze(&a_turn, &format!("a{l}-{n}")).await.is_ok() {
                    frozen.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // the flood under way
    let mut beside = Vec::new();
    let mut beside_steps = Vec::new();
    while Instant::now() < deadline {
        seq += 1;
        let t = Instant::now();
        beside_steps.push(b.call(&b_turn, &format!("b{seq}")).await?);
        beside.push(t.elapsed());
    }
    for l in loops {
        l.await?;
    }
    // A's backlog drains before the next part.
    let queued_at_end = store.queued_count(usize::MAX).await?;
    let t0 = Instant::now();
    while store.queued_count(1).await? > 0 {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(600), "the queue did not drain in 600 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    print_table("B's calls (freeze → completed)", opts, &alone, &beside);
    for (label, steps) in [("alone", &alone_steps), ("beside the flood", &beside_steps)] {
        let p50 = |f: fn(&Steps) -> Duration| percentiles(&steps.iter().map(f).collect::<Vec<_>>()).p50;
        println!(
            "B's calls {label}, p50 of each step: freeze request {:.1} ms, queued {:.1} ms, running {:.1} ms (from the stored times)",
            p50(|s| s.freeze),
            p50(|s| s.queued),
            p50(|s| s.running)
        );
    }
    println!(
        "A froze {} calls ({:.0}/s); {queued_at_end} were still queued when the flood ended (drained in {:.1} s)",
        frozen.load(Ordering::Relaxed),
        frozen.load(Ordering::Relaxed) as f64 / opts.seconds.max(1) as f64,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Part 2: B's turns beside A's flood of turns.
async fn turns(
    opts: &FairnessBench,
    admin: &Api,
    a: &Arc<User>,
    b: &User,
    python: &str,
    script: &str,
    hybrid: bool,
) -> anyhow::Result<()> {
    let transport = json!({"stdio": {"command": python, "args": [script, opts.tools.to_string()]}});
    admin
        .send(
            reqwest::Method::POST,
            "/v1/mcp/servers",
            Some(
                json!({"name": "many", "transport": transport, "deployment_wide": true, "default_agent_access": true}),
            ),
        )
        .await?;
    // Ready: every tool listed, and embedded when a model is configured.
    let t0 = Instant::now();
    let (candidates, ranker) = loop {
        let turn = b.turn_ok(TASKS[0]).await?;
        let e = &turn["exposure"];
        let count = e["candidate_count"].as_u64().unwrap_or(0) as usize;
        let pending = e["not_embedded_count"].as_u64().unwrap_or(0);
        let ranker = e["ranker"].as_str().unwrap_or("none").to_owned();
        if count > opts.tools && (!hybrid || (e["strategy"] == "ranked" && pending == 0)) {
            break (count, ranker);
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(600),
            "not ready in 600 s: {count} candidates, ranker {ranker}, {pending} not embedded"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "turns: {candidates} candidates, ranker {ranker}, --max-turns-per-user {} (ready after {:.1} s)",
        opts.max_turns_per_user,
        t0.elapsed().as_secs_f64()
    );
    for task in TASKS {
        b.turn_ok(task).await?; // warm-up
    }
    let mut alone = Vec::with_capacity(opts.alone);
    for i in 0..opts.alone {
        let t = Instant::now();
        b.turn_ok(TASKS[i % TASKS.len()]).await?;
        alone.push(t.elapsed());
    }

    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let counts = Arc::new(StatusCounts::default());
    let mut loops = Vec::with_capacity(opts.flood);
    for l in 0..opts.flood {
        let (a, counts) = (a.clone(), counts.clone());
        loops.push(tokio::spawn(async move {
            let mut i = l;
            while Instant::now() < deadline {
                counts.add(a.turn(TASKS[i % TASKS.len()]).await);
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // the flood under way
    let mut beside = Vec::new();
    let mut i = 0;
    while Instant::now() < deadline {
        let t = Instant::now();
        b.turn_ok(TASKS[i % TASKS.len()]).await?;
        beside.push(t.elapsed());
        i += 1;
    }
    for l in loops {
        l.await?;
    }
    print_table("B's turns", opts, &alone, &beside);
    println!(
        "A's turns: {} × 201, {} × 429 too_many_turns, {} other",
        counts.created.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.other.load(Ordering::Relaxed),
    );
    Ok(())
}

fn print_table(what: &str, opts: &FairnessBench, alone: &[Duration], beside: &[Duration]) {
    let row = |label: &str, n: usize, p: Percentiles| {
        println!("| {label} | {n} | {:.1} | {:.1} | {:.1} |", p.p50, p.p99, p.max);
    };
    let (p_alone, p_beside) = (percentiles(alone), percentiles(beside));
    println!("| {what} | n | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    row("alone (reference)", alone.len(), p_alone);
    row(&format!("beside A's flood ({} loops, {} s)", opts.flood, opts.seconds), beside.len(), p_beside);
    println!(
        "slowdown beside the flood: p50 {:.1}×, p99 {:.1}×",
        p_beside.p50 / p_alone.p50.max(f64::EPSILON),
        p_beside.p99 / p_alone.p99.max(f64::EPSILON)
    );
}

/// A user of the benchmark with a run of their own.
struct User {
    api: Api,
    run_id: String,
}

impl User {
    async fn create(admin: &Api, name: &str) -> anyhow::Result<Self> {
        let created = admin.send(reqwest::Method::POST, "/v1/users", Some(json!({"name": name}))).await?;
        let token = created["token"].as_str().context("user token")?.to_owned();
        let api = Api { client: admin.client.clone(), base: admin.base.clone(), token };
        let run = api.send(reqwest::Method::POST, "/v1/runs", Some(json!({}))).await?;
        let run_id = run["id"].as_str().context("run id")?.to_owned();
        Ok(Self { api, run_id })
    }

    /// A turn that must succeed; its answer.
    async fn turn_ok(&self, task: &str) -> anyhow::Result<Value> {
        self.api
            .send(reqwest::Method::POST, &format!("/v1/runs/{}/turns", self.run_id), Some(json!({"task": task})))
            .await
    }

    /// A new turn's id.
    async fn turn_id(&self, task: &str) -> anyhow::Result<String> {
        Ok(self.turn_ok(task).await?["turn_id"].as_str().context("turn id")?.to_owned())
    }

    /// A turn's status (None: no answer).
    async fn turn(&self, task: &str) -> Option<reqwest::StatusCode> {
        let url = format!("{}/v1/runs/{}/turns", self.api.base, self.run_id);
        let resp =
            self.api.client.post(url).bearer_auth(&self.api.token).json(&json!({"task": task})).send().await.ok()?;
        let status = resp.status();
        resp.bytes().await.ok()?;
        Some(status)
    }

    /// Freezes a `read_open` call; the invocation's id.
    async fn freeze(&self, turn_id: &str, call_id: &str) -> anyhow::Result<String> {
        let body = json!({"turn_id": turn_id, "tool_id": "read_open", "tool_call_id": call_id,
                          "input": {"path": "file.txt", "start_line": 1, "end_line": 2}});
        let frozen =
            self.api.send(reqwest::Method::POST, &format!("/v1/runs/{}/invocations", self.run_id), Some(body)).await?;
        Ok(frozen["invocation_id"].as_str().context("invocation id")?.to_owned())
    }

    /// Freezes a `read_open` call and waits until it completed; how long its steps took.
    async fn call(&self, turn_id: &str, call_id: &str) -> anyhow::Result<Steps> {
        let t0 = Instant::now();
        let id = self.freeze(turn_id, call_id).await?;
        let freeze = t0.elapsed();
        loop {
            let inv = self.api.send(reqwest::Method::GET, &format!("/v1/invocations/{id}?wait_ms=30000"), None).await?;
            match inv["status"].as_str() {
                Some("completed") => {
                    let at = |field: &str| {
                        inv[field]
                            .as_str()
                            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                            .with_context(|| format!("{field} of {inv}"))
                    };
                    let between = |a: &str, b: &str| -> anyhow::Result<Duration> {
                        Ok((at(b)? - at(a)?).to_std().unwrap_or_default())
                    };
                    return Ok(Steps {
                        freeze,
                        queued: between("created_at", "started_at")?,
                        running: between("started_at", "finished_at")?,
                    });
                }
                Some("queued" | "running") => {}
                other => anyhow::bail!("call {call_id} ended {other:?}: {inv}"),
            }
        }
    }
}

/// Where a call's time went: the freeze request (client side), and from the stored times
/// (millisecond resolution) queued (frozen → started) and running (started → finished).
struct Steps {
    freeze: Duration,
    queued: Duration,
    running: Duration,
}

/// A's answers by status.
#[derive(Default)]
struct StatusCounts {
    created: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

impl StatusCounts {
    fn add(&self, status: Option<reqwest::StatusCode>) {
        let counter = match status {
            Some(reqwest::StatusCode::CREATED) => &self.created,
            Some(reqwest::StatusCode::TOO_MANY_REQUESTS) => &self.refused,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
