//! Every integration test in one binary (one link instead of fourteen). Each module is one
//! area of the runtime; `common` starts real servers over real SQLite and Postgres stores.

#[macro_use]
mod common;

mod approval;
mod attached_browser;
mod bad_input;
mod browser;
mod cluster;
mod codegraph;
mod connections;
mod docs;
mod embedding;
mod expert;
mod github;
mod hostile_access;
mod hostile_approvals;
mod hostile_devices;
mod hostile_files;
mod hostile_sandbox;
mod http_limits;
mod inputs;
mod logs;
mod mail;
mod mcp;
mod mcp_real;
mod mcp_server;
mod metrics;
mod modules;
mod news;
mod openapi;
mod pages;
mod postgres_tls;
mod private_pg;
mod read_tools;
mod retention;
mod runner;
mod runner_sandbox;
mod sandbox_escapes;
mod schema;
mod schemathesis;
mod skills;
mod spine;
mod store;
mod terminal;
mod throughput;
mod token_scopes;
mod traces;
mod verify;
mod wait;
mod web;
mod web_search;
