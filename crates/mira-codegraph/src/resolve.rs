//! Module-level dependencies: each import resolved to a workspace file or folder, or marked
//! external, following each language's own lookup rules as far as the file tree shows them:
//!
//! - Rust: `crate::a::b` from the crate's `src/` (`a/b.rs`, `a/b/mod.rs`, then `a.rs`…,
//!   longest first), `self::`/`super::` from the file's module folder, `mod x;` → `x.rs` or
//!   `x/mod.rs` (the Reference's module-path rules); anything else is an external crate.
//! - Python: dotted names under the root or any ancestor folder of the importing file
//!   (`a/b.py`, `a/b/__init__.py`); leading dots are relative (PEP 328).
//! - JavaScript/TypeScript: relative specifiers with the extension and `index` lookups of
//!   Node and TypeScript (`.ts`, `.tsx`, `.d.ts`, `.js`, `.jsx`, `.mjs`, `.cjs`, `/index.*`);
//!   bare specifiers are packages (external).
//! - Go: an import path is matched to the folder whose path is its longest suffix (a Go
//!   package is a folder); the standard library and other modules are external.

use std::collections::{HashMap, HashSet};

use crate::graph::Graph;
use crate::lang::Lang;

/// One import edge.
#[derive(Debug, Clone)]
pub struct Edge {
    /// Importing file id.
    pub from: u32,
    /// Index into the importing file's `imports`.
    pub import: usize,
    /// Resolved workspace path (a file, or a folder for Go packages), None if external.
    pub to: Option<String>,
}

/// Every import of the graph, resolved, with a reverse index.
#[derive(Debug, Default)]
pub struct ModuleGraph {
    /// Edges by importing file id.
    pub out: HashMap<u32, Vec<Edge>>,
    /// Edges by target path.
    pub into: HashMap<String, Vec<Edge>>,
}

fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

fn join(dir: &str, rel: &str) -> String {
    if dir.is_empty() { rel.to_owned() } else { format!("{dir}/{rel}") }
}

/// Normalises `a/./b/../c` to `a/c`; None if it climbs above the root.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

struct Resolver<'g> {
    files: HashSet<&'g str>,
    dirs: HashMap<String, bool>,
}

impl<'g> Resolver<'g> {
    fn file(&self, p: &str) -> Option<String> {
        self.files.contains(p).then(|| p.to_owned())
    }

    fn rust(&self, from: &str, target: &str) -> Option<String> {
        let segs: Vec<&str> = target.split("::").map(str::trim).filter(|s| !s.is_empty()).collect();
        let (&first, rest) = segs.split_first()?;
        let file_name = from.rsplit('/').next().unwrap_or(from);
        let stem = file_name.trim_end_matches(".rs");
        let module_dir =
            if matches!(stem, "mod" | "lib" | "main") { parent(from).to_owned() } else { join(parent(from), stem) };
        let (base, rest) = match first {
            "crate" => {
                let src = from.rfind("src/").map_or(String::new(), |i| from[..i + 3].to_owned());
                (src, rest)
            }
            "self" => (module_dir, rest),
            "super" => {
                let mut dir = parent(&module_dir).to_owned();
                let mut rest = rest;
                while rest.first() == Some(&"super") {
                    dir = parent(&dir).to_owned();
                    rest = &rest[1..];
                }
                (dir, rest)
            }
            _ => return None,
        };
        for n in (1..=rest.len()).rev() {
            let p = join(&base, &rest[..n].join("/"));
            if let Some(f) = self.file(&format!("{p}.rs")).or_else(|| self.file(&format!("{p}/mod.rs"))) {
                return Some(f);
            }
        }
        // The item is in the base module itself.
        ["mod.rs", "lib.rs", "main.rs"]
            .iter()
            .find_map(|f| self.file(&join(&base, f)))
            .or_else(|| self.file(&format!("{base}.rs")))
    }

    /// The longest dotted prefix of `target` that is a module.
    fn python(&self, from: &str, target: &str) -> Option<String> {
        let dots = target.chars().take_while(|c| *c == '.').count();
        let mut module = &target[dots..];
        loop {
            if let Some(f) = self.python_module(from, dots, module) {
                return Some(f);
            }
            match module.rsplit_once('.') {
                Some((head, _)) => module = head,
                None if !module.is_empty() && dots > 0 => module = "",
                None => return None,
            }
        }
    }

    fn python_module(&self, from: &str, dots: usize, module: &str) -> Option<String> {
        let rel = module.replace('.', "/");
        let candidates = |base: &str| {
            let p = join(base, &rel);
            if rel.is_empty() {
                self.file(&join(base, "__init__.py"))
            } else {
                self.file(&format!("{p}.py"))
                    .or_else(|| self.file(&format!("{p}.pyi")))
                    .or_else(|| self.file(&format!("{p}/__init__.py")))
            }
        };
        if dots > 0 {
            let mut dir = parent(from).to_owned();
            for _ in 1..dots {
                dir = parent(&dir).to_owned();
            }
            return candidates(&dir);
        }
        let mut dir = parent(from).to_owned();
        loop {
            if let Some(f) = candidates(&dir) {
                return Some(f);
            }
            if dir.is_empty() {
                return None;
            }
            dir = parent(&dir).to_owned();
        }
    }

