//! Install requests, their validation, and the stored transport (secrets sealed apart).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::ErrorCode;
use crate::error::{Error, Result};
use crate::secret::SecretBox;

/// Longest server name, characters.
pub const MAX_NAME_CHARS: usize = 128;
/// Longest disclaimer, bytes.
pub const MAX_DISCLAIMER_BYTES: usize = 16 * 1024;
/// Default per-request timeout, ms.
pub const DEFAULT_REQUEST_TIMEOUT_MS: i64 = 60_000;

/// A transport as given at install: `{"stdio": {...}}` or `{"http": {...}}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TransportInput {
    /// A local process speaking JSON-RPC over stdin/stdout.
    Stdio(StdioInput),
    /// A Streamable HTTP endpoint.
    Http(HttpInput),
}

/// `{"stdio": {command, args, env, cwd}}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StdioInput {
    /// Program to run (a path or a name on PATH).
    pub command: String,
    /// Arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables: a value (stored encrypted) or `{"from_env": "VAR"}` (read from
    /// the runtime's environment at connect time). Never echoed back.
    #[serde(default)]
    pub env: BTreeMap<String, SecretInput>,
    /// Absolute working directory.
    pub cwd: Option<String>,
}

/// `{"http": {url, headers}}`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpInput {
    /// `http://` or `https://` URL of the MCP endpoint.
    pub url: String,
    /// Headers sent with every request; values as for `env`. Never echoed back.
    #[serde(default)]
    pub headers: BTreeMap<String, SecretInput>,
}

/// A secret value or a reference to the runtime's environment. Its `Debug` never shows a
/// value.
#[derive(Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SecretInput {
    /// The value itself (sealed at rest).
    Value(String),
    /// `{"from_env": "VAR"}`.
    FromEnv {
        /// Environment variable of the runtime holding the value.
        from_env: String,
    },
}

impl std::fmt::Debug for SecretInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretInput::Value(_) => f.write_str("Value(<redacted>)"),
            SecretInput::FromEnv { from_env } => f.debug_struct("FromEnv").field("from_env", from_env).finish(),
        }
    }
}

/// A transport ready to connect (secrets opened). Its `Debug` shows names, never values.
#[derive(Clone)]
pub enum Resolved {
    /// Process.
    Stdio {
        /// Program.
        command: String,
        /// Arguments.
        args: Vec<String>,
        /// Environment.
        env: Vec<(String, String)>,
        /// Working directory.
        cwd: Option<String>,
    },
    /// Streamable HTTP.
    Http {
        /// Endpoint.
        url: String,
        /// Headers.
        headers: Vec<(String, String)>,
    },
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |pairs: &[(String, String)]| pairs.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        match self {
            Resolved::Stdio { command, args, env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &names(env))
                .field("cwd", cwd)
                .finish(),
            Resolved::Http { url, headers } => {
                f.debug_struct("Http").field("url", url).field("headers", &names(headers)).finish()
            }
        }
    }
}

/// What is stored: the public config and the sealed secret values.
#[derive(Debug)]
pub struct Sealed {
    /// `stdio` or `http`.
    pub transport: &'static str,
    /// Config without secret values.
    pub config: Value,
    /// Sealed `{"env"|"headers": {name: value}}`, when any value was given.
    pub secrets: Option<String>,
}

#[derive(Serialize, Deserialize, Default)]
struct SecretValues {
    #[serde(default)]
    values: BTreeMap<String, String>,
}

fn bad(message: impl Into<String>) -> Error {
    Error::bad_request(ErrorCode::InvalidRequest, message)
}

fn env_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.as_bytes()[0].is_ascii_digit()
}

/// Validates a name.
pub fn validate_name(name: &str) -> Result<()> {
    if name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(bad(format!("name must be 1 to {MAX_NAME_CHARS} printable characters")));
    }
    Ok(())
}

/// Stable code of the 403 refusing a server-side secret reference to a non-admin (also used
/// by search connections for `api_key_env`).
pub const SERVER_ENV_REFERENCE: ErrorCode = ErrorCode::ServerEnvReference;

/// The first `{"from_env": …}` reference of a transport, as `(where, variable)`: a value the
/// runtime reads from its own environment (its API keys, database URL, secret key…).
pub fn env_reference(input: &TransportInput) -> Option<(String, String)> {
    let (map, prefix) = match input {
        TransportInput::Stdio(s) => (&s.env, "stdio.env"),
        TransportInput::Http(h) => (&h.headers, "http.headers"),
    };
    map.iter().find_map(|(name, v)| match v {
        SecretInput::FromEnv { from_env } => Some((format!("{prefix}.{name}"), from_env.clone())),
        SecretInput::Value(_) => None,
    })
}

