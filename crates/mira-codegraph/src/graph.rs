//! The in-memory code graph of one workspace: files with their definitions, references
//! and imports (name ids into one shared interner), and the inverted indexes queries use
//! (definitions by name, files referring to a name, known container names).
//!
//! Memory is proportional to what the files contain, not to their bytes: sources are parsed
//! and dropped; a definition takes 32 bytes, a reference 24, a name its length plus about 40.
//! Updates replace one file at a time and keep the indexes consistent (remove the old
//! entry's postings, add the new ones), so an edit costs one file's parse, not a rebuild.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::lang::{Def, DefKind, Import, Lang, NONE, Parsed, Ref};

/// A definition's address: (file id, index into that file's `defs`).
pub type DefId = (u32, u32);

/// One indexed file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileEntry {
    /// Workspace-relative path with `/` separators.
    pub path: Box<str>,
    /// SHA-256 of the bytes that were parsed.
    pub hash: [u8; 32],
    /// Size in bytes.
    pub size: u64,
    /// Language.
    pub lang: Lang,
    /// Definitions (name ids are global).
    pub defs: Vec<Def>,
    /// References (name ids are global).
    pub refs: Vec<Ref>,
    /// Imports (target ids are global).
    pub imports: Vec<Import>,
    /// ERROR/MISSING nodes seen (0 = clean parse).
    pub syntax_errors: u32,
    /// A per-file cap cut extraction short.
    pub truncated: bool,
}

impl FileEntry {
    /// Lowercase hex of [`FileEntry::hash`].
    pub fn hash_hex(&self) -> String {
        hex::encode(self.hash)
    }
}

/// The graph. Not thread-safe by itself; the index wraps it in a lock.
#[derive(Default)]
pub struct Graph {
    names: Vec<Arc<str>>,
    name_ids: HashMap<Arc<str>, u32>,
    files: Vec<Option<FileEntry>>,
    free: Vec<u32>,
    by_path: HashMap<Box<str>, u32>,
    defs_by_name: HashMap<u32, Vec<DefId>>,
    ref_files: HashMap<u32, Vec<u32>>,
    containers: HashMap<u32, u32>,
    generation: u64,
    def_count: usize,
    ref_count: usize,
}

/// Counts for status and benchmarks.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct GraphStats {
    /// Indexed files.
    pub files: usize,
    /// Definitions.
    pub definitions: usize,
    /// References (calls, type uses, imports, other identifiers).
    pub references: usize,
    /// Distinct names.
    pub names: usize,
    /// Files whose parse had syntax errors (indexed partially).
    pub files_with_syntax_errors: usize,
    /// Estimated heap bytes held by the graph.
    pub approx_bytes: usize,
}

