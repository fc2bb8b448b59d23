//! `mira bench exposure`: Tool Exposure ranking measured like a retrieval system.
//!
//! Input is the common bench format (`docs/bench-format.md`): a JSON array of tool
//! definitions `{"id", "name"?, "title"?, "description", "input_schema"?}` (the id is `id`,
//! else `name`) and JSONL queries `{"query", "gold": [tool id, …]}`.
//!
//! Part 1, quality: every tool is registered and embedded, then for each (sampled) query
//! each ranker ranks all tools through [`mira::exposure::Ranker::rank`] (query embedding
//! included) and the bench records Recall@5 and Recall@20 (the share of the query's gold
//! tools in the top 5/20, averaged over queries), Complete@20 (all gold tools in the top
//! 20), MRR (reciprocal rank of the first gold tool) and the latency of the ranking call.
//!
//! Part 2, the exposure latency series: registries of 20, 21, 100, 1,000 and 10,000 tools
//! (the bench tools, cycled with a numbered suffix once they run out), indexed and embedded
//! by the real background indexer against a real SQLite store, then one turn's exposure
//! through the real code path (`exposure::candidates` + `exposure::expose` with the
//! shipped hybrid ranker). For 1,000 tools it also times embedding all of them while turns
//! keep being served.
//!
//! Sampling is a seeded Fisher–Yates shuffle driven by SplitMix64 (Steele, Lea & Flood,
//! "Fast Splittable Pseudorandom Number Generators", OOPSLA 2014), so a (seed, N) pair
//! names the same queries on every machine and version.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use mira::availability::{AvailabilityContext, DeviceInfo};
use mira::embedding::{EmbeddingConfig, Embeddings, State};
use mira::error::ErrorCode;
use mira::exposure::hybrid::{Fusion, IndexRanker, Mode};
use mira::exposure::index::ToolIndex;
use mira::exposure::usage::{LearnRule, PastUse, UsageHistory};
use mira::exposure::{self, MAX_EXPOSED, Ranker, Strategy};
use mira::registry::{ExecContext, Registry, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};

/// Options of `mira bench exposure`.
#[derive(Debug, Clone)]
pub struct ExposureBench {
    /// Tool definitions (JSON array).
    pub tools: PathBuf,
    /// Queries (JSONL).
    pub queries: PathBuf,
    /// Queries to sample (None = all).
    pub sample: Option<usize>,
    /// Sampling seed.
    pub seed: u64,
    /// Rankers to measure.
    pub modes: Vec<Mode>,
    /// Fusions of the hybrid to measure (the first is also used for the series).
    pub fusions: Vec<Fusion>,
    /// Sizes of the exposure latency series (empty = skip it).
    pub series: Vec<usize>,
    /// Also measure each ranker with the task split into steps ([`exposure::steps`]).
    pub steps: bool,
    /// Queries replayed as accepted past uses (learning from use; 0 = none).
    pub history: usize,
    /// Rules measured with the history (empty = the shipped one).
    pub history_rules: Vec<LearnRule>,
    /// Replay each history query with the next one's gold tools (misleading past uses).
    pub history_mismatched: bool,
    /// Turns measured per series size.
    pub series_turns: usize,
    /// The embedding model.
    pub embedding: EmbeddingConfig,
    /// Write each query's per-tool lexical and dense scores here (JSONL), for offline
    /// analysis of fusion functions.
    pub dump: Option<PathBuf>,
}

/// A tool of the bench set.
#[derive(Debug, Clone, Deserialize)]
struct BenchToolDef {
    id: Option<String>,
    name: Option<String>,
    title: Option<String>,
    #[serde(default)]
    description: String,
    #[serde(default)]
    input_schema: Option<Value>,
}

/// A query of the bench set.
#[derive(Debug, Clone, Deserialize)]
pub struct BenchQuery {
    /// The task text.
    pub query: String,
    /// Ids of the tools the task needs.
    pub gold: Vec<String>,
}

/// A registered bench tool: it only has a spec (the bench never executes).
struct BenchTool {
    spec: ToolSpec,
}

