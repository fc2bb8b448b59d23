//! `codebase_explore`: architecture, relations and impact from a code graph, with every
//! candidate checked against the current workspace text before it is returned.
//!
//! The code graph itself (parsing, index, watcher, queries, verification) is the
//! `mira-codegraph` crate, whose modules are re-exported here.
//!
//! Input (`docs/api.md`, Tool inputs): `kind` (`definitions`, `references`, `callers`,
//! `callees`, `dependencies`, `impact`, `overview`) with `symbol`, `path`, `depth`, and the
//! optional `line`/`column` (a location for `references`), `limit` (results, default 50) and
//! `max_tokens` (the `overview` budget, default 2048). Output: `results` (verified candidates,
//! each with `verification.status = "verified"`, its current span, file SHA-256 and excerpt),
//! `stale` (candidates whose text is no longer there), `suggestions` when a symbol is unknown
//! (an empty result, not an error), and `index` (coverage: files, skips, syntax errors).

pub use mira_codegraph::{graph, index, lang, persist, query, resolve, synthetic, verify};

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use self::index::{CodeGraphs, Phase, WorkspaceIndex};
use self::query::{Ctx, Query};
use self::resolve::ModuleGraph;
use crate::availability::{Availability, AvailabilityContext};
use crate::error::ErrorCode;
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::tools::input;
use crate::tools::read::blocking;
use crate::workspace::{self, Workspace};

/// The query kinds: the names of the `kind` input's enum (`QueryKind`), in its order.
pub const KINDS: [&str; QueryKind::ALL.len()] = {
    let mut names = [""; QueryKind::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = QueryKind::ALL[i].as_str();
        i += 1;
    }
    names
};
/// Default `depth` (`impact`: [`DEFAULT_IMPACT_DEPTH`]).
pub const DEFAULT_DEPTH: u64 = 1;
/// Default `depth` of `impact`.
pub const DEFAULT_IMPACT_DEPTH: u64 = 3;
/// Default and largest `limit`.
pub const DEFAULT_LIMIT: u64 = 50;
/// Largest `limit`.
pub const MAX_LIMIT: u64 = 200;
/// Largest `depth`.
pub const MAX_DEPTH: u64 = 5;
/// Default `overview` budget, tokens.
pub const DEFAULT_MAX_TOKENS: u64 = 2048;
/// Largest `overview` budget, tokens.
pub const MAX_MAX_TOKENS: u64 = 16_384;

/// A query kind; [`KINDS`] lists their names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum QueryKind {
    Definitions,
    References,
    Callers,
    Callees,
    Dependencies,
    Impact,
    Overview,
}

impl QueryKind {
    /// Every kind, in the order of the input schema's enum.
    pub(crate) const ALL: [Self; 7] = [
        Self::Definitions,
        Self::References,
        Self::Callers,
        Self::Callees,
        Self::Dependencies,
        Self::Impact,
        Self::Overview,
    ];

    /// The snake_case name (the serde name).
    const fn as_str(self) -> &'static str {
        match self {
            QueryKind::Definitions => "definitions",
            QueryKind::References => "references",
            QueryKind::Callers => "callers",
            QueryKind::Callees => "callees",
            QueryKind::Dependencies => "dependencies",
            QueryKind::Impact => "impact",
            QueryKind::Overview => "overview",
        }
    }
}

/// The input of `codebase_explore` (also its canonical input, defaults filled).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExploreInput {
    /// definitions {symbol}; references {symbol | path+line}; callers/callees {symbol, depth}; dependencies {path}; impact {symbol | path, depth}; overview {path?}
    kind: QueryKind,
    /// A name, or Container::name / module.name
    #[schemars(length(min = 1, max = 512))]
    symbol: Option<String>,
    /// File or folder relative to the workspace root
    #[schemars(length(max = 4096))]
    path: Option<String>,
    /// With path: the location whose symbol references are wanted (1-based)
    #[schemars(range(min = 1, max = u32::MAX))]
    line: Option<u64>,
    /// With path and line: the column (1-based)
    #[schemars(range(min = 1, max = u32::MAX))]
    column: Option<u64>,
    /// Transitive depth for callers, callees and impact (default 1; impact 3)
    #[schemars(range(min = 1, max = MAX_DEPTH))]
    depth: Option<u64>,
    /// Most results (default 50)
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: Option<u64>,
    /// Budget of the overview map (default 2048)
    #[schemars(range(min = 128, max = MAX_MAX_TOKENS))]
    max_tokens: Option<u64>,
}

