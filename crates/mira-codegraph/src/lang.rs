//! Parsing one source file into definitions, references, calls and imports with tree-sitter.
//!
//! One pre-order walk of the concrete syntax tree per file (no queries), keeping a stack of
//! scopes so that every reference knows its innermost enclosing definition (the caller of a
//! call) and the container (impl type, class, trait, Go receiver type) that `self`, `Self`,
//! `this`, `cls` or a Go receiver variable stand for. The node kinds are those of the grammar
//! crates' `node-types.json` (tree-sitter-rust 0.24, -python 0.25, -javascript 0.25,
//! -typescript 0.23 (TypeScript and TSX), -go 0.25), and the choice of what is a definition
//! follows each grammar's own `queries/tags.scm`, the files GitHub code navigation uses.
//!
//! Files with syntax errors still yield everything outside the error nodes (tree-sitter
//! recovers locally); the count of error and missing nodes is kept so results can say that a
//! file parsed partially. Calls inside Rust macro invocations (`assert_eq!(f(x), …)`) are token
//! trees, not syntax; an identifier followed by a parenthesised token tree is taken as a call.

use serde::{Deserialize, Serialize};
use tree_sitter::{Language, Node, Parser, Tree};

/// "No index" marker in the `u32` fields of [`Def`] and [`Ref`].
pub const NONE: u32 = u32::MAX;

/// Largest nesting depth walked; deeper subtrees (pathological generated code) are skipped.
pub const MAX_DEPTH: usize = 512;

/// Most references kept per file; the rest are dropped and the file is marked truncated.
pub const MAX_REFS_PER_FILE: usize = 50_000;

/// A supported language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Lang {
    /// `.rs`
    Rust,
    /// `.py`, `.pyi`
    Python,
    /// `.js`, `.mjs`, `.cjs`, `.jsx`
    JavaScript,
    /// `.ts`, `.mts`, `.cts`
    TypeScript,
    /// `.tsx`
    Tsx,
    /// `.go`
    Go,
}

impl Lang {
    /// The language of a file name by its extension, if supported.
    pub fn of_path(path: &str) -> Option<Lang> {
        let ext = path.rsplit_once('.').map(|(_, e)| e)?;
        Some(match ext {
            "rs" => Lang::Rust,
            "py" | "pyi" => Lang::Python,
            "js" | "mjs" | "cjs" | "jsx" => Lang::JavaScript,
            "ts" | "mts" | "cts" => Lang::TypeScript,
            "tsx" => Lang::Tsx,
            "go" => Lang::Go,
            _ => return None,
        })
    }

    /// Lower-case name (`rust`, `python`, `javascript`, `typescript`, `tsx`, `go`).
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::JavaScript => "javascript",
            Lang::TypeScript => "typescript",
            Lang::Tsx => "tsx",
            Lang::Go => "go",
        }
    }

    fn grammar(self) -> Language {
        match self {
            Lang::Rust => tree_sitter_rust::LANGUAGE.into(),
            Lang::Python => tree_sitter_python::LANGUAGE.into(),
            Lang::JavaScript => tree_sitter_javascript::LANGUAGE.into(),
            Lang::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
            Lang::Tsx => tree_sitter_typescript::LANGUAGE_TSX.into(),
            Lang::Go => tree_sitter_go::LANGUAGE.into(),
        }
    }
}

/// What a definition defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DefKind {
    /// A free function.
    Function,
    /// A function inside an impl, trait, class or with a Go receiver.
    Method,
    /// Rust struct, Go struct type.
    Struct,
    /// Enum.
    Enum,
    /// Rust union.
    Union,
    /// Python/JS/TS class.
    Class,
    /// Rust trait.
    Trait,
    /// TS/Go interface.
    Interface,
    /// Type alias or other named type.
    Type,
    /// Rust `mod`.
    Module,
    /// Rust `const`/`static`, Go `const`.
    Const,
    /// Rust `macro_rules!`.
    Macro,
}

