//! Mira Tool Runtime: the tool control plane between an agent's Planner and every tool that
//! touches files, processes, networks and external systems.
//!
//! The modules follow the chain of `docs/contract.md`, each stage narrower than
//! the one before:
//!
//! [`registry`] → [`surface`] → [`availability`] → [`exposure`] → [`invocation`] →
//! [`approval`] → [`harness`] → [`evidence`], with [`events`] recording every step in the
//! [`store`] and [`http`] serving it all. Tool implementations live in [`tools`].

pub mod app;
pub mod approval;
pub mod auth;
pub mod availability;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod devices;
pub mod embedding;
pub mod error;
pub mod events;
pub use mira_core::evidence;
pub mod exposure;
pub mod harness;
pub mod http;
pub use mira_core::ids;
pub mod invocation;
pub mod limits;
pub mod mcp;
pub mod mcp_server;
pub mod metrics;
pub mod net;
pub mod registry;
pub mod retention;
pub mod revocation;
pub mod sandbox;
pub mod secret;
pub mod server;
pub mod state;
pub mod store;
pub mod surface;
pub mod telemetry;
pub mod tools;
pub mod verify;
pub mod workspace;
