//! The core of the Mira Tool Runtime that a remote runner can use without the server (no
//! axum, no sqlx): ids and timestamps ([`ids`]), canonical JSON and the input hash
//! ([`canonical`], RFC 8785), evidence drafts ([`evidence`]), the tool protocol — spec,
//! result, error with its code from the catalogue ([`error_code`]), the [`tool::Tool`]
//! trait — ([`tool`]), availability answers
//! ([`availability`]), the registry-only approval policy ([`policy`]), the commit point of a
//! running call ([`commit`]), the remote-device protocol and its signatures ([`remote`]) and the workspace boundary ([`workspace`], cap-std
//! open-beneath). The server (`mira`) re-exports these modules under its own paths.

pub mod availability;
pub mod canonical;
pub mod chain;
pub mod commit;
pub mod devtools;
pub mod error_code;
pub mod evidence;
pub mod ids;
pub mod policy;
pub mod remote;
pub mod tool;
pub mod workspace;