/// The module name a file defines for qualified calls: the file stem, or the folder's name
/// for `mod.rs`, `lib.rs`, `main.rs`, `__init__.py`, `index.*` and every Go file (a Go
/// package is its folder).
pub fn module_name(path: &str) -> &str {
    let (dir, file) = path.rsplit_once('/').unwrap_or(("", path));
    let stem = file.split('.').next().unwrap_or(file);
    let dir_name = dir.rsplit('/').next().unwrap_or(dir);
    let folder_module = matches!(stem, "mod" | "lib" | "main" | "__init__" | "index") || file.ends_with(".go");
    if folder_module && !dir_name.is_empty() { dir_name } else { stem }
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bumped on every change; caches derived from the graph compare it.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The id of `name`, interning it.
    pub fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(NONE);
        let s: Arc<str> = Arc::from(name);
        self.names.push(s.clone());
        self.name_ids.insert(s, id);
        id
    }

    /// The id of `name` if known.
    pub fn name_id(&self, name: &str) -> Option<u32> {
        self.name_ids.get(name).copied()
    }

    /// The text of a name id (`""` for [`NONE`] or unknown ids).
    pub fn name(&self, id: u32) -> &str {
        if id == NONE {
            return "";
        }
        self.names.get(id as usize).map_or("", |s| s)
    }

    /// Every interned name (for suggestions).
    pub fn all_names(&self) -> impl Iterator<Item = (u32, &str)> {
        self.names.iter().enumerate().map(|(i, s)| (u32::try_from(i).unwrap_or(NONE), &**s))
    }

    /// File id of a path.
    pub fn file_id(&self, path: &str) -> Option<u32> {
        self.by_path.get(path).copied()
    }

    /// A file by id.
    pub fn file(&self, id: u32) -> Option<&FileEntry> {
        self.files.get(id as usize).and_then(Option::as_ref)
    }

    /// Every file with its id.
    pub fn files(&self) -> impl Iterator<Item = (u32, &FileEntry)> {
        self.files.iter().enumerate().filter_map(|(i, f)| f.as_ref().map(|f| (u32::try_from(i).unwrap_or(NONE), f)))
    }

    /// A definition by id.
    pub fn def(&self, id: DefId) -> Option<&Def> {
        self.file(id.0).and_then(|f| f.defs.get(id.1 as usize))
    }

    /// Definitions named `name`.
    pub fn defs_named(&self, name: u32) -> &[DefId] {
        self.defs_by_name.get(&name).map_or(&[], Vec::as_slice)
    }

    /// Files with at least one reference to `name`.
    pub fn files_referring(&self, name: u32) -> &[u32] {
        self.ref_files.get(&name).map_or(&[], Vec::as_slice)
    }

    /// Whether `name` is a known container: a type-like definition, a method container or a
    /// module (file) name.
    pub fn is_container(&self, name: u32) -> bool {
        self.containers.get(&name).is_some_and(|&n| n > 0)
    }

    /// Counts.
    pub fn stats(&self) -> GraphStats {
        let mut s = GraphStats {
            files: self.by_path.len(),
            definitions: self.def_count,
            references: self.ref_count,
            names: self.names.len(),
            ..GraphStats::default()
        };
        let mut bytes = self.names.iter().map(|n| n.len() + 56).sum::<usize>();
        for (_, f) in self.files() {
            if f.syntax_errors > 0 {
                s.files_with_syntax_errors += 1;
            }
            bytes += std::mem::size_of::<FileEntry>() + f.path.len() * 2 + 48;
            bytes += f.defs.capacity() * std::mem::size_of::<Def>() + f.refs.capacity() * std::mem::size_of::<Ref>();
            bytes += f.imports.capacity() * std::mem::size_of::<Import>();
        }
        bytes += self.defs_by_name.values().map(|v| v.capacity() * 8 + 40).sum::<usize>();
        bytes += self.ref_files.values().map(|v| v.capacity() * 4 + 40).sum::<usize>();
        s.approx_bytes = bytes;
        s
    }

    /// Inserts or replaces the file at `path` with a fresh parse (local name ids are mapped
    /// onto the graph's interner).
    pub fn upsert(&mut self, path: &str, hash: [u8; 32], size: u64, lang: Lang, parsed: Parsed) -> u32 {
        let map: Vec<u32> = parsed.names.iter().map(|n| self.intern(n)).collect();
        let g = |id: u32| if id == NONE { NONE } else { map.get(id as usize).copied().unwrap_or(NONE) };
        let defs = parsed.defs.iter().map(|d| Def { name: g(d.name), container: g(d.container), ..*d }).collect();
        let refs = parsed.refs.iter().map(|r| Ref { name: g(r.name), qualifier: g(r.qualifier), ..*r }).collect();
        let imports = parsed.imports.iter().map(|i| Import { target: g(i.target), ..*i }).collect();
        let entry = FileEntry {
            path: path.into(),
            hash,
            size,
            lang,
            defs,
            refs,
            imports,
            syntax_errors: parsed.syntax_errors,
            truncated: parsed.truncated,
        };
        self.put(entry)
    }

    /// Inserts or replaces an entry whose name ids already belong to this graph.
    pub fn put(&mut self, entry: FileEntry) -> u32 {
        self.remove(&entry.path);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.files.push(None);
                u32::try_from(self.files.len() - 1).unwrap_or(NONE)
            }
        };
        self.index(id, &entry, true);
        self.by_path.insert(entry.path.clone(), id);
        if let Some(slot) = self.files.get_mut(id as usize) {
            *slot = Some(entry);
        }
        self.generation += 1;
        id
    }

    /// Removes the file at `path`; true if it was indexed.
    pub fn remove(&mut self, path: &str) -> bool {
        let Some(id) = self.by_path.remove(path) else { return false };
        if let Some(entry) = self.files.get_mut(id as usize).and_then(Option::take) {
            self.index(id, &entry, false);
        }
        self.free.push(id);
        self.generation += 1;
        true
    }

    /// Paths of every indexed file.
    pub fn paths(&self) -> Vec<String> {
        self.by_path.keys().map(|p| p.to_string()).collect()
    }

    fn bump_container(&mut self, name: u32, add: bool) {
        if name == NONE {
            return;
        }
        let n = self.containers.entry(name).or_insert(0);
        if add {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.containers.remove(&name);
            }
        }
    }

    /// Adds (or removes) the postings of `entry` stored at `id`.
    fn index(&mut self, id: u32, entry: &FileEntry, add: bool) {
        let module = self.intern(module_name(&entry.path));
        self.bump_container(module, add);
        for (i, d) in entry.defs.iter().enumerate() {
            let key = (id, u32::try_from(i).unwrap_or(NONE));
            let list = self.defs_by_name.entry(d.name).or_default();
            if add {
                list.push(key);
            } else if let Some(p) = list.iter().position(|k| *k == key) {
                list.swap_remove(p);
            }
            if list.is_empty() {
                self.defs_by_name.remove(&d.name);
            }
            if d.kind.is_container() {
                self.bump_container(d.name, add);
            }
            self.bump_container(d.container, add);
        }
        let mut names: Vec<u32> = entry.refs.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        for name in names {
            let list = self.ref_files.entry(name).or_default();
            if add {
                list.push(id);
            } else if let Some(p) = list.iter().position(|f| *f == id) {
                list.swap_remove(p);
            }
            if list.is_empty() {
                self.ref_files.remove(&name);
            }
        }
        if add {
            self.def_count += entry.defs.len();
            self.ref_count += entry.refs.len();
        } else {
            self.def_count -= entry.defs.len().min(self.def_count);
            self.ref_count -= entry.refs.len().min(self.ref_count);
        }
    }

    /// The qualified display name of a definition: `Container::name` or `name`.
    pub fn qualified(&self, d: &Def) -> String {
        if d.container == NONE {
            self.name(d.name).to_owned()
        } else {
            format!("{}::{}", self.name(d.container), self.name(d.name))
        }
    }

    /// Whether `kind` is a definition kind that can be the target of a call.
    pub fn callable(kind: DefKind) -> bool {
        kind.is_callable()
    }

    /// The names table for snapshots.
    pub(crate) fn names_slice(&self) -> &[Arc<str>] {
        &self.names
    }

    /// Rebuilds a graph from a snapshot's names and files.
    pub(crate) fn from_parts(names: Vec<String>, files: Vec<FileEntry>) -> Graph {
        let mut g = Graph::new();
        for n in names {
            g.intern(&n);
        }
        let known = g.names.len();
        for f in files {
            let ok = f
                .defs
                .iter()
                .all(|d| (d.name as usize) < known && (d.container == NONE || (d.container as usize) < known))
                && f.refs
                    .iter()
                    .all(|r| (r.name as usize) < known && (r.qualifier == NONE || (r.qualifier as usize) < known))
                && f.imports.iter().all(|i| (i.target as usize) < known);
            if ok {
                g.put(f);
            }
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lang::FileParser;

    #[test]
    fn upsert_and_remove_keep_indexes_consistent() {
        let mut g = Graph::new();
        let mut p = FileParser::new();
        g.upsert("a.rs", [1; 32], 1, Lang::Rust, p.parse(Lang::Rust, b"fn f() { g(); }\nfn g() {}\n"));
        g.upsert("b.rs", [2; 32], 1, Lang::Rust, p.parse(Lang::Rust, b"fn h() { g(); }\n"));
        let gid = g.name_id("g").unwrap();
        assert_eq!(g.defs_named(gid).len(), 1);
        assert_eq!(g.files_referring(gid).len(), 2);
        g.upsert("a.rs", [3; 32], 1, Lang::Rust, p.parse(Lang::Rust, b"fn f() {}\n"));
        assert_eq!(g.defs_named(gid).len(), 0);
        assert_eq!(g.files_referring(gid).len(), 1);
        assert!(g.remove("b.rs"));
        assert_eq!(g.files_referring(gid).len(), 0);
        assert_eq!(g.stats().files, 1);
        assert_eq!(module_name("src/store/mod.rs"), "store");
        assert_eq!(module_name("pkg/http/server.go"), "http");
        assert_eq!(module_name("lib/util.py"), "util");
    }
}
