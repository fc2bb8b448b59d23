//! Availability: "can this user, on this device, with these connections, use it now?"
//!
//! Evaluated per (user, device, connection state) and always answered with a stable reason
//! code when the answer is no. Generic checks (the device has the capability the tool needs
//! and something can execute on that device) live here; tool-specific checks (a configured
//! search provider, a connected MCP server…) are the tool's own
//! [`crate::registry::Tool::availability`].

use serde::Serialize;

use crate::registry::Entry;

/// Capabilities of the server host, which executes work for runs without a remote device.
pub const LOCAL_CAPABILITIES: [&str; 4] = ["fs.read", "fs.write", "pty", "net"];

/// Id used for the server host when a run names no device.
pub const LOCAL_DEVICE_ID: &str = "local";

/// Available, or not with a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Availability {
    /// Usable now.
    Available,
    /// Not usable now.
    Unavailable {
        /// Stable reason code (`device_lacks_capability`, `no_search_provider`…).
        code: String,
        /// Human sentence.
        message: String,
    },
}

impl Availability {
    /// An unavailable answer.
    pub fn unavailable(code: &str, message: impl Into<String>) -> Self {
        Availability::Unavailable { code: code.to_owned(), message: message.into() }
    }
}

/// The device a question is asked for.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceInfo {
    /// `local` for the server host, else a `dev_…` id.
    pub id: String,
    /// True for the server host (work executes in-process).
    pub local: bool,
    /// Capability strings the device declares.
    pub capabilities: Vec<String>,
}

impl DeviceInfo {
    /// The server host with every local capability.
    pub fn local() -> Self {
        Self {
            id: LOCAL_DEVICE_ID.to_owned(),
            local: true,
            capabilities: LOCAL_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
        }
    }
}

/// Who asks, from where.
#[derive(Debug, Clone)]
pub struct AvailabilityContext {
    /// The user.
    pub user_id: String,
    /// Whether the user is an admin (what a server that cannot sandbox lets them run).
    pub is_admin: bool,
    /// The device.
    pub device: DeviceInfo,
    /// Root folder (on the server host) of the workspace the question is about: the run's
    /// workspace, or the default workspace when no run is named; None when neither is known.
    /// Tools whose state is per workspace (the code graph index) judge by it.
    pub workspace_root: Option<std::path::PathBuf>,
    /// Whether that workspace's root is usable: `unavailable` with `workspace_changed` when
    /// the folder at its path is no longer the one registered (replaced, a symlink, moved),
    /// `workspace_unavailable` when it cannot be opened. Tools that work in the workspace
    /// (capabilities `fs.read`, `fs.write`, `pty`) take this answer.
    pub workspace_state: Availability,
}

/// Capabilities of the tools that work inside the run's workspace.
pub const WORKSPACE_CAPABILITIES: [&str; 3] = ["fs.read", "fs.write", "pty"];

/// Evaluates availability of `entry` for `ctx`: an input schema that compiles
/// (`schema_unusable` otherwise, naming the problem), device capability, an executor for the
/// device, then the tool's own checks.
pub fn evaluate(entry: &Entry, ctx: &AvailabilityContext) -> Availability {
    if let Err(problem) = entry.schema() {
        return Availability::unavailable(
            "schema_unusable",
            format!("the input schema of {} cannot be used: {problem}", entry.spec().id),
        );
    }
    let spec = entry.spec();
    if let Some(cap) = &spec.capability {
        if !ctx.device.capabilities.iter().any(|c| c == cap) {
            return Availability::unavailable(
                "device_lacks_capability",
                format!("device {} does not declare capability {cap}", ctx.device.id),
            );
        }
        if !ctx.device.local {
            return Availability::unavailable(
                "device_not_connected",
                format!("no runner is connected for device {}; its work cannot execute now", ctx.device.id),
            );
        }
    }
    if spec.capability.as_deref().is_some_and(|c| WORKSPACE_CAPABILITIES.contains(&c))
        && ctx.workspace_state != Availability::Available
    {
        return ctx.workspace_state.clone();
    }
    entry.tool.availability(ctx)
}