/// 403 `server_env_reference` unless `is_admin`: only admins may make the server send one of
/// its own environment variables to an MCP server (a non-admin would name `DATABASE_URL` or
/// `MIRA_SECRET_KEY` and point the server at a listener of theirs).
pub fn check_env_references(input: &TransportInput, is_admin: bool) -> Result<()> {
    match env_reference(input) {
        Some((at, var)) if !is_admin => Err(Error::ForbiddenCode {
            code: SERVER_ENV_REFERENCE,
            message: format!(
                "{at} refers to the server's environment variable {var}; only admins may use from_env — \
                 give the value itself (it is stored encrypted and never returned)"
            ),
        }),
        _ => Ok(()),
    }
}

/// Validates a transport and seals its secret values with `aad` (the server id).
pub fn seal(input: &TransportInput, secrets: &SecretBox, aad: &str) -> Result<Sealed> {
    let mut values = SecretValues::default();
    let mut describe = |map: &BTreeMap<String, SecretInput>, prefix: &str| -> Result<Value> {
        let mut out = serde_json::Map::new();
        for (name, v) in map {
            let entry = match v {
                SecretInput::Value(value) => {
                    if value.len() > 64 * 1024 {
                        return Err(bad(format!("{prefix} {name}: value is longer than 64 KiB")));
                    }
                    values.values.insert(format!("{prefix}:{name}"), value.clone());
                    json!({"source": "encrypted"})
                }
                SecretInput::FromEnv { from_env } => {
                    if !env_name_ok(from_env) {
                        return Err(bad(format!("{prefix} {name}: from_env must name an environment variable")));
                    }
                    json!({"source": "env", "from_env": from_env})
                }
            };
            out.insert(name.clone(), entry);
        }
        Ok(Value::Object(out))
    };
    let (transport, config) = match input {
        TransportInput::Stdio(s) => {
            if s.command.trim().is_empty() || s.command.len() > 4096 || s.command.contains('\0') {
                return Err(bad("stdio.command must be 1 to 4096 bytes"));
            }
            if s.args.len() > 256 || s.args.iter().any(|a| a.len() > 16 * 1024 || a.contains('\0')) {
                return Err(bad("stdio.args: at most 256 arguments of at most 16 KiB each"));
            }
            if let Some(name) = s.env.keys().find(|k| !env_name_ok(k)) {
                return Err(bad(format!("stdio.env: {name:?} is not an environment variable name")));
            }
            if let Some(cwd) = &s.cwd
                && (!cwd.starts_with('/') || !std::path::Path::new(cwd).is_dir())
            {
                return Err(bad(format!("stdio.cwd {cwd} must be an absolute path to a directory")));
            }
            let env = describe(&s.env, "env")?;
            ("stdio", json!({"stdio": {"command": s.command, "args": s.args, "cwd": s.cwd, "env": env}}))
        }
        TransportInput::Http(h) => {
            let url = reqwest::Url::parse(&h.url).map_err(|e| bad(format!("http.url is not a URL: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                return Err(bad("http.url must be an http:// or https:// URL with a host"));
            }
            for name in h.headers.keys() {
                axum::http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| bad(format!("http.headers: {name:?} is not a header name")))?;
            }
            for (name, v) in &h.headers {
                if let SecretInput::Value(value) = v {
                    axum::http::HeaderValue::from_str(value)
                        .map_err(|_| bad(format!("http.headers: the value of {name} is not a valid header value")))?;
                }
            }
            let headers = describe(&h.headers, "header")?;
            ("http", json!({"http": {"url": h.url, "headers": headers}}))
        }
    };
    let secrets = if values.values.is_empty() {
        None
    } else {
        let text = serde_json::to_string(&values).map_err(|e| Error::Internal(e.to_string()))?;
        Some(secrets.seal(&text, aad).map_err(|e| Error::Internal(e.to_string()))?)
    };
    Ok(Sealed { transport, config, secrets })
}

/// Why a stored transport cannot be opened (each a sentence for the connection's
/// `last_error`).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The sealed values do not open (another key, corrupt).
    #[error(transparent)]
    Secrets(#[from] crate::secret::SecretError),
    /// The opened values are not the stored JSON map.
    #[error("{0}")]
    SecretValues(#[from] serde_json::Error),
    /// A `from_env` reference in a server an admin did not install.
    #[error(
        "{prefix} {name} refers to the server's environment variable {var}, but the server was not installed by an \
         admin; nothing was sent ({}) — reinstall it with the value itself",
        SERVER_ENV_REFERENCE
    )]
    EnvNotAllowed {
        /// `env` or `header`.
        prefix: String,
        /// The variable or header name.
        name: String,
        /// The server's environment variable named.
        var: String,
    },
    /// A `from_env` reference to a variable that is not set.
    #[error("{prefix} {name} refers to environment variable {var}, which is not set")]
    EnvUnset {
        /// `env` or `header`.
        prefix: String,
        /// The variable or header name.
        name: String,
        /// The server's environment variable named.
        var: String,
    },
    /// A sealed value the config names is not among the stored ones.
    #[error("{prefix} {name}: its stored value is missing")]
    ValueMissing {
        /// `env` or `header`.
        prefix: String,
        /// The variable or header name.
        name: String,
    },
    /// The config has neither `stdio` nor `http`.
    #[error("the stored transport is neither stdio nor http")]
    UnknownTransport,
}

