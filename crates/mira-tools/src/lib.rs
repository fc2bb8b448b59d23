//! The Read and Edit tools of the Mira Tool Runtime, built on [`mira_core`] only (no axum,
//! no sqlx), so that the exact same implementation runs in the control plane (`mira`, which
//! re-exports these modules as `mira::tools::{read, edit, input}`) and on a user's own
//! machine (`mira-runner`).
//!
//! - [`read`]: `read_discover`, `grep`, `read_open` and the legacy read entries.
//! - [`edit`]: `write_file`, `replace_block`, `delete_path`, `move_path`.
//! - [`input`]: typed tool inputs and the JSON Schemas generated from them.
//! - [`pty`]: kill, environment and session setup of PTY sessions.
//! - [`terminal_output`]: a PTY's output ring, its UTF-8 decoding, VT100 rendering and the
//!   capture of an action's window (shared by the host's `terminal_session` and a runner's).

pub mod edit;
pub mod input;
pub mod pty;
pub mod read;
pub mod terminal_output;

use std::sync::Arc;

use mira_core::tool::Tool;

/// Every Read and Edit tool of this crate (with the legacy read entries), as a runner on a
/// device registers them. The control plane registers the same types (the Edit tools wrapped
/// so that its code graph hears of their changes).
pub fn read_and_edit() -> Vec<Arc<dyn Tool>> {
    let discover: Arc<dyn Tool> = Arc::new(read::discover::ReadDiscover::new());
    let open: Arc<dyn Tool> = Arc::new(read::open::ReadOpen::new());
    let mut tools: Vec<Arc<dyn Tool>> = vec![discover.clone(), Arc::new(read::grep::Grep::new()), open.clone()];
    for legacy in read::legacy::entries(discover, open) {
        tools.push(Arc::new(legacy));
    }
    tools.push(Arc::new(edit::write_file::WriteFile::new()));
    tools.push(Arc::new(edit::replace_block::ReplaceBlock::new()));
    tools.push(Arc::new(edit::delete_path::DeletePath::new()));
    tools.push(Arc::new(edit::move_path::MovePath::new()));
    tools
}
