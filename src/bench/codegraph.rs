//! `mira bench codegraph`: the code graph on real and generated code.
//!
//! 1. Copies a real source tree (default: tokio's sources from the cargo registry) into a
//!    temporary workspace and indexes it cold: index time, peak resident memory of the build
//!    (`VmHWM` after resetting it through `/proc/self/clear_refs`), graph size, index file size.
//! 2. Restarts on the same data folder: time to ready when every file's hash matches.
//! 3. Edits one line of one file on disk and measures until the watcher has re-indexed it
//!    (end-to-end) and the re-index itself.
//! 4. Runs every query kind on a deterministic sample of symbols and files through the same
//!    function the tool executes (verification included): p50/p99 per kind.
//! 5. With `--quality FILE`: precision and recall per kind on a hand-labelled set.
//! 6. With `--synthetic N`: a generated workspace of N files (indexed, then a second build
//!    cancelled half-way): time, peak memory, progress samples, time to stop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use mira::tools::codebase::index::{CodeGraphs, IndexConfig, Phase, WorkspaceIndex};
use mira::tools::codebase::resolve::ModuleGraph;
use mira::workspace::Workspace;

/// Options of the benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct CodegraphBench {
    /// Source tree to index (copied to a temporary folder first); default tokio's sources in
    /// the cargo registry.
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Queries per kind.
    #[arg(long, default_value_t = 200)]
    pub queries: usize,
    /// A hand-labelled quality set (JSON) to score.
    #[arg(long)]
    pub quality: Option<PathBuf>,
    /// Also index a generated workspace of this many files.
    #[arg(long)]
    pub synthetic: Option<usize>,
    /// Skip the real-tree part (only quality and/or synthetic).
    #[arg(long)]
    pub skip_real: bool,
}

/// The cargo registry source folder (`$CARGO_HOME/registry/src/<index>`), if present.
pub fn registry_src() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    let dir = std::fs::read_dir(home.join("registry/src")).ok()?;
    dir.filter_map(Result::ok).map(|e| e.path()).find(|p| p.join("tokio-1.54.1").exists() || p.is_dir())
}

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Copies the regular files and folders of `from` into `to` (symlinks are skipped).
pub fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<u64> {
    let mut n = 0;
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let ft = entry.file_type()?;
        let target = to.join(entry.file_name());
        if ft.is_dir() {
            n += copy_tree(&entry.path(), &target)?;
        } else if ft.is_file() {
            std::fs::copy(entry.path(), &target)?;
            n += 1;
        }
    }
    Ok(n)
}

/// Waits until `ix` is ready (or fails), sampling progress every `every`.
pub fn wait_ready(ix: &WorkspaceIndex, every: Duration, samples: &mut Vec<(u64, usize, usize)>) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        match ix.phase() {
            Phase::Ready => return Ok(()),
            Phase::Failed { error } => bail!("index failed: {error}"),
            Phase::Cancelled => bail!("index cancelled"),
            _ => {}
        }
        let (done, total) = ix.progress();
        samples.push((start.elapsed().as_millis() as u64, done, total));
        std::thread::sleep(every);
    }
}

/// Runs the benchmark and prints its figures as JSON lines.
pub async fn run(opts: CodegraphBench) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || run_blocking(&opts)).await.context("benchmark thread")?
}

