//! The top-level modules of `src/` (the library `mira`) depend on each other without cycles:
//! every `crate::<module>` path in a module's files (comments and string literals aside) is
//! an edge, and the graph must be acyclic, so each module can later move behind a crate
//! boundary. A failure prints every cycle found, as `a → b → a`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Edges that still close a cycle and are known, each with who removes it. Every entry must
/// still exist (the test fails when one is gone, so the list only shrinks).
const KNOWN: &[(&str, &str, &str)] = &[];

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `text` with comments, string and character literals blanked out (lengths kept apart
/// from literals, which become `""`), so only code is searched for paths.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"')
                || (next == Some('#') && !b[..i].last().is_some_and(|p| p.is_alphanumeric() || *p == '_')))
        {
            // A raw string r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (next == Some('\\') || b.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{…}'); a lifetime has no closing quote.
            i += 1;
            if b.get(i) == Some(&'\\') {
                i += 1;
            }
            while i < b.len() && b[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The first path segment of every `crate::…` path in `code`, `crate::{a, b::c}` giving
/// `a` and `b`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| s.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before_ok = rest[..at].chars().last().is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        rest = &rest[at + "crate::".len()..];
        if !before_ok {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Split the group's top level on commas.
            let mut depth = 0;
            let mut start = 0;
            for (k, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.insert(ident(&group[start..k]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&group[start..k]));
                        start = k + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The library's top-level modules (declared or re-exported in `src/lib.rs`) and the
/// `crate::` edges between them.
fn module_graph() -> Graph {
    let src = Path::new(ROOT).join("src");
    let lib = code_only(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut declared = BTreeSet::new();
    let mut names = BTreeSet::new();
    for line in lib.lines().map(str::trim) {
        if let Some(m) = line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod ")) {
            let m = m.trim_end_matches(';').trim().to_owned();
            declared.insert(m.clone());
            names.insert(m);
        } else if let Some(u) = line.strip_prefix("pub use ") {
            // `pub use some_crate::module;` names a module at the top level too.
            let last = u.trim_end_matches(';').rsplit("::").next().unwrap_or_default().trim().to_owned();
            names.insert(last);
        }
    }
    assert!(declared.len() > 10, "no modules found in src/lib.rs: {declared:?}");
    let mut graph = Graph::new();
    for m in &declared {
        let mut files = Vec::new();
        let file = src.join(format!("{m}.rs"));
        if file.is_file() {
            files.push(file);
        }
        if src.join(m).is_dir() {
            rust_files(&src.join(m), &mut files);
        }
        assert!(!files.is_empty(), "module {m} has no file under src/");
        let edges = graph.entry(m.clone()).or_default();
        for f in files {
            let code = code_only(&std::fs::read_to_string(&f).unwrap());
            for target in crate_paths(&code) {
                if target != *m && names.contains(&target) {
                    edges.insert(target);
                }
            }
        }
    }
    graph
}

/// One cycle through each strongly connected component of more than one module (Tarjan),
/// as the list of its modules with the first repeated at the end.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        components: Vec<Vec<&'g str>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    self.components.push(comp);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    // In each component, the shortest path back to its smallest module (breadth first).
    t.components
        .iter()
        .map(|comp| {
            let inside: BTreeSet<&str> = comp.iter().copied().collect();
            let start = *inside.iter().next().unwrap();
            let mut prev: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut last = start;
            'search: while let Some(v) = queue.pop_front() {
                for w in graph.get(v).into_iter().flatten().map(String::as_str) {
                    if !inside.contains(w) {
                        continue;
                    }
                    if w == start {
                        last = v;
                        break 'search;
                    }
                    if !prev.contains_key(w) {
                        prev.insert(w, v);
                        queue.push_back(w);
                    }
                }
            }
            let mut path = vec![start.to_owned()];
            let mut v = last;
            while v != start {
                path.push(v.to_owned());
                v = prev[v];
            }
            path.push(start.to_owned());
            let n = path.len();
            path[1..n - 1].reverse();
            path
        })
        .collect()
}

#[test]
fn the_cycle_finder_names_a_cycle() {
    let g: Graph = [("a", &["b"][..]), ("b", &["c"]), ("c", &["a", "d"]), ("d", &[])]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.iter().map(|s| (*s).to_owned()).collect()))
        .collect();
    assert_eq!(cycles(&g), vec![vec!["a", "b", "c", "a"]]);
    let mut acyclic = g.clone();
    acyclic.get_mut("c").unwrap().remove("a");
    assert!(cycles(&acyclic).is_empty());
    let code = code_only("use crate::{a, b::{c, d}};\n// crate::x\nlet s = \"crate::y\"; let c = '\"'; crate::e::f();");
    assert_eq!(crate_paths(&code).into_iter().collect::<Vec<_>>(), ["a", "b", "e"]);
}

#[test]
fn top_level_modules_have_no_cycles() {
    let mut graph = module_graph();
    for (from, to, why) in KNOWN {
        let removed = graph.get_mut(*from).is_some_and(|e| e.remove(*to));
        assert!(removed, "the known edge {from} → {to} ({why}) is gone: remove it from KNOWN in tests/it/modules.rs");
    }
    let found = cycles(&graph);
    let shown: Vec<String> = found.iter().map(|c| c.join(" → ")).collect();
    assert!(
        found.is_empty(),
        "module cycles in src/ (move the shared types down, or take narrower inputs):\n  {}",
        shown.join("\n  ")
    );
}