    fn js(&self, from: &str, target: &str) -> Option<String> {
        if !target.starts_with('.') {
            return None;
        }
        let p = normalize(&join(parent(from), target))?;
        let stripped = p.strip_suffix(".js").or_else(|| p.strip_suffix(".mjs")).unwrap_or(&p).to_owned();
        let exts = ["", ".ts", ".tsx", ".d.ts", ".js", ".jsx", ".mjs", ".cjs"];
        for base in [&p, &stripped] {
            for e in exts {
                if let Some(f) = self.file(&format!("{base}{e}")) {
                    return Some(f);
                }
            }
        }
        for e in ["ts", "tsx", "js", "jsx", "mjs"] {
            if let Some(f) = self.file(&format!("{p}/index.{e}")) {
                return Some(f);
            }
        }
        None
    }

    fn go(&self, target: &str) -> Option<String> {
        let segs: Vec<&str> = target.split('/').collect();
        for start in 0..segs.len() {
            let suffix = segs[start..].join("/");
            if self.dirs.contains_key(&suffix) {
                return Some(suffix);
            }
        }
        None
    }
}

impl ModuleGraph {
    /// Resolves every import of `graph`.
    pub fn build(graph: &Graph) -> ModuleGraph {
        let mut files = HashSet::new();
        let mut dirs = HashMap::new();
        for (_, f) in graph.files() {
            files.insert(&*f.path);
            if f.lang == Lang::Go {
                dirs.insert(parent(&f.path).to_owned(), true);
            }
        }
        let r = Resolver { files, dirs };
        let mut mg = ModuleGraph::default();
        for (id, f) in graph.files() {
            for (i, imp) in f.imports.iter().enumerate() {
                let target = graph.name(imp.target);
                let to = match f.lang {
                    Lang::Rust => r.rust(&f.path, target),
                    Lang::Python => r.python(&f.path, target),
                    Lang::Go => r.go(target),
                    Lang::JavaScript | Lang::TypeScript | Lang::Tsx => r.js(&f.path, target),
                };
                let to = to.filter(|t| t.as_str() != &*f.path);
                let edge = Edge { from: id, import: i, to: to.clone() };
                if let Some(t) = to {
                    mg.into.entry(t).or_default().push(edge.clone());
                }
                mg.out.entry(id).or_default().push(edge);
            }
        }
        mg
    }

    /// Edges into `path` (a file, its Go package folder, or any file under a folder).
    pub fn edges_into(&self, path: &str, is_dir: bool) -> Vec<&Edge> {
        let dir_prefix = format!("{path}/");
        self.into
            .iter()
            .filter(|(t, _)| {
                if is_dir {
                    path == "." || t.as_str() == path || t.starts_with(&dir_prefix)
                } else {
                    t.as_str() == path || t.as_str() == parent(path) && path.ends_with(".go")
                }
            })
            .flat_map(|(_, e)| e.iter())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lang::FileParser;

    #[test]
    fn resolves_rust_python_js_go_imports() {
        let mut g = Graph::new();
        let mut p = FileParser::new();
        let mut add = |path: &str, lang: Lang, src: &[u8]| {
            g.upsert(path, [0; 32], 1, lang, p.parse(lang, src));
        };
        add("src/lib.rs", Lang::Rust, b"mod store;\nuse crate::store::runs::Row;\nuse std::io;\n");
        add("src/store/mod.rs", Lang::Rust, b"pub mod runs;\n");
        add("src/store/runs.rs", Lang::Rust, b"use super::Thing;\npub struct Row;\n");
        add("pkg/a.py", Lang::Python, b"from .b import x\nimport pkg.b\nimport os\n");
        add("pkg/b.py", Lang::Python, b"x = 1\n");
        add("web/app.ts", Lang::TypeScript, b"import { u } from './util';\nimport React from 'react';\n");
        add("web/util.ts", Lang::TypeScript, b"export const u = 1;\n");
        add("cmd/main.go", Lang::Go, b"package main\nimport \"example.com/m/internal/srv\"\nimport \"fmt\"\n");
        add("internal/srv/srv.go", Lang::Go, b"package srv\n");
        let mg = ModuleGraph::build(&g);
        let targets = |path: &str| -> Vec<Option<String>> {
            let id = g.file_id(path).unwrap();
            mg.out[&id].iter().map(|e| e.to.clone()).collect()
        };
        assert_eq!(
            targets("src/lib.rs"),
            [Some("src/store/mod.rs".to_owned()), Some("src/store/runs.rs".to_owned()), None]
        );
        assert_eq!(targets("src/store/runs.rs"), [Some("src/store/mod.rs".to_owned())]);
        assert_eq!(targets("pkg/a.py"), [Some("pkg/b.py".to_owned()), Some("pkg/b.py".to_owned()), None]);
        assert_eq!(targets("web/app.ts"), [Some("web/util.ts".to_owned()), None]);
        assert_eq!(targets("cmd/main.go"), [Some("internal/srv".to_owned()), None]);
        assert_eq!(mg.edges_into("src/store/runs.rs", false).len(), 2);
        assert_eq!(mg.edges_into("internal/srv/srv.go", false).len(), 1);
    }
}
