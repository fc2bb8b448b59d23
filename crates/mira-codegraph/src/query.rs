//! The seven query kinds over a graph. Candidates come from the graph; every location is then
//! checked against the current text by [`crate::verify::Reader`] and only verified ones are
//! returned as results (with evidence); the others are listed under `stale`.
//!
//! Name resolution is syntactic, like ctags-style code navigation: a call `f()`, `x.f()` or
//! `Q::f()` refers to the definitions named `f`; when the qualifier `Q` is itself a known
//! container (a type, class, trait or module name in the workspace) only definitions in that
//! container or module match; `self`/`Self`/`this`/`cls` and Go receivers were already
//! resolved to the enclosing container when the file was parsed.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Value, json};

use crate::graph::{DefId, FileEntry, Graph, module_name};
use crate::lang::{Def, NONE, Ref, RefKind};
use crate::resolve::ModuleGraph;
use crate::verify::{Check, Reader};
use mira_core::evidence::EvidenceDraft;

/// A parsed `codebase_explore` input.
#[derive(Debug, Clone)]
pub struct Query {
    /// `definitions`, `references`, `callers`, `callees`, `dependencies`, `impact`, `overview`.
    pub kind: String,
    /// Symbol: `name`, `Container::name` or `module.name`.
    pub symbol: Option<String>,
    /// Workspace-relative path (normalised).
    pub path: Option<String>,
    /// 1-based line of a location (for `references` by location).
    pub line: Option<u32>,
    /// 1-based column of a location.
    pub column: Option<u32>,
    /// Transitive depth.
    pub depth: u32,
    /// Most results.
    pub limit: usize,
    /// Token budget of `overview`.
    pub max_tokens: usize,
}

/// What a query returns: the output document and the evidence.
pub struct Answer {
    /// The output.
    pub output: Value,
    /// One draft per verified candidate.
    pub evidence: Vec<EvidenceDraft>,
}

/// Splits `A::b`, `a.b` into (qualifier, name).
pub fn split_symbol(symbol: &str) -> (Option<&str>, &str) {
    let s = symbol.trim().trim_end_matches("()");
    if let Some((q, n)) = s.rsplit_once("::") {
        return (Some(q.rsplit("::").next().unwrap_or(q)), n);
    }
    if let Some((q, n)) = s.rsplit_once('.') {
        return (Some(q.rsplit('.').next().unwrap_or(q)), n);
    }
    (None, s)
}

fn under(path: &str, scope: Option<&str>) -> bool {
    match scope {
        None | Some(".") | Some("") => true,
        Some(p) => path == p || path.starts_with(&format!("{p}/")),
    }
}

/// Whether a call `r` can refer to definition `d` in file `f`.
pub fn call_matches(g: &Graph, r: &Ref, d: &Def, f: &FileEntry) -> bool {
    let q = r.qualifier;
    if q == NONE || q == d.container {
        return true;
    }
    let qn = g.name(q);
    if qn == module_name(&f.path) {
        return true;
    }
    // A qualifier that names no container is a variable of unknown type.
    !g.is_container(q)
}

/// Definitions matching `symbol` under `scope`.
pub fn resolve(g: &Graph, symbol: &str, scope: Option<&str>) -> Vec<DefId> {
    let (q, name) = split_symbol(symbol);
    let Some(id) = g.name_id(name) else { return Vec::new() };
    let mut out: Vec<DefId> = g
        .defs_named(id)
        .iter()
        .copied()
        .filter(|&(fid, di)| {
            let Some(f) = g.file(fid) else { return false };
            let Some(d) = f.defs.get(di as usize) else { return false };
            let q_ok = q.is_none_or(|q| {
                g.name(d.container) == q
                    || module_name(&f.path) == q
                    || (d.parent != NONE && f.defs.get(d.parent as usize).is_some_and(|p| g.name(p.name) == q))
            });
            q_ok && under(&f.path, scope)
        })
        .collect();
    out.sort_by(|a, b| {
        let pa = g.file(a.0).map(|f| &*f.path);
        let pb = g.file(b.0).map(|f| &*f.path);
        pa.cmp(&pb).then(a.1.cmp(&b.1))
    });
    out
}