impl DefKind {
    /// Lower-case name as shown in results.
    pub fn name(self) -> &'static str {
        match self {
            DefKind::Function => "function",
            DefKind::Method => "method",
            DefKind::Struct => "struct",
            DefKind::Enum => "enum",
            DefKind::Union => "union",
            DefKind::Class => "class",
            DefKind::Trait => "trait",
            DefKind::Interface => "interface",
            DefKind::Type => "type",
            DefKind::Module => "module",
            DefKind::Const => "const",
            DefKind::Macro => "macro",
        }
    }

    /// Whether it names a type-like container (something `X::f` / `X.f` can qualify).
    pub fn is_container(self) -> bool {
        matches!(
            self,
            DefKind::Struct
                | DefKind::Enum
                | DefKind::Union
                | DefKind::Class
                | DefKind::Trait
                | DefKind::Interface
                | DefKind::Type
                | DefKind::Module
        )
    }

    /// Whether it is callable.
    pub fn is_callable(self) -> bool {
        matches!(self, DefKind::Function | DefKind::Method | DefKind::Macro | DefKind::Class | DefKind::Struct)
    }
}

/// What a reference does with the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RefKind {
    /// Calls it (function call, method call, `new X`, macro invocation).
    Call,
    /// Names it in a type position.
    Type,
    /// Names it in an import (`use`, `import`, `from … import`).
    Import,
    /// Any other identifier occurrence outside comments and strings.
    Other,
}

impl RefKind {
    /// Lower-case name as shown in results.
    pub fn name(self) -> &'static str {
        match self {
            RefKind::Call => "call",
            RefKind::Type => "type",
            RefKind::Import => "import",
            RefKind::Other => "other",
        }
    }
}

/// One definition. Lines are 1-based, columns 1-based byte offsets within the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Def {
    /// Name (an index into the name table).
    pub name: u32,
    /// Container name (impl type, class, trait, Go receiver type), or [`NONE`].
    pub container: u32,
    /// Kind.
    pub kind: DefKind,
    /// First line of the whole definition.
    pub start_line: u32,
    /// Last line of the whole definition.
    pub end_line: u32,
    /// Line of the name.
    pub line: u32,
    /// Column of the name.
    pub col: u32,
    /// Index of the innermost enclosing definition in the same file, or [`NONE`].
    pub parent: u32,
}

/// One reference to a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    /// Name referred to.
    pub name: u32,
    /// For calls: the qualifier (`Foo` in `Foo::new()`, the container for `self.f()`), or
    /// [`NONE`] when the receiver's type is not known from syntax.
    pub qualifier: u32,
    /// Kind.
    pub kind: RefKind,
    /// Line.
    pub line: u32,
    /// Column.
    pub col: u32,
    /// Innermost enclosing definition (index into the file's defs), or [`NONE`] at top level.
    pub scope: u32,
}

/// One import statement: the imported module as written (`crate::a::b`, `os.path`, `./x`,
/// `net/http`) and its line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Import {
    /// Module path text (an index into the name table).
    pub target: u32,
    /// Line.
    pub line: u32,
}

/// Everything extracted from one file, with its own name table.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Parsed {
    /// Names referred to by index from the other fields.
    pub names: Vec<String>,
    /// Definitions in source order.
    pub defs: Vec<Def>,
    /// References in source order.
    pub refs: Vec<Ref>,
    /// Imports in source order.
    pub imports: Vec<Import>,
    /// ERROR and MISSING nodes in the tree (0 = clean parse).
    pub syntax_errors: u32,
    /// True when a cap (depth, references) cut the extraction short.
    pub truncated: bool,
}

/// A reusable parser (one per worker thread: tree-sitter parsers are not `Sync`).
pub struct FileParser {
    parser: Parser,
    current: Option<Lang>,
}

impl Default for FileParser {
    fn default() -> Self {
        Self::new()
    }
}

impl FileParser {
    /// A parser with no language set yet.
    pub fn new() -> Self {
        Self { parser: Parser::new(), current: None }
    }

    /// Parses `source` as `lang` into a syntax tree (None only if tree-sitter gives up, which
    /// it does not do without a timeout or cancellation flag).
    pub fn tree(&mut self, lang: Lang, source: &[u8]) -> Option<Tree> {
        if self.current != Some(lang) {
            self.parser.set_language(&lang.grammar()).ok()?;
            self.current = Some(lang);
        }
        self.parser.parse(source, None)
    }

    /// Parses and extracts.
    pub fn parse(&mut self, lang: Lang, source: &[u8]) -> Parsed {
        match self.tree(lang, source) {
            Some(tree) => extract(lang, &tree, source),
            None => Parsed { syntax_errors: 1, truncated: true, ..Parsed::default() },
        }
    }
}

