//! Availability answers: "can this user, on this device, with these connections, use it
//! now?" — available, or not with a stable reason code. The evaluation lives in the server;
//! these are the types a tool's own check ([`crate::tool::Tool::availability`]) uses.

use serde::Serialize;

use crate::error_code::ErrorCode;

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
        code: ErrorCode,
        /// Human sentence.
        message: String,
    },
}

impl Availability {
    /// An unavailable answer.
    pub fn unavailable(code: ErrorCode, message: impl Into<String>) -> Self {
        Availability::Unavailable { code, message: message.into() }
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
    /// Whether work can execute on the device now: always available for the server host;
    /// for a remote device, available while its runner holds a valid lease, else why not
    /// (`device_offline`, `device_revoked`, `device_not_connected`).
    pub runner: Availability,
    /// The tool ids the device's runner implements (None: every tool, the server host).
    pub runner_tools: Option<Vec<String>>,
}

impl DeviceInfo {
    /// The server host with every local capability.
    pub fn local() -> Self {
        Self {
            id: LOCAL_DEVICE_ID.to_owned(),
            local: true,
            capabilities: LOCAL_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
            runner: Availability::Available,
            runner_tools: None,
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
    /// workspace, or the default workspace when no run is named; None when neither is known
    /// and for a workspace on a device (its path is on the device). Tools whose state is per
    /// workspace (the code graph index) judge by it.
    pub workspace_root: Option<std::path::PathBuf>,
    /// Whether that workspace's root is usable: `unavailable` with `workspace_changed` when
    /// the folder at its path is no longer the one registered (replaced, a symlink, moved),
    /// `workspace_unavailable` when it cannot be opened. Tools that work in the workspace
    /// (capabilities `fs.read`, `fs.write`, `pty`) take this answer.
    pub workspace_state: Availability,
    /// What skills change for this context ([`SkillScope`]); empty outside skills.
    pub skills: SkillScope,
}

/// What skills change in a context (the contract: a skill's private runtime must not
/// pollute the main Tool Exposure).
///
/// In a main run, the tools private to any of the user's skills are hidden (`not_public`,
/// reason `skill_private`). In a skill sub-run, the skill's private tools are on its surface
/// whatever their kind, public tools only as far as its manifest allows, and the private
/// tools of the user's other skills stay hidden.
#[derive(Debug, Clone, Default)]
pub struct SkillScope {
    /// The run's skill (`skl_…`), for a skill sub-run.
    pub skill_id: Option<String>,
    /// Tool ids private to the run's skill.
    pub private: std::collections::BTreeSet<String>,
    /// Public tool ids the run's skill allows; `None` = every public tool (the main run,
    /// or a manifest allowing `*`).
    pub allowed_public: Option<std::collections::BTreeSet<String>>,
    /// Tool ids private to the user's other skills.
    pub private_elsewhere: std::collections::BTreeSet<String>,
}

/// Capabilities of the tools that work inside the run's workspace.
pub const WORKSPACE_CAPABILITIES: [&str; 3] = ["fs.read", "fs.write", "pty"];