impl ExploreInput {
    fn limit(&self) -> u64 {
        self.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)
    }

    fn max_tokens(&self) -> u64 {
        self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS).min(MAX_MAX_TOKENS)
    }
}

/// The `codebase_explore` tool.
pub struct CodebaseExplore {
    spec: ToolSpec,
    graphs: Arc<CodeGraphs>,
    modules: Mutex<HashMap<PathBuf, (u64, Arc<ModuleGraph>)>>,
}

impl CodebaseExplore {
    /// The tool over a set of workspace indexes.
    pub fn new(graphs: Arc<CodeGraphs>) -> Self {
        Self {
            spec: ToolSpec {
                id: "codebase_explore".into(),
                kind: ToolKind::Public,
                domain: "read".into(),
                title: "Explore the code graph".into(),
                description: "Answer architecture, relation and impact questions from a code graph of the workspace \
                    (Rust, Python, JavaScript/TypeScript, Go): definitions, references, callers, callees, module \
                    dependencies, the impact of changing a symbol or file, and an overview map of a folder. Every \
                    returned location is re-checked against the current file text; stale candidates are reported apart."
                    .into(),
                input_schema: input::schema_of::<ExploreInput>(),
                requires_approval: false,
                capability: Some("fs.read".into()),
                replacement: None,
                owner: None,
            },
            graphs,
            modules: Mutex::new(HashMap::new()),
        }
    }

    /// The indexes behind the tool.
    pub fn graphs(&self) -> &Arc<CodeGraphs> {
        &self.graphs
    }

    fn module_graph(&self, ix: &WorkspaceIndex) -> Arc<ModuleGraph> {
        let g = ix.graph();
        let generation = g.generation();
        let mut cache = self.modules.lock();
        if let Some((gen_, mg)) = cache.get(ix.root())
            && *gen_ == generation
        {
            return mg.clone();
        }
        let mg = Arc::new(ModuleGraph::build(&g));
        cache.insert(ix.root().to_path_buf(), (generation, mg.clone()));
        mg
    }
}

fn missing(kind: &str, what: &str) -> ToolError {
    ToolError::new(ErrorCode::MissingField, format!("kind {kind} needs {what}"))
        .with_details(json!({"kind": kind, "needs": what}))
}