struct Scope {
    node_id: usize,
    def: u32,
    container: u32,
    receiver: Option<String>,
    import: bool,
}

struct Walk<'s> {
    lang: Lang,
    src: &'s [u8],
    out: Parsed,
    names: std::collections::HashMap<String, u32>,
    scopes: Vec<Scope>,
    claimed: std::collections::HashSet<usize>,
}

fn text<'s>(node: Node<'_>, src: &'s [u8]) -> &'s str {
    node.utf8_text(src).unwrap_or("")
}

fn pos(node: Node<'_>) -> (u32, u32) {
    let p = node.start_position();
    (u32::try_from(p.row + 1).unwrap_or(u32::MAX), u32::try_from(p.column + 1).unwrap_or(u32::MAX))
}

/// The last `::`/`.` segment of a path expression, generics stripped.
fn last_segment(path: &str) -> &str {
    let path = path.split('<').next().unwrap_or(path);
    let seg = path.rsplit("::").next().unwrap_or(path);
    seg.rsplit('.').next().unwrap_or(seg).trim()
}

impl<'s> Walk<'s> {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.names.get(s) {
            return id;
        }
        let id = u32::try_from(self.out.names.len()).unwrap_or(NONE);
        self.out.names.push(s.to_owned());
        self.names.insert(s.to_owned(), id);
        id
    }

    fn enclosing_def(&self) -> u32 {
        self.scopes.iter().rev().find(|s| s.def != NONE).map_or(NONE, |s| s.def)
    }

    fn container(&self) -> u32 {
        self.scopes.iter().rev().find(|s| s.container != NONE).map_or(NONE, |s| s.container)
    }

    fn in_import(&self) -> bool {
        self.scopes.iter().any(|s| s.import)
    }

    /// Resolves a receiver/qualifier text to a name id: `self`/`Self`/`this`/`cls`/the Go
    /// receiver variable become the container; module keywords become NONE.
    fn qualifier(&mut self, q: &str) -> u32 {
        let q = last_segment(q);
        if q.is_empty() || q.contains(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$')) {
            return NONE;
        }
        let receiver = self.scopes.iter().rev().find_map(|s| s.receiver.as_deref()).is_some_and(|r| r == q);
        if matches!(q, "self" | "Self" | "this" | "cls") || receiver {
            return self.container();
        }
        if matches!(q, "crate" | "super") {
            return NONE;
        }
        self.intern(q)
    }

    fn add_def(&mut self, node: Node<'_>, name_node: Node<'_>, kind: DefKind, container: u32) -> u32 {
        let name = text(name_node, self.src).to_owned();
        if name.is_empty() {
            return NONE;
        }
        self.claimed.insert(name_node.start_byte());
        let name = self.intern(&name);
        let (line, col) = pos(name_node);
        let def = Def {
            name,
            container,
            kind,
            start_line: pos(node).0,
            end_line: u32::try_from(node.end_position().row + 1).unwrap_or(u32::MAX),
            line,
            col,
            parent: self.enclosing_def(),
        };
        let idx = u32::try_from(self.out.defs.len()).unwrap_or(NONE);
        self.out.defs.push(def);
        idx
    }

    fn add_ref(&mut self, name_node: Node<'_>, kind: RefKind, qualifier: u32) {
        if self.out.refs.len() >= MAX_REFS_PER_FILE {
            self.out.truncated = true;
            return;
        }
        let name = text(name_node, self.src);
        if name.is_empty() || !self.claimed.insert(name_node.start_byte()) {
            return;
        }
        let name = self.intern(name);
        let (line, col) = pos(name_node);
        let scope = self.enclosing_def();
        self.out.refs.push(Ref { name, qualifier, kind, line, col, scope });
    }

    fn add_import(&mut self, node: Node<'_>, target: &str) {
        let target = target.trim().trim_matches(|c| c == '"' || c == '\'' || c == '`');
        if target.is_empty() {
            return;
        }
        let target = self.intern(target);
        self.out.imports.push(Import { target, line: pos(node).0 });
    }

    /// Called on entering `node`; returns the scope it opens, if any.
    fn enter(&mut self, node: Node<'_>) -> Option<Scope> {
        if node.is_error() || node.is_missing() {
            self.out.syntax_errors += 1;
        }
        match self.lang {
            Lang::Rust => self.enter_rust(node),
            Lang::Python => self.enter_python(node),
            Lang::Go => self.enter_go(node),
            _ => self.enter_js(node),
        }
    }

    fn scope(&self, node: Node<'_>, def: u32, container: u32) -> Option<Scope> {
        Some(Scope { node_id: node.id(), def, container, receiver: None, import: false })
    }

    fn import_scope(&self, node: Node<'_>) -> Option<Scope> {
        Some(Scope { node_id: node.id(), def: NONE, container: NONE, receiver: None, import: true })
    }

    fn enter_rust(&mut self, node: Node<'_>) -> Option<Scope> {
        let kind = node.kind();
        let name = node.child_by_field_name("name");
        let simple = |k| match k {
            "struct_item" => Some(DefKind::Struct),
            "enum_item" => Some(DefKind::Enum),
            "union_item" => Some(DefKind::Union),
            "type_item" => Some(DefKind::Type),
            "mod_item" => Some(DefKind::Module),
            "const_item" | "static_item" => Some(DefKind::Const),
            "macro_definition" => Some(DefKind::Macro),
            _ => None,
        };
        match kind {
            "function_item" | "function_signature_item" => {
                let name = name?;
                let container = self.container();
                let in_impl = self.scopes.last().is_some_and(|s| {
                    s.container != NONE
                        && (s.def == NONE
                            || self.out.defs.get(s.def as usize).is_some_and(|d| d.kind == DefKind::Trait))
                });
                let (k, c) = if in_impl { (DefKind::Method, container) } else { (DefKind::Function, NONE) };
                let def = self.add_def(node, name, k, c);
                self.scope(node, def, NONE)
            }
            "trait_item" => {
                let name_node = name?;
                let def = self.add_def(node, name_node, DefKind::Trait, NONE);
                let container = self.out.defs.get(def as usize).map_or(NONE, |d| d.name);
                self.scope(node, def, container)
            }
            "impl_item" => {
                let ty = node.child_by_field_name("type")?;
                let t = last_segment(text(ty, self.src)).trim_start_matches(['&', '*']).to_owned();
                let container = if t.is_empty() { NONE } else { self.intern(&t) };
                if let Some(tr) = node.child_by_field_name("trait") {
                    let name_node = match tr.kind() {
                        "scoped_type_identifier" => tr.child_by_field_name("name").unwrap_or(tr),
                        "generic_type" => tr.child_by_field_name("type").unwrap_or(tr),
                        _ => tr,
                    };
                    self.add_ref(name_node, RefKind::Type, NONE);
                }
                self.scope(node, NONE, container)
            }
            "mod_item" => {
                let name_node = name?;
                let def = self.add_def(node, name_node, DefKind::Module, NONE);
                if node.child_by_field_name("body").is_none() {
                    let n = text(name_node, self.src).to_owned();
                    self.add_import(node, &format!("self::{n}"));
                }
                self.scope(node, def, NONE)
            }
            k if simple(k).is_some() => {
                let def = self.add_def(node, name?, simple(k)?, NONE);
                let container = if matches!(k, "struct_item" | "enum_item" | "union_item") {
                    self.out.defs.get(def as usize).map_or(NONE, |d| d.name)
                } else {
                    NONE
                };
                self.scope(node, def, container)
            }
            "use_declaration" => {
                if let Some(arg) = node.child_by_field_name("argument") {
                    let t = text(arg, self.src).to_owned();
                    let base = t.split("::{").next().unwrap_or(&t).to_owned();
                    self.add_import(node, base.split(" as ").next().unwrap_or(&base));
                }
                self.import_scope(node)
            }
            "extern_crate_declaration" => {
                if let Some(n) = node.child_by_field_name("name") {
                    let t = text(n, self.src).to_owned();
                    self.add_import(node, &t);
                }
                self.import_scope(node)
            }
            "call_expression" => {
                let mut f = node.child_by_field_name("function")?;
                if f.kind() == "generic_function" {
                    f = f.child_by_field_name("function")?;
                }
                match f.kind() {
                    "identifier" => self.add_ref(f, RefKind::Call, NONE),
                    "scoped_identifier" => {
                        let n = f.child_by_field_name("name")?;
                        let q = f.child_by_field_name("path").map(|p| text(p, self.src).to_owned());
                        let q = q.map_or(NONE, |q| self.qualifier(&q));
                        self.add_ref(n, RefKind::Call, q);
                    }
                    "field_expression" => {
                        let n = f.child_by_field_name("field")?;
                        let v = f.child_by_field_name("value").map(|v| text(v, self.src).to_owned());
                        let q = match v.as_deref() {
                            Some("self") => self.container(),
                            _ => NONE,
                        };
                        self.add_ref(n, RefKind::Call, q);
                    }
                    _ => {}
                }
                None
            }
            "macro_invocation" => {
                let m = node.child_by_field_name("macro")?;
                let n = if m.kind() == "scoped_identifier" { m.child_by_field_name("name")? } else { m };
                self.add_ref(n, RefKind::Call, NONE);
                None
            }
            "token_tree" => {
                self.calls_in_token_tree(node);
                None
            }
            "identifier" | "field_identifier" | "shorthand_field_identifier" => {
                let k = if self.in_import() { RefKind::Import } else { RefKind::Other };
                self.add_ref(node, k, NONE);
                None
            }
            "type_identifier" => {
                let k = if self.in_import() { RefKind::Import } else { RefKind::Type };
                self.add_ref(node, k, NONE);
                None
            }
            _ => None,
        }
    }

    /// `f(…)`, `a::f(…)`, `self.f(…)` inside a macro's token tree.
    fn calls_in_token_tree(&mut self, node: Node<'_>) {
        let count = node.child_count();
        for i in 0..count {
            let Some(child) = node.child(i) else { continue };
            if child.kind() != "identifier" {
                continue;
            }
            let Some(next) = node.child(i + 1) else { continue };
            let opens_paren = next.kind() == "token_tree" && next.child(0).is_some_and(|c| c.kind() == "(");
            if !opens_paren {
                continue;
            }
            let prev = |k: u32| if i >= k { node.child(i - k) } else { None };
            let q = match (prev(1).map(|p| p.kind()), prev(2)) {
                (Some("::"), Some(p)) if p.kind() == "identifier" => {
                    let t = text(p, self.src).to_owned();
                    self.qualifier(&t)
                }
                (Some("."), Some(p)) if text(p, self.src) == "self" => self.container(),
                _ => NONE,
            };
            self.add_ref(child, RefKind::Call, q);
        }
    }

    fn enter_python(&mut self, node: Node<'_>) -> Option<Scope> {
        match node.kind() {
            "function_definition" => {
                let name = node.child_by_field_name("name")?;
                // A method when the nearest scope is a class body.
                let in_class = self
                    .scopes
                    .iter()
                    .rev()
                    .find(|s| s.def != NONE)
                    .and_then(|s| self.out.defs.get(s.def as usize))
                    .is_some_and(|d| d.kind == DefKind::Class);
                let (k, c) = if in_class { (DefKind::Method, self.container()) } else { (DefKind::Function, NONE) };
                let def = self.add_def(node, name, k, c);
                self.scope(node, def, NONE)
            }
            "class_definition" => {
                let name = node.child_by_field_name("name")?;
                let def = self.add_def(node, name, DefKind::Class, NONE);
                let container = self.out.defs.get(def as usize).map_or(NONE, |d| d.name);
                self.scope(node, def, container)
            }
            "call" => {
                let f = node.child_by_field_name("function")?;
                match f.kind() {
                    "identifier" => self.add_ref(f, RefKind::Call, NONE),
                    "attribute" => {
                        let n = f.child_by_field_name("attribute")?;
                        let obj = f.child_by_field_name("object")?;
                        let q = if matches!(obj.kind(), "identifier" | "attribute") {
                            let t = text(obj, self.src).to_owned();
                            self.qualifier(&t)
                        } else {
                            NONE
                        };
                        self.add_ref(n, RefKind::Call, q);
                    }
                    _ => {}
                }
                None
            }
            "import_statement" => {
                let count = u32::try_from(node.named_child_count()).unwrap_or(0);
                for i in 0..count {
                    if let Some(c) = node.named_child(i) {
                        let n =
                            if c.kind() == "aliased_import" { c.child_by_field_name("name").unwrap_or(c) } else { c };
                        let t = text(n, self.src).to_owned();
                        self.add_import(node, &t);
                    }
                }
                self.import_scope(node)
            }
            "import_from_statement" => {
                // `from a import b` may import the submodule `a.b`: keep `a.b` (the resolver
                // falls back to `a` when `b` is not a module).
                if let Some(m) = node.child_by_field_name("module_name") {
                    let module = text(m, self.src).to_owned();
                    let first = node.child_by_field_name("name").map(|n| {
                        let n =
                            if n.kind() == "aliased_import" { n.child_by_field_name("name").unwrap_or(n) } else { n };
                        text(n, self.src).to_owned()
                    });
                    let t = match first {
                        Some(f) if module.ends_with('.') => format!("{module}{f}"),
                        Some(f) => format!("{module}.{f}"),
                        None => module,
                    };
                    self.add_import(node, &t);
                }
                self.import_scope(node)
            }
            "identifier" => {
                let k = if self.in_import() { RefKind::Import } else { RefKind::Other };
                self.add_ref(node, k, NONE);
                None
            }
            _ => None,
        }
    }

    fn enter_go(&mut self, node: Node<'_>) -> Option<Scope> {
        match node.kind() {
            "function_declaration" => {
                let def = self.add_def(node, node.child_by_field_name("name")?, DefKind::Function, NONE);
                self.scope(node, def, NONE)
            }
            "method_declaration" => {
                let name = node.child_by_field_name("name")?;
                let mut receiver_var = None;
                let mut receiver_type = String::new();
                if let Some(params) = node.child_by_field_name("receiver")
                    && let Some(p) = params.named_child(0)
                {
                    receiver_var = p.child_by_field_name("name").map(|n| text(n, self.src).to_owned());
                    if let Some(t) = p.child_by_field_name("type") {
                        let t = text(t, self.src).trim_start_matches('*');
                        receiver_type = t.split('[').next().unwrap_or(t).to_owned();
                    }
                }
                let container = if receiver_type.is_empty() { NONE } else { self.intern(&receiver_type) };
                let def = self.add_def(node, name, DefKind::Method, container);
                Some(Scope { node_id: node.id(), def, container, receiver: receiver_var, import: false })
            }
            "type_spec" | "type_alias" => {
                let name = node.child_by_field_name("name")?;
                let k = match node.child_by_field_name("type").map(|t| t.kind()) {
                    Some("struct_type") => DefKind::Struct,
                    Some("interface_type") => DefKind::Interface,
                    _ => DefKind::Type,
                };
                let def = self.add_def(node, name, k, NONE);
                let container = self.out.defs.get(def as usize).map_or(NONE, |d| d.name);
                self.scope(node, def, container)
            }
            "method_elem" | "method_spec" => {
                let name = node.child_by_field_name("name")?;
                let c = self.container();
                self.add_def(node, name, DefKind::Method, c);
                None
            }
            "const_spec" => {
                let name = node.child_by_field_name("name")?;
                self.add_def(node, name, DefKind::Const, NONE);
                None
            }
            "import_spec" => {
                let p = node.child_by_field_name("path")?;
                let t = text(p, self.src).to_owned();
                self.add_import(node, &t);
                self.import_scope(node)
            }
            "call_expression" => {
                let f = node.child_by_field_name("function")?;
                match f.kind() {
                    "identifier" => self.add_ref(f, RefKind::Call, NONE),
                    "selector_expression" => {
                        let n = f.child_by_field_name("field")?;
                        let op = f.child_by_field_name("operand")?;
                        let q = if op.kind() == "identifier" {
                            let t = text(op, self.src).to_owned();
                            self.qualifier(&t)
                        } else {
                            NONE
                        };
                        self.add_ref(n, RefKind::Call, q);
                    }
                    _ => {}
                }
                None
            }
            "identifier" | "field_identifier" | "package_identifier" => {
                let k = if self.in_import() { RefKind::Import } else { RefKind::Other };
                self.add_ref(node, k, NONE);
                None
            }
            "type_identifier" => {
                self.add_ref(node, RefKind::Type, NONE);
                None
            }
            _ => None,
        }
    }

    fn enter_js(&mut self, node: Node<'_>) -> Option<Scope> {
        match node.kind() {
            "function_declaration" | "generator_function_declaration" | "function_signature" => {
                let def = self.add_def(node, node.child_by_field_name("name")?, DefKind::Function, NONE);
                self.scope(node, def, NONE)
            }
            "class_declaration" | "abstract_class_declaration" | "class" => {
                let name = node.child_by_field_name("name")?;
                let def = self.add_def(node, name, DefKind::Class, NONE);
                let container = self.out.defs.get(def as usize).map_or(NONE, |d| d.name);
                self.scope(node, def, container)
            }
            "method_definition" | "method_signature" | "abstract_method_signature" => {
                let name = node.child_by_field_name("name")?;
                let c = self.container();
                let def = self.add_def(node, name, DefKind::Method, c);
                self.scope(node, def, NONE)
            }
            "interface_declaration" => {
                let name = node.child_by_field_name("name")?;
                let def = self.add_def(node, name, DefKind::Interface, NONE);
                let container = self.out.defs.get(def as usize).map_or(NONE, |d| d.name);
                self.scope(node, def, container)
            }
            "type_alias_declaration" => {
                let def = self.add_def(node, node.child_by_field_name("name")?, DefKind::Type, NONE);
                self.scope(node, def, NONE)
            }
            "enum_declaration" => {
                let def = self.add_def(node, node.child_by_field_name("name")?, DefKind::Enum, NONE);
                self.scope(node, def, NONE)
            }
            "internal_module" | "module" => {
                let name = node.child_by_field_name("name")?;
                if name.kind() == "string" {
                    return None;
                }
                let def = self.add_def(node, name, DefKind::Module, NONE);
                self.scope(node, def, NONE)
            }
            "variable_declarator" => {
                let name = node.child_by_field_name("name")?;
                let value = node.child_by_field_name("value")?;
                if name.kind() != "identifier"
                    || !matches!(
                        value.kind(),
                        "arrow_function" | "function_expression" | "function" | "generator_function"
                    )
                {
                    return None;
                }
                let def = self.add_def(node, name, DefKind::Function, NONE);
                self.scope(node, def, NONE)
            }
            "import_statement" => {
                if let Some(s) = node.child_by_field_name("source") {
                    let t = text(s, self.src).to_owned();
                    self.add_import(node, &t);
                }
                self.import_scope(node)
            }
            "export_statement" => {
                if let Some(s) = node.child_by_field_name("source") {
                    let t = text(s, self.src).to_owned();
                    self.add_import(node, &t);
                }
                None
            }
            "call_expression" => {
                let f = node.child_by_field_name("function")?;
                match f.kind() {
                    "identifier" => {
                        if text(f, self.src) == "require"
                            && let Some(arg) = node.child_by_field_name("arguments").and_then(|a| a.named_child(0))
                            && arg.kind() == "string"
                        {
                            let t = text(arg, self.src).to_owned();
                            self.add_import(node, &t);
                        }
                        self.add_ref(f, RefKind::Call, NONE);
                    }
                    "member_expression" => {
                        let n = f.child_by_field_name("property")?;
                        let obj = f.child_by_field_name("object")?;
                        let q = match obj.kind() {
                            "this" => self.container(),
                            "identifier" => {
                                let t = text(obj, self.src).to_owned();
                                self.qualifier(&t)
                            }
                            _ => NONE,
                        };
                        self.add_ref(n, RefKind::Call, q);
                    }
                    _ => {}
                }
                None
            }
            "new_expression" => {
                let c = node.child_by_field_name("constructor")?;
                if c.kind() == "identifier" {
                    self.add_ref(c, RefKind::Call, NONE);
                }
                None
            }
            "identifier" | "property_identifier" | "shorthand_property_identifier" => {
                let k = if self.in_import() { RefKind::Import } else { RefKind::Other };
                self.add_ref(node, k, NONE);
                None
            }
            "type_identifier" => {
                let k = if self.in_import() { RefKind::Import } else { RefKind::Type };
                self.add_ref(node, k, NONE);
                None
            }
            _ => None,
        }
    }
}