/// Up to five known names close to `name` (case-insensitive match, substring, or an edit
/// distance of at most a third of its length, Levenshtein 1966), best first.
pub fn suggestions(g: &Graph, name: &str) -> Vec<String> {
    let lower = name.to_lowercase();
    let max_dist = (name.chars().count() / 3).max(1);
    let mut scored: Vec<(usize, usize, String)> = Vec::new();
    for (id, n) in g.all_names() {
        if n.is_empty() || g.defs_named(id).is_empty() {
            continue;
        }
        let nl = n.to_lowercase();
        let score = if nl == lower {
            0
        } else if nl.contains(&lower) || (lower.len() >= 4 && lower.contains(&nl) && nl.len() >= 4) {
            1
        } else {
            match levenshtein(&nl, &lower, max_dist) {
                Some(d) => 1 + d,
                None => continue,
            }
        };
        scored.push((score, g.defs_named(id).len(), n.to_owned()));
    }
    scored.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    scored.into_iter().take(5).map(|(_, _, n)| n).collect()
}

/// Levenshtein distance if at most `max`.
fn levenshtein(a: &str, b: &str, max: usize) -> Option<usize> {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len().abs_diff(b.len()) > max {
        return None;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        if cur.iter().min().is_some_and(|&m| m > max) {
            return None;
        }
        prev = cur;
    }
    prev.last().copied().filter(|&d| d <= max)
}

/// Relation entries keyed by (file, definition index or NONE for top level): distance,
/// sites, names on the other side.
type Found<S> = BTreeMap<(u32, u32), (u32, Vec<S>, Vec<String>)>;
/// Impact entries: distance, impacted names used, sites.
type Impacted = HashMap<(u32, u32), (u32, HashSet<String>, Vec<Ref>)>;
/// Path impact entries by file id: distance, impacted paths imported, import edges.
type ImpactedFiles = HashMap<u32, (u32, HashSet<String>, Vec<(u32, usize, Option<String>)>)>;

/// Runs queries for one call: the graph, the module graph, a reader and the evidence sink.
pub struct Ctx<'a> {
    /// The graph.
    pub g: &'a Graph,
    /// Resolved imports.
    pub modules: &'a ModuleGraph,
    /// Re-reads files.
    pub reader: Reader<'a>,
    /// Evidence collected so far.
    pub evidence: Vec<EvidenceDraft>,
    /// Candidates that failed verification.
    pub stale: Vec<Value>,
    /// The query kind (for provenance).
    pub kind: String,
}