#[async_trait]
impl Tool for CodebaseExplore {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Unavailable until the first index of the run's workspace is ready
    /// (`index_building` with progress), or `index_failed`. The first question about a
    /// workspace starts its index. Without a workspace in the context there is nothing to
    /// judge: available.
    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        match &ctx.workspace_root {
            Some(root) => self.graphs.availability(root),
            None => Availability::Available,
        }
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let input: ExploreInput = input::parse(&input)?;
        let kind = input.kind.as_str();
        let symbol = input.symbol.as_deref().map(str::trim).filter(|s| !s.is_empty());
        let path = match input.path.as_deref() {
            Some(p) => {
                let p = workspace::normalize(p)?;
                ctx.workspace()?.check_beneath(&p)?;
                Some(p)
            }
            None => None,
        };
        let line = input.line;
        match input.kind {
            QueryKind::Definitions | QueryKind::Callers | QueryKind::Callees if symbol.is_none() => {
                return Err(missing(kind, "symbol"));
            }
            QueryKind::References if symbol.is_none() && (path.is_none() || line.is_none()) => {
                return Err(missing(kind, "symbol, or path and line"));
            }
            QueryKind::Dependencies if path.is_none() => return Err(missing(kind, "path")),
            QueryKind::Impact if symbol.is_none() && path.is_none() => return Err(missing(kind, "symbol or path")),
            _ => {}
        }
        let default_depth = if input.kind == QueryKind::Impact { DEFAULT_IMPACT_DEPTH } else { DEFAULT_DEPTH };
        let mut canonical = json!({
            "kind": kind,
            "depth": input.depth.unwrap_or(default_depth).min(MAX_DEPTH),
            "limit": input.limit(),
        });
        if let Some(s) = symbol {
            canonical["symbol"] = json!(s);
        }
        if let Some(p) = path {
            canonical["path"] = json!(p);
        }
        if let Some(l) = line {
            canonical["line"] = json!(l);
            if let Some(c) = input.column {
                canonical["column"] = json!(c);
            }
        }
        if input.kind == QueryKind::Overview {
            canonical["max_tokens"] = json!(input.max_tokens());
        }
        Ok(Prepared { input: canonical, preview: Value::Null })
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let ix = self
            .graphs
            .ensure_workspace(ctx.workspace()?)
            .map_err(|e| ToolError::new(ErrorCode::IndexFailed, format!("the workspace cannot be indexed: {e}")))?;
        // Every replica indexes the shared workspace itself (docs/architecture.md, Replicas):
        // a call claimed here before this replica's own index is ready waits for it, within
        // the harness's time limit, instead of failing on what another replica exposed.
        while matches!(ix.phase(), Phase::Loading | Phase::Walking | Phase::Parsing) {
            tokio::select! {
                () = ctx.cancel.cancelled() => {
                    return Err(ToolError::new(ErrorCode::Cancelled, "cancelled while the code graph was being built"));
                }
                () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
            }
        }
        if let Availability::Unavailable { code, message } = ix.availability() {
            return Err(ToolError::new(code, message));
        }
        let input = input.clone();
        let ws = ctx.workspace()?.clone();
        let syncing = ix.clone();
        blocking(move || {
            syncing.sync();
            Ok(())
        })
        .await?;
        let modules = self.module_graph(&ix);
        blocking(move || run(&ix, &ws, &modules, &input)).await
    }
}

/// Parses a canonical input into a [`Query`]; an input that is not an `ExploreInput` is
/// `corrupt_input`.
pub fn parse_query(input: &Value) -> Result<Query, ToolError> {
    let input: ExploreInput = input::frozen(input)?;
    Ok(Query {
        kind: input.kind.as_str().to_owned(),
        line: input.line.and_then(|l| u32::try_from(l).ok()),
        column: input.column.and_then(|c| u32::try_from(c).ok()),
        depth: u32::try_from(input.depth.unwrap_or(DEFAULT_DEPTH).min(MAX_DEPTH)).unwrap_or(1),
        limit: usize::try_from(input.limit()).unwrap_or(50),
        max_tokens: usize::try_from(input.max_tokens()).unwrap_or(2048),
        symbol: input.symbol,
        path: input.path,
    })
}

