//! `mira runner`: executes the Read and Edit work of a Mira control plane on the user's own
//! machine (docs/runner.md). Built on `mira-core`, `mira-tools` and `mira-sandbox` — no axum, no sqlx —
//! so the tools are the very code the control plane runs on its host.
//!
//! - [`state`]: the device key (0600), the enrollment and the pinned control plane key.
//! - [`journal`]: replays refused, executions at most once, results kept until delivered,
//!   pruned once delivered and expired.
//! - [`runner`]: checks a signed job (signature, input hash, expiry, device, local
//!   workspace policy) and runs it.
//! - [`confirm`]: the local confirmation prompt (`--confirm`) before an approved job runs.
//! - [`connection`]: outbound only, signed challenge, heartbeats, reconnect with backoff.
//! - [`terminal`]: `terminal_session` on this device, its output streamed to the control
//!   plane.
//! - [`sandbox`]: the device's sandbox for those sessions (`crates/mira-sandbox`, as on
//!   the control plane's host).
//! - [`cli`]: `mira runner enroll …` and `mira runner --server … --workspace …`.

pub mod browser;
pub mod cli;
pub mod confirm;
pub mod connection;
pub mod journal;
pub mod runner;
pub mod sandbox;
pub mod state;
pub mod terminal;
