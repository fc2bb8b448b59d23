//! The code graph of a workspace, as used by the server's `codebase_explore` tool (the tool
//! itself, its input and its availability stay in the server).
//!
//! - [`lang`]: tree-sitter parsing of Rust, Python, JavaScript, TypeScript/TSX and Go into
//!   definitions, references, calls and imports.
//! - [`graph`]: the in-memory graph of one workspace and its inverted indexes.
//! - [`index`]: building it (walk, filters, parallel parse, progress, cancellation), the
//!   watcher that keeps it current, and availability (`index_building` / `index_failed`);
//!   errors are [`index::IndexError`].
//! - [`persist`]: the per-workspace index file keyed by content hash.
//! - [`resolve`]: imports resolved to workspace files (module dependencies).
//! - [`query`]: the seven query kinds; [`verify`]: re-reading every location at query time
//!   through the workspace boundary ([`mira_core::workspace`]).
//! - [`synthetic`]: a generated many-file workspace for the benchmark and tests.

pub mod graph;
pub mod index;
pub mod lang;
pub mod persist;
pub mod query;
pub mod resolve;
pub mod synthetic;
pub mod verify;
