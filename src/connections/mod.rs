//! STUB of the lead's connection framework (BRIEF.md's API), only so that the Mail tools
//! compile in the `mail` branch before the framework lands on main. Replaced by main's
//! `src/connections/` at merge (take main's side); nothing here stores anything.
#![allow(missing_docs, clippy::unused_self, dead_code)]

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::availability::Availability;
use crate::error::ErrorCode;
use crate::registry::ToolError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionKind {
    Github,
    Mail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Access {
    Granted,
    Missing { scope: String },
    Unknown { message: String },
    ReauthRequired { message: String },
    Unreachable { message: String },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckReport {
    pub account: Option<String>,
    pub access: BTreeMap<String, Access>,
    pub rate_limited_until: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Opened {
    pub id: String,
    pub owner_id: Option<String>,
    pub settings: Value,
    pub credential: Value,
}

#[async_trait]
pub trait Driver: Send + Sync + 'static {
    fn kind(&self) -> ConnectionKind;
    fn permissions(&self) -> &'static [(&'static str, &'static str)];
    fn validate_settings(&self, settings: Value) -> Result<Value, ToolError>;
    fn validate_credential(&self, credential: &Value) -> Result<(), ToolError>;
    fn endpoints(&self, settings: &Value) -> Vec<String>;
    async fn check(&self, conn: &Opened) -> CheckReport;
}

#[derive(Default)]
pub struct ConnectionHub {}

impl ConnectionHub {
    pub fn availability(&self, _user_id: &str, _kind: ConnectionKind, _permission: &str) -> Availability {
        Availability::unavailable(ErrorCode::Unavailable, "stub")
    }
    pub fn resolve(
        &self,
        _user_id: &str,
        _kind: ConnectionKind,
        _permission: &str,
        _requested: Option<&str>,
    ) -> Result<String, ToolError> {
        Err(ToolError::new(ErrorCode::Unavailable, "stub"))
    }
    pub fn open(&self, _user_id: &str, _id: &str, _kind: ConnectionKind, _permission: &str) -> Result<Opened, ToolError> {
        Err(ToolError::new(ErrorCode::Unavailable, "stub"))
    }
    pub fn declare_need(&self, _tool_id: &str, _kind: ConnectionKind, _permission: &'static str) {}
    pub fn note_access(&self, _id: &str, _permission: &str, _access: Access) {}
    pub fn note_rate_limit(&self, _id: &str, _until: String) {}
}