/// Opens the stored config into a connectable transport. `allow_env` says whether
/// `from_env` references may be read (the server was installed by an admin); a reference in
/// a config that may not use one — stored before non-admins were refused at install — is an
/// error and nothing is read. Errors are sentences for the connection's `last_error` (a
/// refused or missing environment variable, a key mismatch).
pub fn resolve(
    config: &Value,
    sealed: Option<&str>,
    key_id: Option<&str>,
    secrets: &SecretBox,
    aad: &str,
    allow_env: bool,
) -> std::result::Result<Resolved, ResolveError> {
    let values: SecretValues = match (sealed, key_id) {
        (Some(s), Some(k)) => serde_json::from_str(&secrets.open(s, k, aad)?)?,
        _ => SecretValues::default(),
    };
    let pairs = |map: Option<&Value>, prefix: &str| -> std::result::Result<Vec<(String, String)>, ResolveError> {
        let mut out = Vec::new();
        for (name, spec) in map.and_then(Value::as_object).into_iter().flatten() {
            let value = match spec.get("from_env").and_then(Value::as_str) {
                Some(var) if !allow_env => {
                    return Err(ResolveError::EnvNotAllowed {
                        prefix: prefix.to_owned(),
                        name: name.clone(),
                        var: var.to_owned(),
                    });
                }
                Some(var) => std::env::var(var).map_err(|_| ResolveError::EnvUnset {
                    prefix: prefix.to_owned(),
                    name: name.clone(),
                    var: var.to_owned(),
                })?,
                None => values
                    .values
                    .get(&format!("{prefix}:{name}"))
                    .cloned()
                    .ok_or_else(|| ResolveError::ValueMissing { prefix: prefix.to_owned(), name: name.clone() })?,
            };
            out.push((name.clone(), value));
        }
        Ok(out)
    };
    if let Some(s) = config.get("stdio") {
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array).into_iter().flatten().filter_map(|a| a.as_str().map(str::to_owned)).collect()
        };
        return Ok(Resolved::Stdio {
            command: s.get("command").and_then(Value::as_str).unwrap_or_default().to_owned(),
            args: strings(s.get("args")),
            env: pairs(s.get("env"), "env")?,
            cwd: s.get("cwd").and_then(Value::as_str).map(str::to_owned),
        });
    }
    if let Some(h) = config.get("http") {
        return Ok(Resolved::Http {
            url: h.get("url").and_then(Value::as_str).unwrap_or_default().to_owned(),
            headers: pairs(h.get("headers"), "header")?,
        });
    }
    Err(ResolveError::UnknownTransport)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_never_show_in_debug_output() {
        let input: TransportInput = serde_json::from_value(json!({"http": {"url": "https://x.example/mcp",
            "headers": {"Authorization": "Bearer sk-live-123", "X-Env": {"from_env": "SOME_VAR"}}}}))
        .unwrap_or_else(|e| panic!("{e}"));
        let shown = format!("{input:?}");
        assert!(!shown.contains("sk-live-123") && shown.contains("SOME_VAR"), "{shown}");
        let resolved =
            Resolved::Http { url: "u".into(), headers: vec![("Authorization".into(), "Bearer sk-live-123".into())] };
        let shown = format!("{resolved:?}");
        assert!(!shown.contains("sk-live-123") && shown.contains("Authorization"), "{shown}");
        assert!(env_reference(&input).is_some_and(|(at, var)| at == "http.headers.X-Env" && var == "SOME_VAR"));
        assert!(check_env_references(&input, false).is_err() && check_env_references(&input, true).is_ok());
    }
}
