//! The workspace boundary ([`mira_core::workspace`], re-exported here) and what needs the
//! store: opening a registered workspace row by identity.

pub use mira_core::workspace::*;

use std::path::Path;

use crate::availability::Availability;
use crate::registry::ToolError;

/// Opens the registered workspace `row` on this host by identity
/// ([`Workspace::open_pinned`]) with the Read tools' hard-link rule `rule`. Errors:
/// `workspace_changed` (409), `workspace_unavailable` (503), also for a workspace on a device:
/// its path is on the device (its owner chose it freely, nothing checked it on this host), so
/// this host never opens it (what the answer would tell — whether the path exists here, the
/// identity of what is there — is not the caller's to know).
pub fn open_registered(row: &crate::store::WorkspaceRow, rule: HardLinks) -> Result<Workspace, ToolError> {
    if let Some(device) = &row.device_id {
        return Err(ToolError::new(
            crate::error::ErrorCode::WorkspaceUnavailable,
            format!(
                "workspace {} is a folder on device {device}: tools that run on the server host have no folder there",
                row.id
            ),
        )
        .with_details(serde_json::json!({"workspace_id": row.id, "device_id": device})));
    }
    let expected = row.root_identity.as_deref().and_then(RootIdentity::parse);
    Workspace::open_pinned(Path::new(&row.path), expected)
        .map(|ws| ws.with_hard_links(rule))
        .map_err(|e| e.to_tool_error(&row.id, &row.path))
}

/// A run's registered workspace, looked up but not opened: the freeze opens it once the
/// call's tool is exposed and its input valid, the harness when the call runs. Both open it
/// through [`RunWorkspace::open`], by identity.
#[derive(Debug, Clone)]
pub struct RunWorkspace {
    row: crate::store::WorkspaceRow,
    hard_links: HardLinks,
}

impl RunWorkspace {
    /// The workspace `row` of a run, to be opened with the Read tools' hard-link rule `rule`.
    pub fn new(row: crate::store::WorkspaceRow, rule: HardLinks) -> Self {
        Self { row, hard_links: rule }
    }

    /// The stored workspace.
    pub fn row(&self) -> &crate::store::WorkspaceRow {
        &self.row
    }

    /// Opens the root on this host ([`open_registered`]). Errors: `workspace_changed` (409),
    /// `workspace_unavailable` (503).
    pub fn open(&self) -> Result<Workspace, ToolError> {
        open_registered(&self.row, self.hard_links)
    }
}

/// Whether the registered root of `row` is still the folder that was registered (one open
/// and `fstat`), as an availability answer for the tools working in it.
pub fn root_state(row: &crate::store::WorkspaceRow) -> Availability {
    match open_registered(row, HardLinks::Refuse) {
        Ok(_) => Availability::Available,
        Err(e) => Availability::Unavailable { code: e.code, message: e.message },
    }
}