fn run_blocking(opts: &CodegraphBench) -> anyhow::Result<()> {
    let tmp = tempdir()?;
    if !opts.skip_real {
        let source = match &opts.path {
            Some(p) => p.clone(),
            None => registry_src().context("no cargo registry sources found")?.join("tokio-1.54.1"),
        };
        real_tree(opts, &source, &tmp.join("real"))?;
    }
    if let Some(path) = &opts.quality {
        let report = quality(path, &tmp.join("quality"))?;
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    if let Some(n) = opts.synthetic {
        synthetic(n, &tmp.join("synthetic"))?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("mira-bench-codegraph-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn real_tree(opts: &CodegraphBench, source: &Path, dir: &Path) -> anyhow::Result<()> {
    let ws_root = dir.join("ws");
    let copied = copy_tree(source, &ws_root)?;
    let ws_root = std::fs::canonicalize(&ws_root)?;
    let data = dir.join("data");
    eprintln!("codegraph bench: indexing {} ({copied} files copied)", source.display());

    // 1. Cold build.
    let base_rss = rss_kib();
    reset_peak();
    let shutdown = CancellationToken::new();
    let graphs = CodeGraphs::new(data.clone(), shutdown.clone(), IndexConfig::default());
    let started = Instant::now();
    let ix = graphs.ensure(&ws_root).map_err(anyhow::Error::msg)?;
    let mut samples = Vec::new();
    wait_ready(&ix, Duration::from_millis(20), &mut samples)?;
    let cold = started.elapsed();
    let peak = peak_rss_kib();
    let stats = ix.graph().stats();
    let timings = ix.timings();
    println!(
        "{}",
        json!({"bench": "codegraph_index_cold", "source": source.display().to_string(), "files_in_tree": copied,
               "indexed_files": stats.files, "definitions": stats.definitions, "references": stats.references,
               "names": stats.names, "files_with_syntax_errors": stats.files_with_syntax_errors,
               "index_ms": cold.as_millis() as u64, "walk_ms": timings.walk_ms, "parse_ms": timings.parse_ms,
               "save_ms": timings.save_ms, "index_file_bytes": timings.index_file_bytes,
               "graph_bytes_estimate": stats.approx_bytes, "rss_before_kib": base_rss, "peak_rss_kib": peak,
               "peak_rss_growth_kib": peak.saturating_sub(base_rss), "workers": IndexConfig::default().workers,
               "skipped": ix.skipped()})
    );

    // 3. One-line edit, end to end through the watcher.
    let target = pick_edit_target(&ix)?;
    let full = ws_root.join(&target);
    let original = std::fs::read_to_string(&full)?;
    let mut latencies = Vec::new();
    let mut reparse = Vec::new();
    for i in 0..5 {
        let marker = format!("mira_bench_marker_{i}");
        let edited = format!("{original}\nfn {marker}() {{}}\n");
        let t = Instant::now();
        std::fs::write(&full, &edited)?;
        loop {
            let found = {
                let g = ix.graph();
                g.name_id(&marker).is_some_and(|id| !g.defs_named(id).is_empty())
            };
            if found {
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                bail!("the watcher did not pick up an edit of {target} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        latencies.push(t.elapsed());
        reparse.push(Duration::from_micros(ix.timings().last_update_us));
    }
    std::fs::write(&full, &original)?;
    let e2e = super::percentiles(&latencies);
    let re = super::percentiles(&reparse);
    println!(
        "{}",
        json!({"bench": "codegraph_incremental_one_line_edit", "file": target, "edits": latencies.len(),
               "watcher_to_indexed_p50_ms": e2e.p50, "watcher_to_indexed_max_ms": e2e.max,
               "reindex_p50_ms": re.p50, "reindex_max_ms": re.max, "debounce_ms": IndexConfig::default().debounce.as_millis() as u64})
    );

    // 4. Query latency per kind.
    query_latencies(&ix, &ws_root, opts.queries)?;

    // 2. Restart on the same data folder.
    shutdown.cancel();
    let t = Instant::now();
    while !ix.finished() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(ix);
    drop(graphs);
    let shutdown = CancellationToken::new();
    let graphs = CodeGraphs::new(data, shutdown.clone(), IndexConfig::default());
    let started = Instant::now();
    let ix = graphs.ensure(&ws_root).map_err(anyhow::Error::msg)?;
    wait_ready(&ix, Duration::from_millis(5), &mut Vec::new())?;
    let timings = ix.timings();
    println!(
        "{}",
        json!({"bench": "codegraph_index_restart", "ready_ms": started.elapsed().as_millis() as u64,
               "load_ms": timings.load_ms, "walk_ms": timings.walk_ms, "hash_check_ms": timings.parse_ms,
               "reparsed": timings.parsed, "reused": timings.reused})
    );
    shutdown.cancel();
    while !ix.finished() {
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn pick_edit_target(ix: &WorkspaceIndex) -> anyhow::Result<String> {
    let g = ix.graph();
    let mut files: Vec<(u64, String)> =
        g.files().filter(|(_, f)| f.path.ends_with(".rs")).map(|(_, f)| (f.size, f.path.to_string())).collect();
    files.sort();
    files.get(files.len() / 2).map(|(_, p)| p.clone()).context("no Rust file to edit")
}

fn query_latencies(ix: &WorkspaceIndex, root: &Path, per_kind: usize) -> anyhow::Result<()> {
    let ws = Workspace::open(root)?;
    let (symbols, files, folders) = {
        let g = ix.graph();
        let mut defs: Vec<String> = g
            .files()
            .flat_map(|(_, f)| f.defs.iter().filter(|d| d.kind.is_callable()).map(|d| g.name(d.name).to_owned()))
            .collect();
        defs.sort();
        defs.dedup();
        let step = (defs.len() / per_kind.max(1)).max(1);
        let symbols: Vec<String> = defs.into_iter().step_by(step).take(per_kind).collect();
        let mut paths: Vec<String> = g.files().map(|(_, f)| f.path.to_string()).collect();
        paths.sort();
        let step = (paths.len() / per_kind.max(1)).max(1);
        let files: Vec<String> = paths.iter().step_by(step).take(per_kind).cloned().collect();
        let mut folders: Vec<String> =
            paths.iter().filter_map(|p| p.rsplit_once('/').map(|(d, _)| d.to_owned())).collect();
        folders.sort();
        folders.dedup();
        folders.insert(0, ".".into());
        (symbols, files, folders)
    };
    let modules: Arc<ModuleGraph> = Arc::new(ModuleGraph::build(&ix.graph()));
    let mut inputs: Vec<(&str, Value)> = Vec::new();
    for s in &symbols {
        inputs.push(("definitions", json!({"kind": "definitions", "symbol": s, "depth": 1, "limit": 50})));
        inputs.push(("references", json!({"kind": "references", "symbol": s, "depth": 1, "limit": 50})));
        inputs.push(("callers", json!({"kind": "callers", "symbol": s, "depth": 2, "limit": 50})));
        inputs.push(("callees", json!({"kind": "callees", "symbol": s, "depth": 2, "limit": 50})));
        inputs.push(("impact", json!({"kind": "impact", "symbol": s, "depth": 3, "limit": 50})));
    }
    for f in &files {
        inputs.push(("dependencies", json!({"kind": "dependencies", "path": f, "depth": 1, "limit": 50})));
    }
    for d in folders.iter().take(per_kind.min(50)) {
        inputs.push(("overview", json!({"kind": "overview", "path": d, "depth": 1, "limit": 50, "max_tokens": 2048})));
    }
    let mut by_kind: std::collections::BTreeMap<&str, Vec<Duration>> = Default::default();
    let mut results: std::collections::BTreeMap<&str, (usize, usize, usize)> = Default::default();
    for (kind, input) in &inputs {
        let t = Instant::now();
        let out = mira::tools::codebase::run(ix, &ws, &modules, input).map_err(|e| anyhow::anyhow!("{e}"))?;
        by_kind.entry(kind).or_default().push(t.elapsed());
        let r = results.entry(kind).or_default();
        r.0 += out.output["results"].as_array().map_or(0, Vec::len);
        r.1 += out.evidence.len();
        r.2 += out.output["stale"].as_array().map_or(0, Vec::len);
        if std::env::var_os("MIRA_BENCH_SHOW_STALE").is_some()
            && let Some(s) = out.output["stale"].as_array().and_then(|a| a.first())
        {
            eprintln!("stale ({kind}): {s}");
        }
    }
    for (kind, samples) in by_kind {
        let p = super::percentiles(&samples);
        let (n, ev, stale) = results.get(kind).copied().unwrap_or_default();
        println!(
            "{}",
            json!({"bench": "codegraph_query_latency", "kind": kind, "queries": samples.len(), "p50_ms": round(p.p50),
                   "p99_ms": round(p.p99), "max_ms": round(p.max), "results": n, "evidence": ev, "stale": stale})
        );
    }
    Ok(())
}

fn round(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

fn synthetic(n: usize, dir: &Path) -> anyhow::Result<()> {
    let root = dir.join("ws");
    std::fs::create_dir_all(&root)?;
    let t = Instant::now();
    mira::tools::codebase::synthetic::generate_workspace(&root, n)?;
    let generate_ms = t.elapsed().as_millis() as u64;
    let root = std::fs::canonicalize(&root)?;
    let base = rss_kib();
    reset_peak();
    let shutdown = CancellationToken::new();
    let graphs = CodeGraphs::new(dir.join("data"), shutdown.clone(), IndexConfig::default());
    let started = Instant::now();
    let ix = graphs.ensure(&root).map_err(anyhow::Error::msg)?;
    let mut samples = Vec::new();
    wait_ready(&ix, Duration::from_millis(250), &mut samples)?;
    let elapsed = started.elapsed();
    let peak = peak_rss_kib();
    let stats = ix.graph().stats();
    let progress: Vec<Value> =
        samples.iter().step_by((samples.len() / 10).max(1)).map(|(ms, d, t)| json!([ms, d, t])).collect();
    println!(
        "{}",
        json!({"bench": "codegraph_synthetic_index", "files": n, "generate_ms": generate_ms, "index_ms": elapsed.as_millis() as u64,
               "indexed_files": stats.files, "definitions": stats.definitions, "references": stats.references,
               "graph_bytes_estimate": stats.approx_bytes, "peak_rss_growth_kib": peak.saturating_sub(base),
               "watched_dirs": ix.watched_dirs(), "progress_samples_ms_done_total": progress})
    );
    shutdown.cancel();
    while !ix.finished() {
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(ix);
    drop(graphs);

    // A second build on an empty data folder, cancelled once a third of the files is done.
    let shutdown = CancellationToken::new();
    let graphs = CodeGraphs::new(dir.join("data2"), shutdown.clone(), IndexConfig::default());
    let ix = graphs.ensure(&root).map_err(anyhow::Error::msg)?;
    while ix.progress().0 < n / 3 && ix.phase() != Phase::Ready {
        std::thread::sleep(Duration::from_millis(5));
    }
    let at = ix.progress();
    let t = Instant::now();
    ix.cancel();
    while !ix.finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "{}",
        json!({"bench": "codegraph_synthetic_cancel", "cancelled_at_done": at.0, "of": at.1,
               "stop_ms": t.elapsed().as_millis() as u64, "phase": ix.phase()})
    );
    Ok(())
}

/// Scores a hand-labelled set: for each case, the returned names or locations against the
/// expected ones; precision and recall micro-averaged per kind.
pub fn quality(path: &Path, dir: &Path) -> anyhow::Result<Value> {
    let set: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let registry = registry_src();
    let mut per_kind: std::collections::BTreeMap<String, (usize, usize, usize)> = Default::default();
    let mut cases_out = Vec::new();
    let shutdown = CancellationToken::new();
    let config = IndexConfig { watch: false, ..IndexConfig::default() };
    let graphs = CodeGraphs::new(dir.join("data"), shutdown.clone(), config);
    let mut roots = std::collections::HashMap::new();
    for r in set["roots"].as_array().context("roots")? {
        let name = r["name"].as_str().context("root name")?;
        let raw = r["path"].as_str().context("root path")?;
        let resolved = if let Some(rest) = raw.strip_prefix("$CARGO_REGISTRY/") {
            registry.clone().context("no cargo registry")?.join(rest)
        } else if let Some(rest) = raw.strip_prefix("$PYTHON_STDLIB/") {
            python_stdlib().context("no python standard library found")?.join(rest)
        } else {
            PathBuf::from(raw)
        };
        let copy = dir.join(name);
        let into = match r["subdir"].as_str() {
            Some(sub) => copy.join(sub),
            None => copy.clone(),
        };
        copy_tree(&resolved, &into).with_context(|| format!("copying {}", resolved.display()))?;
        let copy = std::fs::canonicalize(copy)?;
        let ix = graphs.ensure(&copy).map_err(anyhow::Error::msg)?;
        wait_ready(&ix, Duration::from_millis(10), &mut Vec::new())?;
        let modules = ModuleGraph::build(&ix.graph());
        roots.insert(name.to_owned(), (ix, Workspace::open(&copy)?, modules));
    }
    for case in set["cases"].as_array().context("cases")? {
        let (ix, ws, modules) = roots.get(case["root"].as_str().unwrap_or("")).context("case root")?;
        let kind = case["kind"].as_str().unwrap_or("");
        let mut input = json!({"kind": kind, "depth": case.get("depth").cloned().unwrap_or(json!(1)), "limit": 200});
        for k in ["symbol", "path"] {
            if let Some(v) = case.get(k) {
                input[k] = v.clone();
            }
        }
        let out = mira::tools::codebase::run(ix, ws, modules, &input).map_err(|e| anyhow::anyhow!("{e}"))?;
        let got: std::collections::BTreeSet<String> = returned(kind, &out.output);
        let expected: std::collections::BTreeSet<String> =
            case["expected"].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect();
        let tp = got.intersection(&expected).count();
        let e = per_kind.entry(kind.to_owned()).or_default();
        e.0 += tp;
        e.1 += got.len();
        e.2 += expected.len();
        cases_out.push(json!({"kind": kind, "symbol": case.get("symbol"), "path": case.get("path"), "tp": tp,
            "returned": got.len(), "expected": expected.len(),
            "false_positives": got.difference(&expected).collect::<Vec<_>>(),
            "missed": expected.difference(&got).collect::<Vec<_>>()}));
    }
    shutdown.cancel();
    let kinds: Vec<Value> = per_kind
        .into_iter()
        .map(|(k, (tp, got, exp))| {
            let p = if got == 0 { 1.0 } else { tp as f64 / got as f64 };
            let r = if exp == 0 { 1.0 } else { tp as f64 / exp as f64 };
            json!({"kind": k, "precision": (p * 1000.0).round() / 1000.0, "recall": (r * 1000.0).round() / 1000.0,
                   "true_positives": tp, "returned": got, "expected": exp})
        })
        .collect();
    Ok(
        json!({"bench": "codegraph_quality", "set": path.display().to_string(), "source": set["source"], "per_kind": kinds, "cases": cases_out}),
    )
}

/// What a result names, for scoring: `path:line` for definitions and references, the
/// qualified name for callers/callees/impact, the other file for dependencies.
fn returned(kind: &str, out: &Value) -> std::collections::BTreeSet<String> {
    let results = out["results"].as_array().cloned().unwrap_or_default();
    match kind {
        "definitions" | "references" => results
            .iter()
            .map(|r| format!("{}:{}", r["path"].as_str().unwrap_or(""), r["line"].as_u64().unwrap_or(0)))
            .collect(),
        "dependencies" => {
            let mut s: std::collections::BTreeSet<String> = out["imports"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["to"].as_str().map(|t| format!("out:{t}")))
                .collect();
            s.extend(
                out["imported_by"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["from"].as_str().map(|f| format!("in:{f}"))),
            );
            s
        }
        _ => results.iter().filter_map(|r| r["qualified_name"].as_str().map(str::to_owned)).collect(),
    }
}

/// The Python standard library folder of the `python3` on PATH.
pub fn python_stdlib() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"])
        .output()
        .ok()?;
    let p = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
    p.is_dir().then_some(p)
}