#[async_trait]
impl Tool for BenchTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn execute(&self, _input: &Value, _ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        Err(ToolError::new(ErrorCode::Internal, "bench tools do not execute"))
    }
}

/// Reads a tool definition file into specs (kind `dynamic`, so they are public).
pub fn read_tools(path: &Path) -> anyhow::Result<Vec<ToolSpec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let defs: Vec<BenchToolDef> =
        serde_json::from_str(&text).with_context(|| format!("{} is not a JSON array of tools", path.display()))?;
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(defs.len());
    for (i, d) in defs.into_iter().enumerate() {
        let Some(id) = d.id.clone().or_else(|| d.name.clone()) else {
            bail!("{}: tool #{i} has neither id nor name", path.display());
        };
        if !seen.insert(id.clone()) {
            bail!("{}: tool id {id} appears twice", path.display());
        }
        let mut schema = d.input_schema.unwrap_or_else(|| json!({"type": "object"}));
        if !schema.is_object() {
            schema = json!({"type": "object"});
        }
        out.push(ToolSpec {
            title: d.title.or(d.name).unwrap_or_else(|| id.clone()),
            id,
            kind: ToolKind::Dynamic,
            domain: "bench".into(),
            description: d.description,
            input_schema: schema,
            requires_approval: false,
            capability: None,
            replacement: None,
            owner: None,
        });
    }
    Ok(out)
}

/// The registered tools whose input schema compiles in no JSON Schema dialect, with the
/// problem ([`mira::registry::schema`]).
pub fn unusable_schemas(registry: &Registry) -> Vec<(String, String)> {
    registry.all().iter().filter_map(|e| e.schema().err().map(|p| (e.spec().id.clone(), p.to_string()))).collect()
}

/// Reads a JSONL query file.
pub fn read_queries(path: &Path) -> anyhow::Result<Vec<BenchQuery>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{}:{}: not a query line", path.display(), i + 1))
        })
        .collect()
}

/// Parses `FLOOR:BOOST` (`--history-rule`).
pub fn parse_rule(s: &str) -> anyhow::Result<LearnRule> {
    let (f, b) = s.split_once(':').ok_or_else(|| anyhow::anyhow!("{s:?}: expected FLOOR:BOOST"))?;
    let floor: f64 = f.parse().with_context(|| format!("floor in {s:?}"))?;
    let max_boost: f64 = b.parse().with_context(|| format!("boost in {s:?}"))?;
    anyhow::ensure!((-1.0..1.0).contains(&floor) && max_boost >= 0.0, "{s:?}: floor in [-1, 1), boost ≥ 0");
    Ok(LearnRule { floor, max_boost })
}

/// The past uses of the replayed queries: one per gold tool, each with its query's embedding;
/// `mismatched` pairs each query with the next one's gold tools instead (misleading uses).
fn replay_history(embeddings: &Embeddings, queries: &[&BenchQuery], mismatched: bool) -> anyhow::Result<UsageHistory> {
    use mira::exposure::hybrid::QueryEmbedder;
    let model_id = embeddings.model_id().ok_or_else(|| anyhow::anyhow!("--history needs an embedding model"))?;
    let mut uses = Vec::new();
    for (n, q) in queries.iter().enumerate() {
        // Mismatched: the task of one query with the gold tools of the next (seeded order).
        let gold = if mismatched { &queries[(n + 1) % queries.len()].gold } else { &q.gold };
        let v = embeddings.embed_query(&q.query).map_err(|e| anyhow::anyhow!("{e}"))?;
        // As the server keeps them: the primary model's part.
        let v: Arc<[f32]> = mira::exposure::hybrid::primary(&v, embeddings.primary_dim()).into();
        uses.extend(gold.iter().map(|g| PastUse { tool_id: g.clone(), task_vector: Arc::clone(&v) }));
    }
    Ok(UsageHistory { model_id, uses })
}