impl Ctx<'_> {
    /// Verifies a definition; returns its JSON when verified (and records evidence).
    fn def_json(&mut self, id: DefId, relation: &str) -> Option<Value> {
        let f = self.g.file(id.0)?;
        let d = *f.defs.get(id.1 as usize)?;
        let check = self.reader.check_def(self.g, &f.path, f.lang, &f.hash_hex(), &d);
        let qualified = self.g.qualified(&d);
        let mut v = json!({
            "name": self.g.name(d.name),
            "qualified_name": qualified,
            "kind": d.kind.name(),
            "path": &*f.path,
            "language": f.lang.name(),
        });
        match check.span() {
            Some((start, end, line, col)) => {
                v["start_line"] = json!(start);
                v["end_line"] = json!(end);
                v["line"] = json!(line);
                v["column"] = json!(col);
                if let Check::Verified { excerpt, .. } = &check {
                    v["excerpt"] = json!(mira_core::evidence::excerpt(excerpt, 1200));
                }
                v["verification"] = check.to_json();
                if let Some(e) = check.evidence(&f.path, &qualified, relation, &self.kind) {
                    self.evidence.push(e);
                }
                Some(v)
            }
            None => {
                v["line"] = json!(d.line);
                v["start_line"] = json!(d.start_line);
                v["verification"] = check.to_json();
                v["relation"] = json!(relation);
                self.stale.push(v);
                None
            }
        }
    }

    /// Verifies a name occurrence; returns `{path, line, column, kind, excerpt, verification}`.
    fn site_json(&mut self, fid: u32, r: &Ref, relation: &str, evidence: bool) -> Option<Value> {
        let f = self.g.file(fid)?;
        let name = self.g.name(r.name).to_owned();
        let check = self.reader.check_name(&f.path, &f.hash_hex(), &name, r.line, r.col);
        let mut v = json!({"path": &*f.path, "kind": r.kind.name(), "name": name});
        if r.scope != NONE
            && let Some(s) = f.defs.get(r.scope as usize)
        {
            v["in"] = json!(self.g.qualified(s));
        }
        match check.span() {
            Some((_, _, line, col)) => {
                v["line"] = json!(line);
                v["column"] = json!(col);
                if let Check::Verified { excerpt, .. } = &check {
                    v["excerpt"] = json!(excerpt);
                }
                v["verification"] = check.to_json();
                if evidence && let Some(e) = check.evidence(&f.path, &name, relation, &self.kind) {
                    self.evidence.push(e);
                }
                Some(v)
            }
            None => {
                v["line"] = json!(r.line);
                v["verification"] = check.to_json();
                v["relation"] = json!(relation);
                self.stale.push(v);
                None
            }
        }
    }

    /// `definitions {symbol}`.
    pub fn definitions(&mut self, q: &Query) -> Value {
        let symbol = q.symbol.clone().unwrap_or_default();
        let ids = resolve(self.g, &symbol, q.path.as_deref());
        let total = ids.len();
        let mut results = Vec::new();
        for id in ids.into_iter().take(q.limit) {
            if let Some(v) = self.def_json(id, "definition") {
                results.push(v);
            }
        }
        json!({"symbol": symbol, "results": results, "total_candidates": total, "truncated": total > q.limit})
    }

    /// `references {symbol | path+line[+column]}`.
    pub fn references(&mut self, q: &Query) -> Value {
        let symbol = match (&q.symbol, &q.path, q.line) {
            (Some(s), _, _) => s.clone(),
            (None, Some(p), Some(line)) => match self.symbol_at(p, line, q.column) {
                Some(s) => s,
                None => {
                    return json!({"results": [], "location": {"path": p, "line": line}, "note": "no indexed symbol at that location"});
                }
            },
            _ => String::new(),
        };
        let (qual, name) = split_symbol(&symbol);
        let Some(id) = self.g.name_id(name) else { return json!({"symbol": symbol, "results": []}) };
        let targets = resolve(self.g, &symbol, None);
        let mut files: Vec<u32> = self.g.files_referring(id).to_vec();
        files.sort_by_key(|f| self.g.file(*f).map(|e| e.path.clone()));
        let scope = if q.symbol.is_some() { q.path.clone() } else { None };
        let mut sites = Vec::new();
        for fid in files {
            let Some(f) = self.g.file(fid) else { continue };
            if !under(&f.path, scope.as_deref()) {
                continue;
            }
            for r in f.refs.iter().filter(|r| r.name == id) {
                if qual.is_some() && r.kind == RefKind::Call {
                    let ok = targets.iter().any(|t| {
                        self.g.file(t.0).zip(self.g.def(*t)).is_some_and(|(tf, td)| call_matches(self.g, r, td, tf))
                    });
                    if !ok {
                        continue;
                    }
                }
                sites.push((fid, *r));
            }
        }
        let total = sites.len();
        let mut results = Vec::new();
        for (fid, r) in sites.into_iter().take(q.limit) {
            if let Some(v) = self.site_json(fid, &r, "reference", true) {
                results.push(v);
            }
        }
        json!({"symbol": symbol, "results": results, "total_candidates": total, "truncated": total > q.limit,
               "definitions": targets.len()})
    }

    fn symbol_at(&self, path: &str, line: u32, column: Option<u32>) -> Option<String> {
        let f = self.g.file(self.g.file_id(path)?)?;
        let hit = |l: u32, c: u32, name: u32| {
            l == line && column.is_none_or(|col| col >= c && col < c + self.g.name(name).len() as u32)
        };
        if let Some(d) = f.defs.iter().find(|d| hit(d.line, d.col, d.name)) {
            return Some(self.g.qualified(d));
        }
        f.refs.iter().find(|r| hit(r.line, r.col, r.name)).map(|r| self.g.name(r.name).to_owned())
    }

    /// Calls in any file that may call `t`, as (file, ref).
    fn calls_to(&self, t: DefId) -> Vec<(u32, Ref)> {
        let (Some(tf), Some(td)) = (self.g.file(t.0), self.g.def(t)) else { return Vec::new() };
        let mut out = Vec::new();
        for &fid in self.g.files_referring(td.name) {
            let Some(f) = self.g.file(fid) else { continue };
            for r in f.refs.iter().filter(|r| r.kind == RefKind::Call && r.name == td.name) {
                if call_matches(self.g, r, td, tf) {
                    out.push((fid, *r));
                }
            }
        }
        out
    }

    /// `callers {symbol, depth}`.
    pub fn callers(&mut self, q: &Query) -> Value {
        let symbol = q.symbol.clone().unwrap_or_default();
        let targets = resolve(self.g, &symbol, None);
        let mut seen: HashSet<DefId> = targets.iter().copied().collect();
        let mut frontier = targets.clone();
        // caller key: (file, def index or NONE for top level) → (distance, sites, callees)
        let mut found: Found<Ref> = BTreeMap::new();
        for distance in 1..=q.depth {
            let mut next = Vec::new();
            for t in frontier {
                let callee = self.g.def(t).map(|d| self.g.qualified(d)).unwrap_or_default();
                for (fid, r) in self.calls_to(t) {
                    let key = (fid, r.scope);
                    let entry = found.entry(key).or_insert_with(|| (distance, Vec::new(), Vec::new()));
                    if entry.0 == distance {
                        if entry.1.len() < 20 {
                            entry.1.push(r);
                        }
                        if !entry.2.contains(&callee) {
                            entry.2.push(callee.clone());
                        }
                    }
                    if r.scope != NONE && seen.insert(key) {
                        next.push(key);
                    }
                }
            }
            frontier = next;
        }
        let mut ordered: Vec<_> = found.into_iter().collect();
        ordered.sort_by_key(|((f, d), (dist, sites, _))| (*dist, std::cmp::Reverse(sites.len()), *f, *d));
        let total = ordered.len();
        let results = self.render_relations(ordered.into_iter().take(q.limit), "caller", "calls");
        json!({"symbol": symbol, "targets": targets.len(), "results": results, "total_candidates": total,
               "truncated": total > q.limit, "depth": q.depth})
    }

    /// Renders (file, def) relation entries with their call sites, verifying both.
    fn render_relations(
        &mut self,
        entries: impl Iterator<Item = ((u32, u32), (u32, Vec<Ref>, Vec<String>))>,
        relation: &str,
        via: &str,
    ) -> Vec<Value> {
        let mut results = Vec::new();
        for ((fid, di), (distance, sites, names)) in entries {
            let mut v = if di == NONE {
                let Some(f) = self.g.file(fid) else { continue };
                json!({"name": "<module>", "qualified_name": format!("<module {}>", f.path), "kind": "module_top_level", "path": &*f.path})
            } else {
                match self.def_json((fid, di), relation) {
                    Some(v) => v,
                    None => continue,
                }
            };
            let mut checked = Vec::new();
            for r in &sites {
                if let Some(s) = self.site_json(fid, r, "call_site", di == NONE) {
                    checked.push(s);
                }
            }
            if checked.is_empty() {
                continue;
            }
            v["distance"] = json!(distance);
            v[via] = json!(names);
            v["call_sites"] = Value::Array(checked);
            results.push(v);
        }
        results
    }

    /// Whether ref scope `scope` is `def` or nested inside it.
    fn within(f: &FileEntry, mut scope: u32, def: u32) -> bool {
        let mut hops = 0;
        while scope != NONE && hops < 64 {
            if scope == def {
                return true;
            }
            scope = f.defs.get(scope as usize).map_or(NONE, |d| d.parent);
            hops += 1;
        }
        false
    }

    /// Candidate definitions a call resolves to: matching name and qualifier; when several,
    /// those in the calling file win, then those in the same container.
    fn resolve_call(&self, fid: u32, r: &Ref) -> Vec<DefId> {
        let all: Vec<DefId> = self
            .g
            .defs_named(r.name)
            .iter()
            .copied()
            .filter(|&t| {
                self.g
                    .file(t.0)
                    .zip(self.g.def(t))
                    .is_some_and(|(tf, td)| td.kind.is_callable() && call_matches(self.g, r, td, tf))
            })
            .collect();
        if all.len() <= 1 {
            return all;
        }
        let same_file: Vec<DefId> = all.iter().copied().filter(|t| t.0 == fid).collect();
        if !same_file.is_empty() {
            return same_file;
        }
        if r.qualifier != NONE {
            let same_container: Vec<DefId> =
                all.iter().copied().filter(|t| self.g.def(*t).is_some_and(|d| d.container == r.qualifier)).collect();
            if !same_container.is_empty() {
                return same_container;
            }
        }
        all
    }

    /// `callees {symbol, depth}`.
    pub fn callees(&mut self, q: &Query) -> Value {
        let symbol = q.symbol.clone().unwrap_or_default();
        let targets = resolve(self.g, &symbol, q.path.as_deref());
        let mut seen: HashSet<DefId> = targets.iter().copied().collect();
        let mut frontier = targets.clone();
        let mut found: Found<(u32, Ref)> = BTreeMap::new();
        let mut unresolved: BTreeMap<String, Vec<(u32, Ref)>> = BTreeMap::new();
        for distance in 1..=q.depth {
            let mut next = Vec::new();
            for t in frontier {
                let Some(f) = self.g.file(t.0) else { continue };
                let caller = self.g.def(t).map(|d| self.g.qualified(d)).unwrap_or_default();
                let calls: Vec<Ref> = f
                    .refs
                    .iter()
                    .filter(|r| r.kind == RefKind::Call && Self::within(f, r.scope, t.1))
                    .copied()
                    .collect();
                for r in calls {
                    let cands = self.resolve_call(t.0, &r);
                    if cands.is_empty() {
                        if distance == 1 {
                            let e = unresolved.entry(self.g.name(r.name).to_owned()).or_default();
                            if e.len() < 5 {
                                e.push((t.0, r));
                            }
                        }
                        continue;
                    }
                    for c in cands.into_iter().take(5) {
                        let entry = found.entry(c).or_insert_with(|| (distance, Vec::new(), Vec::new()));
                        if entry.0 == distance {
                            if entry.1.len() < 20 {
                                entry.1.push((t.0, r));
                            }
                            if !entry.2.contains(&caller) {
                                entry.2.push(caller.clone());
                            }
                        }
                        if seen.insert(c) {
                            next.push(c);
                        }
                    }
                }
            }
            frontier = next;
        }
        let total = found.len();
        let mut ordered: Vec<_> = found.into_iter().collect();
        ordered.sort_by_key(|((f, d), (dist, sites, _))| (*dist, std::cmp::Reverse(sites.len()), *f, *d));
        let mut results = Vec::new();
        for ((fid, di), (distance, sites, callers)) in ordered.into_iter().take(q.limit) {
            let Some(mut v) = self.def_json((fid, di), "callee") else { continue };
            let mut checked = Vec::new();
            for (sf, r) in &sites {
                if let Some(s) = self.site_json(*sf, r, "call_site", false) {
                    checked.push(s);
                }
            }
            v["distance"] = json!(distance);
            v["called_from"] = json!(callers);
            v["call_sites"] = Value::Array(checked);
            results.push(v);
        }
        let mut ext = Vec::new();
        for (name, sites) in unresolved.into_iter().take(q.limit) {
            let mut checked = Vec::new();
            for (sf, r) in &sites {
                if let Some(s) = self.site_json(*sf, r, "call_site", false) {
                    checked.push(s);
                }
            }
            if !checked.is_empty() {
                ext.push(json!({"name": name, "call_sites": checked}));
            }
        }
        json!({"symbol": symbol, "targets": targets.len(), "results": results, "unresolved": ext,
               "total_candidates": total, "truncated": total > q.limit, "depth": q.depth})
    }

    fn import_json(&mut self, fid: u32, import: usize, to: Option<&str>) -> Option<Value> {
        let f = self.g.file(fid)?;
        let imp = f.imports.get(import)?;
        let target = self.g.name(imp.target).to_owned();
        // The last path segment is on the import's line however the statement is spelled
        // (`mod x;` is stored as `self::x`, `use a::b::{c}` as `a::b`).
        let last = target.rsplit("::").next().unwrap_or(&target);
        let probe = if last.contains('/') { last } else { last.rsplit('.').next().unwrap_or(last) };
        let probe = if probe.is_empty() { last.to_owned() } else { probe.to_owned() };
        let check = self.reader.check_text(&f.path, &f.hash_hex(), &probe, imp.line);
        let mut v = json!({"from": &*f.path, "import": target, "to": to, "external": to.is_none()});
        match check.span() {
            Some((_, _, line, _)) => {
                v["line"] = json!(line);
                if let Check::Verified { excerpt, .. } = &check {
                    v["excerpt"] = json!(excerpt);
                }
                v["verification"] = check.to_json();
                if let Some(e) = check.evidence(&f.path, &target, "import", &self.kind) {
                    self.evidence.push(e);
                }
                Some(v)
            }
            None => {
                v["line"] = json!(imp.line);
                v["verification"] = check.to_json();
                self.stale.push(v);
                None
            }
        }
    }

    /// `dependencies {path}`: imports out of and into a file or folder.
    pub fn dependencies(&mut self, q: &Query, is_dir: bool) -> Value {
        let path = q.path.clone().unwrap_or_else(|| ".".into());
        let inside = |p: &str| if is_dir { under(p, Some(&path)) } else { p == path };
        let mut out_edges = Vec::new();
        let mut ids: Vec<u32> = self.g.files().filter(|(_, f)| inside(&f.path)).map(|(id, _)| id).collect();
        ids.sort_by_key(|id| self.g.file(*id).map(|f| f.path.clone()));
        for id in &ids {
            for e in self.modules.out.get(id).map(Vec::as_slice).unwrap_or(&[]) {
                let internal = e.to.as_deref().is_some_and(|t| is_dir && under(t, Some(&path)));
                if !internal {
                    out_edges.push((e.from, e.import, e.to.clone()));
                }
            }
        }
        let mut in_edges: Vec<(u32, usize, Option<String>)> = self
            .modules
            .edges_into(&path, is_dir)
            .into_iter()
            .filter(|e| self.g.file(e.from).is_some_and(|f| !inside(&f.path)))
            .map(|e| (e.from, e.import, e.to.clone()))
            .collect();
        in_edges.sort_by_key(|(f, i, _)| (self.g.file(*f).map(|e| e.path.clone()), *i));
        let (total_out, total_in) = (out_edges.len(), in_edges.len());
        let mut outgoing = Vec::new();
        for (f, i, to) in out_edges.into_iter().take(q.limit) {
            if let Some(v) = self.import_json(f, i, to.as_deref()) {
                outgoing.push(v);
            }
        }
        let mut incoming = Vec::new();
        for (f, i, to) in in_edges.into_iter().take(q.limit) {
            if let Some(v) = self.import_json(f, i, to.as_deref()) {
                incoming.push(v);
            }
        }
        json!({"path": path, "is_folder": is_dir, "files": ids.len(), "imports": outgoing, "imported_by": incoming,
               "total_imports": total_out, "total_imported_by": total_in,
               "truncated": total_out > q.limit || total_in > q.limit})
    }

    /// `impact {symbol | path, depth}`: transitive dependants ranked by distance, then by
    /// fan-in (how many impacted items each dependant uses), then by how widely it is used.
    pub fn impact(&mut self, q: &Query, is_dir: bool) -> Value {
        match &q.symbol {
            Some(symbol) => self.impact_symbol(q, symbol.clone()),
            None => self.impact_path(q, is_dir),
        }
    }

    fn impact_symbol(&mut self, q: &Query, symbol: String) -> Value {
        let targets = resolve(self.g, &symbol, None);
        let mut seen: HashSet<(u32, u32)> = targets.iter().copied().collect();
        let mut frontier = targets.clone();
        let mut found: Impacted = HashMap::new();
        for distance in 1..=q.depth {
            let mut next = Vec::new();
            for t in frontier {
                let (Some(tf), Some(td)) = (self.g.file(t.0), self.g.def(t).copied()) else { continue };
                let tname = self.g.qualified(&td);
                for &fid in self.g.files_referring(td.name) {
                    let Some(f) = self.g.file(fid) else { continue };
                    for r in f.refs.iter().filter(|r| r.name == td.name) {
                        if r.kind == RefKind::Call && !call_matches(self.g, r, &td, tf) {
                            continue;
                        }
                        if fid == t.0 && Self::within(f, r.scope, t.1) {
                            continue;
                        }
                        let key = (fid, r.scope);
                        let e = found.entry(key).or_insert_with(|| (distance, HashSet::new(), Vec::new()));
                        if e.0 == distance {
                            e.1.insert(tname.clone());
                            if e.2.len() < 5 {
                                e.2.push(*r);
                            }
                        }
                        if r.scope != NONE && seen.insert(key) {
                            next.push(key);
                        }
                    }
                }
            }
            frontier = next;
        }
        let mut ordered: Vec<_> = found.into_iter().collect();
        let usage = |g: &Graph, k: &(u32, u32)| g.def(*k).map_or(0, |d| g.files_referring(d.name).len());
        ordered.sort_by(|a, b| {
            (a.1.0, std::cmp::Reverse(a.1.1.len()), std::cmp::Reverse(usage(self.g, &a.0)), a.0).cmp(&(
                b.1.0,
                std::cmp::Reverse(b.1.1.len()),
                std::cmp::Reverse(usage(self.g, &b.0)),
                b.0,
            ))
        });
        let total = ordered.len();
        let mut files: BTreeMap<String, (u32, usize)> = BTreeMap::new();
        for ((fid, _), (d, _, _)) in &ordered {
            if let Some(f) = self.g.file(*fid) {
                let e = files.entry(f.path.to_string()).or_insert((*d, 0));
                e.0 = e.0.min(*d);
                e.1 += 1;
            }
        }
        let mut results = Vec::new();
        for ((fid, di), (distance, via, sites)) in ordered.into_iter().take(q.limit) {
            let fan_in = via.len();
            let used_by = usage(self.g, &(fid, di));
            let mut via: Vec<String> = via.into_iter().collect();
            via.sort();
            let entries = std::iter::once(((fid, di), (distance, sites, via)));
            for mut v in self.render_relations(entries, "dependant", "uses") {
                v["fan_in"] = json!(fan_in);
                v["used_by_files"] = json!(used_by);
                v["references"] = v["call_sites"].take();
                if let Some(o) = v.as_object_mut() {
                    o.remove("call_sites");
                }
                results.push(v);
            }
        }
        let mut file_list: Vec<Value> =
            files.into_iter().map(|(p, (d, n))| json!({"path": p, "distance": d, "dependants": n})).collect();
        file_list.sort_by_key(|v| (v["distance"].as_u64(), std::cmp::Reverse(v["dependants"].as_u64())));
        file_list.truncate(q.limit);
        json!({"symbol": symbol, "targets": targets.len(), "results": results, "files": file_list,
               "total_candidates": total, "truncated": total > q.limit, "depth": q.depth})
    }

    fn impact_path(&mut self, q: &Query, is_dir: bool) -> Value {
        let path = q.path.clone().unwrap_or_else(|| ".".into());
        let mut seen: HashSet<String> = HashSet::new();
        let mut frontier: Vec<(String, bool)> = vec![(path.clone(), is_dir)];
        seen.insert(path.clone());
        // dependant file id → (distance, impacted paths it imports, edges)
        let mut found: ImpactedFiles = HashMap::new();
        for distance in 1..=q.depth {
            let mut next = Vec::new();
            for (p, dir) in &frontier {
                for e in self.modules.edges_into(p, *dir) {
                    let Some(f) = self.g.file(e.from) else { continue };
                    if *dir && under(&f.path, Some(p)) {
                        continue;
                    }
                    let entry = found.entry(e.from).or_insert_with(|| (distance, HashSet::new(), Vec::new()));
                    if entry.0 == distance {
                        entry.1.insert(p.clone());
                        if entry.2.len() < 5 {
                            entry.2.push((e.from, e.import, e.to.clone()));
                        }
                    }
                    if seen.insert(f.path.to_string()) {
                        next.push((f.path.to_string(), false));
                    }
                }
            }
            frontier = next;
        }
        let mut ordered: Vec<_> = found.into_iter().collect();
        let fan_in_of =
            |g: &Graph, m: &ModuleGraph, id: u32| g.file(id).map_or(0, |f| m.edges_into(&f.path, false).len());
        ordered.sort_by_key(|(id, (d, via, _))| {
            (*d, std::cmp::Reverse(via.len()), std::cmp::Reverse(fan_in_of(self.g, self.modules, *id)), *id)
        });
        let total = ordered.len();
        let mut results = Vec::new();
        for (id, (distance, via, edges)) in ordered.into_iter().take(q.limit) {
            let Some(f) = self.g.file(id) else { continue };
            let fpath = f.path.to_string();
            let mut imports = Vec::new();
            for (from, i, to) in edges {
                if let Some(v) = self.import_json(from, i, to.as_deref()) {
                    imports.push(v);
                }
            }
            if imports.is_empty() {
                continue;
            }
            let mut via: Vec<String> = via.into_iter().collect();
            via.sort();
            results.push(json!({"path": fpath, "distance": distance, "fan_in": via.len(), "depends_on": via,
                                "imported_by_files": fan_in_of(self.g, self.modules, id), "imports": imports}));
        }
        json!({"path": path, "results": results, "total_candidates": total, "truncated": total > q.limit, "depth": q.depth})
    }

    /// `overview {path?}`: the modules of a folder (its files and sub-folders), their main
    /// definitions and the edges between them, ranked by PageRank (Brin & Page 1998, damping
    /// 0.85, 30 iterations) over the module graph whose edges are imports plus cross-module
    /// references to definitions, rendered as a repository map within `max_tokens` (about 4
    /// bytes per token).
    pub fn overview(&mut self, q: &Query) -> Value {
        let base = q.path.clone().filter(|p| p != ".");
        let module_of = |path: &str| -> Option<String> {
            let rest = match &base {
                None => path,
                Some(b) => path.strip_prefix(b.as_str())?.strip_prefix('/')?,
            };
            let head = rest.split('/').next()?;
            let m = match &base {
                None => head.to_owned(),
                Some(b) => format!("{b}/{head}"),
            };
            Some(if rest.contains('/') { format!("{m}/") } else { m })
        };
        let mut modules: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (id, f) in self.g.files() {
            if let Some(m) = module_of(&f.path) {
                modules.entry(m).or_default().push(id);
            }
        }
        let names: Vec<String> = modules.keys().cloned().collect();
        let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect();
        let file_module: HashMap<u32, usize> = modules
            .iter()
            .flat_map(|(m, ids)| ids.iter().map(move |id| (*id, m)))
            .filter_map(|(id, m)| index.get(m.as_str()).map(|&i| (id, i)))
            .collect();
        // Edges: references to a definition in another module, weighted 1/(number of
        // definitions of that name) so that common names count little; plus imports.
        let mut weights: HashMap<(usize, usize), f64> = HashMap::new();
        let mut def_score: HashMap<DefId, f64> = HashMap::new();
        for (&fid, &mi) in &file_module {
            let Some(f) = self.g.file(fid) else { continue };
            let mut names_seen = HashSet::new();
            for r in &f.refs {
                if r.kind == RefKind::Other && !names_seen.insert(r.name) {
                    continue;
                }
                let defs = self.g.defs_named(r.name);
                if defs.is_empty() || defs.len() > 8 {
                    continue;
                }
                let w = 1.0 / defs.len() as f64;
                for d in defs {
                    let Some(&mj) = file_module.get(&d.0) else { continue };
                    if mj != mi {
                        *weights.entry((mi, mj)).or_default() += w;
                        *def_score.entry(*d).or_default() += w;
                    }
                }
            }
            for e in self.modules.out.get(&fid).map(Vec::as_slice).unwrap_or(&[]) {
                if let Some(to) = &e.to
                    && let Some(tid) = self.g.file_id(to)
                    && let Some(&mj) = file_module.get(&tid)
                    && mj != mi
                {
                    *weights.entry((mi, mj)).or_default() += 1.0;
                }
            }
        }
        let rank = pagerank(names.len(), &weights);
        let mut order: Vec<usize> = (0..names.len()).collect();
        order.sort_by(|a, b| rank[*b].total_cmp(&rank[*a]).then(a.cmp(b)));
        let budget = q.max_tokens * 4;
        let mut map = String::new();
        let mut out_modules = Vec::new();
        let mut truncated = false;
        'modules: for &mi in &order {
            let ids = &modules[&names[mi]];
            let mut defs: Vec<(f64, DefId)> = ids
                .iter()
                .flat_map(|&fid| {
                    self.g.file(fid).into_iter().flat_map(move |f| {
                        f.defs
                            .iter()
                            .enumerate()
                            .filter(|(_, d)| d.parent == NONE || d.kind.is_callable())
                            .map(move |(i, _)| (fid, u32::try_from(i).unwrap_or(NONE)))
                    })
                })
                .map(|id| (def_score.get(&id).copied().unwrap_or(0.0), id))
                .collect();
            defs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            let header = format!("{} ({} files, rank {:.3})\n", names[mi], ids.len(), rank[mi]);
            if map.len() + header.len() > budget {
                truncated = true;
                break;
            }
            map.push_str(&header);
            let mut listed = Vec::new();
            for (score, id) in defs.into_iter().take(8) {
                let Some(v) = self.def_json(id, "overview_definition") else { continue };
                let first = v["excerpt"].as_str().and_then(|e| e.lines().next()).unwrap_or("").trim().to_owned();
                let line = format!(
                    "  {}:{}  {}\n",
                    v["path"].as_str().unwrap_or(""),
                    v["line"],
                    mira_core::evidence::excerpt(&first, 160)
                );
                if map.len() + line.len() > budget {
                    truncated = true;
                    out_modules.push(
                        json!({"module": names[mi], "files": ids.len(), "rank": rank[mi], "definitions": listed}),
                    );
                    break 'modules;
                }
                map.push_str(&line);
                listed
                    .push(json!({"name": v["qualified_name"], "kind": v["kind"], "path": v["path"], "line": v["line"],
                                   "score": score, "verification": v["verification"]}));
            }
            out_modules.push(json!({"module": names[mi], "files": ids.len(), "rank": rank[mi], "definitions": listed}));
        }
        let mut edges: Vec<((usize, usize), f64)> = weights.into_iter().collect();
        edges.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let edges: Vec<Value> = edges
            .into_iter()
            .take(q.limit)
            .map(|((a, b), w)| json!({"from": names[a], "to": names[b], "weight": (w * 100.0).round() / 100.0}))
            .collect();
        json!({"path": q.path.clone().unwrap_or_else(|| ".".into()), "modules": out_modules, "edges": edges,
               "map": map, "max_tokens": q.max_tokens, "truncated": truncated, "module_count": names.len()})
    }
}

/// PageRank over `n` nodes with weighted edges; dangling nodes spread uniformly.
fn pagerank(n: usize, weights: &HashMap<(usize, usize), f64>) -> Vec<f64> {
    if n == 0 {
        return Vec::new();
    }
    let mut out_sum = vec![0.0; n];
    for (&(a, _), &w) in weights {
        out_sum[a] += w;
    }
    let mut rank = vec![1.0 / n as f64; n];
    for _ in 0..30 {
        let dangling: f64 = (0..n).filter(|&i| out_sum[i] == 0.0).map(|i| rank[i]).sum();
        let mut next = vec![(1.0 - 0.85) / n as f64 + 0.85 * dangling / n as f64; n];
        for (&(a, b), &w) in weights {
            next[b] += 0.85 * rank[a] * w / out_sum[a];
        }
        rank = next;
    }
    rank
}