/// Extracts definitions, references and imports from a parsed tree (pre-order walk with an
/// explicit stack, so deeply nested input cannot overflow the thread's stack).
pub fn extract(lang: Lang, tree: &Tree, src: &[u8]) -> Parsed {
    let mut w = Walk {
        lang,
        src,
        out: Parsed::default(),
        names: std::collections::HashMap::new(),
        scopes: Vec::new(),
        claimed: std::collections::HashSet::new(),
    };
    let mut cursor = tree.walk();
    let mut depth = 0usize;
    loop {
        let node = cursor.node();
        if let Some(scope) = w.enter(node) {
            w.scopes.push(scope);
        }
        let descend = depth < MAX_DEPTH && cursor.goto_first_child();
        if descend {
            depth += 1;
            continue;
        }
        if depth >= MAX_DEPTH && node.child_count() > 0 {
            w.out.truncated = true;
        }
        // Leave this node and every ancestor that has no next sibling.
        loop {
            let leaving = cursor.node().id();
            if w.scopes.last().is_some_and(|s| s.node_id == leaving) {
                w.scopes.pop();
            }
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() {
                return w.out;
            }
            depth -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &Parsed, defs: bool) -> Vec<String> {
        if defs {
            p.defs
                .iter()
                .map(|d| {
                    let c = if d.container == NONE {
                        String::new()
                    } else {
                        format!("{}::", p.names[d.container as usize])
                    };
                    format!("{}:{c}{}@{}", d.kind.name(), p.names[d.name as usize], d.line)
                })
                .collect()
        } else {
            p.refs
                .iter()
                .filter(|r| r.kind == RefKind::Call)
                .map(|r| {
                    let q = if r.qualifier == NONE {
                        String::new()
                    } else {
                        format!("{}::", p.names[r.qualifier as usize])
                    };
                    let s = if r.scope == NONE {
                        "-".to_owned()
                    } else {
                        p.names[p.defs[r.scope as usize].name as usize].clone()
                    };
                    format!("{s}->{q}{}", p.names[r.name as usize])
                })
                .collect()
        }
    }

    #[test]
    fn rust_defs_methods_and_calls() {
        let src = b"mod m;\nuse crate::a::b::{C, D};\nstruct S;\nimpl S {\n    fn new() -> S { helper(); S }\n    fn go(&self) { self.run(); Self::new(); assert_eq!(inner(1), 1); }\n}\ntrait T { fn run(&self); }\nfn helper() { S::new(); }\n";
        let p = FileParser::new().parse(Lang::Rust, src);
        assert_eq!(
            names(&p, true),
            [
                "module:m@1",
                "struct:S@3",
                "method:S::new@5",
                "method:S::go@6",
                "trait:T@8",
                "method:T::run@8",
                "function:helper@9"
            ]
        );
        assert_eq!(
            names(&p, false),
            ["new->helper", "go->S::run", "go->S::new", "go->assert_eq", "go->inner", "helper->S::new"]
        );
        let imports: Vec<&str> = p.imports.iter().map(|i| p.names[i.target as usize].as_str()).collect();
        assert_eq!(imports, ["self::m", "crate::a::b"]);
        assert_eq!(p.syntax_errors, 0);
    }

    #[test]
    fn python_go_js_defs_and_calls() {
        let py = b"import os.path\nfrom .x import y\nclass A:\n    def f(self):\n        self.g()\n        os.path.join('a')\n    def g(self): pass\ndef top(): A().f()\n";
        let p = FileParser::new().parse(Lang::Python, py);
        assert_eq!(names(&p, true), ["class:A@3", "method:A::f@4", "method:A::g@7", "function:top@8"]);
        assert_eq!(names(&p, false), ["f->A::g", "f->path::join", "top->f", "top->A"]);

        let go = b"package p\nimport \"net/http\"\ntype Server struct{}\nfunc (s *Server) Serve() { s.handle(); http.ListenAndServe(\"\", nil) }\nfunc (s *Server) handle() {}\nfunc main() { NewServer() }\n";
        let p = FileParser::new().parse(Lang::Go, go);
        assert_eq!(
            names(&p, true),
            ["struct:Server@3", "method:Server::Serve@4", "method:Server::handle@5", "function:main@6"]
        );
        assert_eq!(names(&p, false), ["Serve->Server::handle", "Serve->http::ListenAndServe", "main->NewServer"]);

        let ts = b"import { x } from './util';\nexport class C { m(): void { this.n(); x(); } n() {} }\nconst arrow = () => new C();\ninterface I { a(): void }\n";
        let p = FileParser::new().parse(Lang::TypeScript, ts);
        assert_eq!(
            names(&p, true),
            ["class:C@2", "method:C::m@2", "method:C::n@2", "function:arrow@3", "interface:I@4", "method:I::a@4"]
        );
        assert_eq!(names(&p, false), ["m->C::n", "m->x", "arrow->C"]);
    }

    #[test]
    fn syntax_errors_still_yield_definitions() {
        let src = b"fn good() {}\nfn broken( {\nfn after() { good(); }\n";
        let p = FileParser::new().parse(Lang::Rust, src);
        assert!(p.syntax_errors > 0);
        let defs = names(&p, true);
        assert!(defs.iter().any(|d| d.starts_with("function:good")), "{defs:?}");
    }
}