/// Runs a query against a ready index (blocking).
pub fn run(ix: &WorkspaceIndex, ws: &Workspace, modules: &ModuleGraph, input: &Value) -> Result<ToolOutput, ToolError> {
    let q = parse_query(input)?;
    let g = ix.graph();
    let is_dir = match &q.path {
        None => true,
        Some(p) => match ws.dir().metadata(p) {
            Ok(m) => m.is_dir(),
            Err(e) if g.file_id(p).is_none() => return Err(workspace::io_error(p, &e)),
            Err(_) => false,
        },
    };
    let mut cx = Ctx {
        g: &g,
        modules,
        reader: verify::Reader::new(ws),
        evidence: Vec::new(),
        stale: Vec::new(),
        kind: q.kind.clone(),
    };
    let mut output = match q.kind.as_str() {
        "definitions" => cx.definitions(&q),
        "references" => cx.references(&q),
        "callers" => cx.callers(&q),
        "callees" => cx.callees(&q),
        "dependencies" => cx.dependencies(&q, is_dir),
        "impact" => cx.impact(&q, is_dir),
        "overview" => cx.overview(&q),
        other => {
            return Err(ToolError::new(ErrorCode::InvalidKind, format!("unknown kind {other:?}")));
        }
    };
    output["kind"] = json!(q.kind);
    if let Some(symbol) = &q.symbol {
        let empty = output["results"].as_array().is_none_or(Vec::is_empty)
            && output.get("targets").and_then(Value::as_u64).is_none_or(|t| t == 0);
        let (_, name) = query::split_symbol(symbol);
        if empty && g.name_id(name).is_none_or(|id| g.defs_named(id).is_empty()) {
            output["suggestions"] = json!(query::suggestions(&g, name));
            output["note"] = json!(format!("no definition of {symbol:?} is indexed in this workspace"));
        }
    }
    output["stale"] = Value::Array(std::mem::take(&mut cx.stale));
    output["index"] = index_summary(ix, &g);
    Ok(ToolOutput { output, evidence: cx.evidence })
}

/// The `index` block of every answer: coverage and freshness.
pub fn index_summary(ix: &WorkspaceIndex, g: &graph::Graph) -> Value {
    let stats = g.stats();
    let skipped = ix.skipped();
    let timings = ix.timings();
    json!({
        "phase": match ix.phase() { Phase::Ready => "ready", _ => "building" },
        "files": stats.files,
        "definitions": stats.definitions,
        "references": stats.references,
        "files_with_syntax_errors": stats.files_with_syntax_errors,
        "skipped": skipped,
        "parsed_at_start": timings.parsed,
        "reused_at_start": timings.reused,
        "updated_since_start": timings.updated,
        "watched_dirs": ix.watched_dirs(),
        "watch_error": ix.watch_error(),
    })
}

/// Wraps an Edit tool so that each successful change is queued on the code graph of its
/// workspace at once (`path`, `from`, `to` of the input), so the next query sees it without
/// waiting for the file watcher. Everything else is the wrapped tool's.
pub struct ReportsChanges {
    inner: Arc<dyn Tool>,
    graphs: Arc<CodeGraphs>,
}

impl ReportsChanges {
    /// `inner`, reporting to `graphs`.
    pub fn new(inner: Arc<dyn Tool>, graphs: Arc<CodeGraphs>) -> Self {
        Self { inner, graphs }
    }
}

#[async_trait]
impl Tool for ReportsChanges {
    fn spec(&self) -> &ToolSpec {
        self.inner.spec()
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        self.inner.availability(ctx)
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        self.inner.prepare(input, ctx).await
    }

    async fn canonicalize(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        self.inner.canonicalize(input, ctx).await
    }

    fn replay_input(&self, canonical: Value, frozen: &Value) -> Value {
        self.inner.replay_input(canonical, frozen)
    }

    fn side_effects(&self) -> crate::harness::SideEffects {
        self.inner.side_effects()
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let out = self.inner.execute(input, ctx).await?;
        // After the edit ran nothing may fail: without a folder there is no index to tell.
        if let Some(index) = ctx.workspace.as_ref().and_then(|ws| self.graphs.get(ws.root())) {
            index.notify_changed(
                ["path", "from", "to"]
                    .into_iter()
                    .filter_map(|f| input.get(f).and_then(Value::as_str))
                    .map(str::to_owned),
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{KINDS, QueryKind};

    #[test]
    fn kinds_are_the_serde_names_of_query_kind() {
        for (kind, name) in QueryKind::ALL.iter().zip(KINDS) {
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::json!(name));
            assert_eq!(serde_json::from_value::<QueryKind>(serde_json::json!(name)).unwrap(), *kind);
        }
        let schema = serde_json::to_value(schemars::schema_for!(QueryKind)).unwrap();
        assert_eq!(schema["enum"], serde_json::json!(KINDS), "ALL lists every kind, in the schema's order");
    }
}