/// SplitMix64 step.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` indexes of `0..len` chosen by a seeded Fisher–Yates shuffle, in shuffled order.
pub fn sample_indexes(len: usize, n: usize, seed: u64) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..len).collect();
    let mut state = seed;
    for i in (1..len).rev() {
        let j = (splitmix64(&mut state) % (i as u64 + 1)) as usize;
        idx.swap(i, j);
    }
    idx.truncate(n.min(len));
    idx
}

/// Quality figures of one ranker.
#[derive(Debug, Clone, Default)]
pub struct Quality {
    /// Ranker label.
    pub label: String,
    /// Mean share of gold tools in the top 5.
    pub recall5: f64,
    /// Mean share of gold tools in the top 20.
    pub recall20: f64,
    /// Share of queries with every gold tool in the top 20.
    pub complete20: f64,
    /// Mean reciprocal rank of the first gold tool.
    pub mrr: f64,
    /// Ranking latency percentiles (ms).
    pub p50_ms: f64,
    /// 99th percentile (ms).
    pub p99_ms: f64,
    /// Turns whose ranking was not the requested kind (model failed on the query).
    pub degraded: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    // Nearest-rank method.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Rank (1-based) of candidate `i` in the order [`exposure::top_k`] gives.
fn rank_of(i: usize, scores: &[f64], specs: &[&ToolSpec]) -> usize {
    let clean = |s: f64| if s.is_nan() { f64::NEG_INFINITY } else { s };
    let si = clean(scores[i]);
    1 + scores
        .iter()
        .enumerate()
        .filter(|&(j, &s)| {
            let s = clean(s);
            j != i && (s > si || (s == si && specs[j].id < specs[i].id))
        })
        .count()
}

/// A bench tool's source for the fair shares: the id's prefix before `__` (the common bench
/// format's `<server>__<tool>`), else `bench`.
fn bench_source(id: &str) -> String {
    id.split_once("__").map_or_else(|| "bench".to_owned(), |(server, _)| format!("mcp:{server}"))
}

/// Recall and MRR of one ranker; with `sources`, the 20 are chosen under the fair shares
/// ([`exposure::shares`]) as a turn's exposure does, else the plain top 20.
fn measure(
    ranker: &dyn Ranker,
    label: &str,
    specs: &[&ToolSpec],
    queries: &[&BenchQuery],
    sources: Option<&[String]>,
    steps: bool,
    history: Option<(&UsageHistory, LearnRule)>,
) -> Quality {
    let pos: HashMap<&str, usize> = specs.iter().enumerate().map(|(i, s)| (s.id.as_str(), i)).collect();
    let mut q = Quality { label: label.to_owned(), ..Quality::default() };
    let mut lat = Vec::with_capacity(queries.len());
    let expected = ranker.strategy();
    for query in queries {
        let t = Instant::now();
        let mut ranking = ranker.rank(&query.query, specs);
        if steps {
            let parts = exposure::steps::split(&query.query);
            if parts.len() > 1 {
                let mut all = vec![std::mem::take(&mut ranking.scores)];
                all.extend(parts.iter().map(|p| ranker.rank(p, specs).scores));
                ranking.scores = exposure::steps::fuse_max(&all);
            }
        }
        if let Some((history, rule)) = history {
            exposure::learn(&mut ranking, Some(history), specs, rule);
        }
        let top: Vec<(usize, f64)> = match sources {
            None => exposure::top_k(&ranking.scores, specs, MAX_EXPOSED),
            Some(sources) => {
                let order = exposure::top_k(&ranking.scores, specs, specs.len());
                let selection =
                    exposure::shares::select(&order, sources, &ranking.matched, ranking.without_signal(), MAX_EXPOSED);
                selection.taken.into_iter().map(|(i, score, _)| (i, score)).collect()
            }
        };
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
        if ranking.strategy != expected {
            q.degraded += 1;
        }
        let gold: Vec<usize> = query.gold.iter().filter_map(|g| pos.get(g.as_str()).copied()).collect();
        if gold.is_empty() {
            continue;
        }
        let in_top = |k: usize| gold.iter().filter(|g| top.iter().take(k).any(|(i, _)| i == *g)).count() as f64;
        let n = gold.len() as f64;
        q.recall5 += in_top(5) / n;
        q.recall20 += in_top(20) / n;
        if in_top(20) == n {
            q.complete20 += 1.0;
        }
        let best = gold.iter().map(|&g| rank_of(g, &ranking.scores, specs)).min().unwrap_or(usize::MAX);
        q.mrr += 1.0 / best as f64;
    }
    let n = queries.len().max(1) as f64;
    q.recall5 /= n;
    q.recall20 /= n;
    q.complete20 /= n;
    q.mrr /= n;
    lat.sort_by(f64::total_cmp);
    q.p50_ms = percentile(&lat, 50.0);
    q.p99_ms = percentile(&lat, 99.0);
    q
}

/// Loads the model synchronously (the bench needs it before measuring).
fn load_model(config: &EmbeddingConfig, data_dir: &Path) -> Arc<Embeddings> {
    let embeddings = Arc::new(Embeddings::new(config.clone(), data_dir));
    let t = Instant::now();
    let status = embeddings.load();
    match status.state {
        State::Ready => {
            eprintln!("model {} ready in {:.1} s", status.model.as_deref().unwrap_or("?"), t.elapsed().as_secs_f64())
        }
        _ => eprintln!(
            "no embedding model ({:?}): {}",
            status.state,
            status.reason.as_deref().unwrap_or("no reason given")
        ),
    }
    embeddings
}

/// Embeds every indexed tool without a vector, directly (no store); returns tools/s.
fn embed_all(embeddings: &Embeddings, index: &ToolIndex) -> anyhow::Result<f64> {
    let Some(model) = embeddings.model() else { return Ok(0.0) };
    let pending = index.missing_vectors();
    let t = Instant::now();
    for batch in pending.chunks(embeddings.batch_size()) {
        let fields: Vec<(&str, &str)> = batch.iter().map(|t| (t.fields.0.as_str(), t.fields.1.as_str())).collect();
        let vectors = model.embed_tools(&fields).map_err(|e| anyhow::anyhow!("embedding tools: {e}"))?;
        let map: HashMap<String, Arc<[f32]>> =
            batch.iter().map(|t| t.text_sha256.clone()).zip(vectors.into_iter().map(Into::into)).collect();
        index.set_vectors(&map);
    }
    Ok(pending.len() as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

/// Runs the benchmark and prints the report to stdout.
pub async fn run_exposure(opts: ExposureBench) -> anyhow::Result<()> {
    let specs = read_tools(&opts.tools)?;
    let queries = read_queries(&opts.queries)?;
    let ids: std::collections::HashSet<&str> = specs.iter().map(|s| s.id.as_str()).collect();
    let unknown = queries.iter().flat_map(|q| &q.gold).filter(|g| !ids.contains(g.as_str())).count();
    let (chosen, replayed): (Vec<&BenchQuery>, Vec<&BenchQuery>) = match opts.sample {
        Some(n) => {
            let order = sample_indexes(queries.len(), n + opts.history, opts.seed);
            let (a, b) = order.split_at(n.min(order.len()));
            (a.iter().map(|&i| &queries[i]).collect(), b.iter().map(|&i| &queries[i]).collect())
        }
        None if opts.history > 0 => anyhow::bail!("--history needs --sample (the replayed queries follow the sample)"),
        None => (queries.iter().collect(), Vec::new()),
    };
    let gold_per_query = chosen.iter().map(|q| q.gold.len()).sum::<usize>() as f64 / chosen.len().max(1) as f64;
    println!("# mira bench exposure");
    println!(
        "tools: {} ({}), queries: {} of {} ({}), seed {}, gold tools per query {:.2}{}",
        specs.len(),
        opts.tools.display(),
        chosen.len(),
        queries.len(),
        opts.queries.display(),
        opts.seed,
        gold_per_query,
        if unknown > 0 { format!(", {unknown} gold ids not among the tools (count as misses)") } else { String::new() }
    );
    let tmp = tempfile::tempdir().context("temporary directory")?;
    let embeddings = load_model(&opts.embedding, tmp.path());
    let needs_model = opts.modes.iter().any(|m| *m != Mode::Lexical) || !opts.series.is_empty();
    if needs_model && embeddings.status().state != State::Ready {
        println!(
            "embedding model: {:?} — {}; dense and hybrid rows are BM25 (ranked_lexical)",
            embeddings.status().state,
            embeddings.status().reason.unwrap_or_default()
        );
    }

    // Part 1: quality over the whole set.
    let registry = Registry::new();
    for s in &specs {
        registry.register(Arc::new(BenchTool { spec: s.clone() })).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let index = Arc::new(ToolIndex::new());
    index.sync(&registry);
    let rate = tokio::task::block_in_place(|| embed_all(&embeddings, &index))?;
    if rate > 0.0 {
        println!("tool embedding: {} tools, {:.0} tools/s (batch {})", specs.len(), rate, embeddings.batch_size());
    }
    // A tool whose input schema compiles in no dialect is unavailable (`schema_unusable`),
    // as in a turn's exposure: it is left out of the ranking, and the set still runs.
    let entries: Vec<_> = registry.all().into_iter().filter(|e| e.schema().is_ok()).collect();
    let unusable = unusable_schemas(&registry);
    if !unusable.is_empty() {
        println!("schema_unusable: {} tools left out (unavailable, as in exposure):", unusable.len());
        for (id, problem) in &unusable {
            println!("  {id}: {}", mira::evidence::excerpt(problem, 300));
        }
    }
    let candidate_specs: Vec<&ToolSpec> = entries.iter().map(|e| e.spec()).collect();
    let history = if replayed.is_empty() {
        None
    } else {
        let t = Instant::now();
        let h = tokio::task::block_in_place(|| replay_history(&embeddings, &replayed, opts.history_mismatched))?;
        println!(
            "history: {} replayed queries (after the sample, seed {}){} as {} past uses, embedded in {:.1} s",
            replayed.len(),
            opts.seed,
            if opts.history_mismatched { ", each with the next one's gold tools (mismatched)" } else { "" },
            h.uses.len(),
            t.elapsed().as_secs_f64()
        );
        Some(h)
    };
    if let Some(path) = &opts.dump {
        tokio::task::block_in_place(|| dump_scores(path, &index, &embeddings, &candidate_specs, &chosen))?;
    }
    println!();
    println!("| ranker | Recall@5 | Recall@20 | Complete@20 | MRR | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    // Sets whose ids say their server (`<server>__<tool>`) also get rows under the fair shares.
    let sources: Vec<String> = candidate_specs.iter().map(|s| bench_source(&s.id)).collect();
    let several_sources = sources.iter().any(|s| Some(s) != sources.first());
    let print_row = |q: &Quality| {
        println!(
            "| {} | {:.4} | {:.4} | {:.4} | {:.4} | {:.2} | {:.2} |{}",
            q.label,
            q.recall5,
            q.recall20,
            q.complete20,
            q.mrr,
            q.p50_ms,
            q.p99_ms,
            if q.degraded > 0 { format!(" ({} turns fell back to BM25)", q.degraded) } else { String::new() }
        );
    };
    for mode in &opts.modes {
        let fusions: Vec<Fusion> = if *mode == Mode::Hybrid { opts.fusions.clone() } else { vec![Fusion::default()] };
        for fusion in fusions {
            let ranker = IndexRanker::new(index.clone(), embeddings.clone(), *mode).with_fusion(fusion);
            let label = match mode {
                Mode::Hybrid => format!("hybrid ({})", fusion.name()),
                m => m.name().to_owned(),
            };
            let q =
                tokio::task::block_in_place(|| measure(&ranker, &label, &candidate_specs, &chosen, None, false, None));
            print_row(&q);
            rows.push(q);
            if several_sources {
                let label = format!("{label} + shares");
                let q = tokio::task::block_in_place(|| {
                    measure(&ranker, &label, &candidate_specs, &chosen, Some(&sources), false, None)
                });
                print_row(&q);
                rows.push(q);
            }
            if opts.steps {
                let label = format!("{label} + steps");
                let q = tokio::task::block_in_place(|| {
                    measure(&ranker, &label, &candidate_specs, &chosen, None, true, None)
                });
                print_row(&q);
                rows.push(q);
            }
            if let Some(history) = history.as_ref().filter(|_| *mode != Mode::Lexical) {
                let rules =
                    if opts.history_rules.is_empty() { vec![LearnRule::default()] } else { opts.history_rules.clone() };
                for rule in rules {
                    let label = format!("{label} + history {} ({}:{})", replayed.len(), rule.floor, rule.max_boost);
                    let q = tokio::task::block_in_place(|| {
                        measure(&ranker, &label, &candidate_specs, &chosen, None, false, Some((history, rule)))
                    });
                    print_row(&q);
                    rows.push(q);
                }
            }
        }
    }

    // Part 2: the exposure latency series through the real code path.
    if !opts.series.is_empty() {
        let fusion = opts.fusions.first().copied().unwrap_or_default();
        println!();
        println!("## exposure latency through exposure::candidates + exposure::expose (hybrid {})", fusion.name());
        println!();
        println!(
            "| registered tools | strategy | query embeddings | p50 ms | p99 ms | indexing + embedding s | turns served meanwhile (p50 / p99 ms) |"
        );
        println!("|---|---|---|---|---|---|---|");
        for &n in &opts.series {
            series_row(&opts, &embeddings, &specs, &chosen, n, fusion).await?;
        }
    }
    Ok(())
}

fn dump_scores(
    path: &Path,
    index: &ToolIndex,
    embeddings: &Embeddings,
    specs: &[&ToolSpec],
    queries: &[&BenchQuery],
) -> anyhow::Result<()> {
    use mira::exposure::hybrid::{QueryEmbedder, dot};
    use std::io::Write;
    let mut out =
        std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?);
    let resolution = index.resolve(specs);
    let resolved = &resolution.tools;
    let docs: Vec<&_> = resolved.iter().map(|r| r.lexical.as_ref()).collect();
    let pos: HashMap<&str, usize> = specs.iter().enumerate().map(|(i, s)| (s.id.as_str(), i)).collect();
    writeln!(out, "{}", json!({"tools": specs.iter().map(|s| &s.id).collect::<Vec<_>>()}))?;
    // Field embeddings, for analysis of multi-field scoring.
    let model = embeddings.model().ok_or_else(|| anyhow::anyhow!("--dump needs a model"))?;
    let field = |texts: Vec<String>| -> anyhow::Result<Vec<Vec<f32>>> {
        let mut out = Vec::new();
        for chunk in texts.chunks(32) {
            let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
            out.extend(model.embed_batch(&refs).map_err(anyhow::Error::msg)?);
        }
        Ok(out)
    };
    let names = field(specs.iter().map(|s| mira::exposure::tool_fields(s).0).collect())?;
    let descs = field(specs.iter().map(|s| mira::exposure::tool_text(s)).collect())?;
    for q in queries {
        let lexical = mira::exposure::lexical::bm25(&resolution.vocabulary.query(&q.query), &docs);
        let qv = embeddings.embed_query(&q.query).map_err(anyhow::Error::msg)?;
        let dense: Vec<f32> = resolved.iter().map(|r| r.vector.as_ref().map_or(f32::NAN, |v| dot(&qv, v))).collect();
        let gold: Vec<usize> = q.gold.iter().filter_map(|g| pos.get(g.as_str()).copied()).collect();
        let dn: Vec<f32> = names.iter().map(|v| dot(&qv, v)).collect();
        let dd: Vec<f32> = descs.iter().map(|v| dot(&qv, v)).collect();
        writeln!(
            out,
            "{}",
            json!({"query": q.query, "gold": gold, "lexical": lexical, "dense": dense, "dense_name": dn, "dense_text": dd})
        )?;
    }
    Ok(())
}

/// Synthetic registry of `n` tools cycled from `base` (replicas get a numbered id and a
/// numbered suffix, so every text, and so every cache key, is distinct).
fn synthetic(base: &[ToolSpec], n: usize) -> Vec<ToolSpec> {
    (0..n)
        .map(|i| {
            let b = &base[i % base.len()];
            let round = i / base.len();
            let mut s = b.clone();
            if round > 0 {
                s.id = format!("{}__{round}", b.id);
                s.description = format!("{} (mirror {round})", b.description);
            }
            s
        })
        .collect()
}

async fn series_row(
    opts: &ExposureBench,
    embeddings: &Arc<Embeddings>,
    base: &[ToolSpec],
    queries: &[&BenchQuery],
    n: usize,
    fusion: Fusion,
) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir().context("temporary directory")?;
    let url = format!("sqlite://{}?mode=rwc", tmp.path().join("bench.db").display());
    let store = mira::server::open_store(tmp.path(), &url).await?;
    let registry = Arc::new(Registry::new());
    let index = Arc::new(ToolIndex::new());
    let shutdown = CancellationToken::new();
    let indexer = mira::embedding::worker::spawn(
        embeddings.clone(),
        index.clone(),
        registry.clone(),
        store.clone(),
        mira::embedding::worker::Sweep::default(),
        shutdown.clone(),
    );
    let ranker = IndexRanker::new(index.clone(), embeddings.clone(), Mode::Hybrid).with_fusion(fusion);
    let ctx = AvailabilityContext {
        user_id: "bench".into(),
        is_admin: false,
        device: DeviceInfo::local(),
        workspace_root: None,
        workspace_state: mira::availability::Availability::Available,
        skills: Default::default(),
    };
    let turn = |i: usize| -> (f64, Strategy) {
        let q = &queries[i % queries.len()].query;
        let t = Instant::now();
        let candidates = exposure::candidates(&registry, &ctx);
        let e = exposure::expose(&candidates, q, &ranker, None);
        (t.elapsed().as_secs_f64() * 1000.0, e.strategy)
    };
    // Register everything at once, then serve turns while the indexer embeds.
    let t0 = Instant::now();
    for s in synthetic(base, n) {
        registry.register(Arc::new(BenchTool { spec: s })).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let want = if embeddings.status().state == State::Ready { n } else { 0 };
    let mut during = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let c = index.counts();
        if c.indexed == n && c.embedded >= want {
            break;
        }
        if Instant::now() > deadline {
            bail!("indexing {n} tools took more than 600 s ({c:?})");
        }
        if n > MAX_EXPOSED {
            let i = during.len();
            during.push(tokio::task::block_in_place(|| turn(i)).0);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let indexing_s = t0.elapsed().as_secs_f64();
    let before = embeddings.counters.queries_embedded.load(std::sync::atomic::Ordering::Relaxed);
    let mut lat = Vec::with_capacity(opts.series_turns);
    let mut strategy = Strategy::All;
    for i in 0..opts.series_turns {
        let (ms, s) = tokio::task::block_in_place(|| turn(i));
        lat.push(ms);
        strategy = s;
    }
    let embedded_queries = embeddings.counters.queries_embedded.load(std::sync::atomic::Ordering::Relaxed) - before;
    lat.sort_by(f64::total_cmp);
    during.sort_by(f64::total_cmp);
    println!(
        "| {n} | {} | {embedded_queries} | {:.2} | {:.2} | {:.1} | {} |",
        serde_json::to_value(strategy).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
        percentile(&lat, 50.0),
        percentile(&lat, 99.0),
        indexing_s,
        if during.is_empty() {
            "-".to_owned()
        } else {
            format!("{} turns: {:.2} / {:.2}", during.len(), percentile(&during, 50.0), percentile(&during, 99.0))
        }
    );
    shutdown.cancel();
    let _ = indexer.await;
    store.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_seeded_and_distinct() {
        let a = sample_indexes(1000, 50, 7);
        assert_eq!(a, sample_indexes(1000, 50, 7));
        assert_ne!(a, sample_indexes(1000, 50, 8));
        let set: std::collections::HashSet<_> = a.iter().collect();
        assert_eq!(set.len(), 50);
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
    }
}
