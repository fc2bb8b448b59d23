//! The `github` connection kind: settings, credentials and the check.
//!
//! The check reports each permission of [`super::PERMISSIONS`] from evidence only:
//! * a classic personal access token: `GET /user` answers `X-OAuth-Scopes`. `repo` grants
//!   every permission; without `repo` the reads stay granted (public repositories are readable
//!   with any token) and the writes are `missing` the scope `repo`; `public_repo` alone makes the
//!   writes `unknown` (they work on public repositories only).
//! * a fine-grained personal access token (no `X-OAuth-Scopes`): its permissions are not
//!   reported by GitHub, so the reads are probed on the allowlisted repositories (each read
//!   endpoint must answer 200 for every listed repository) and the writes are `unknown`.
//! * a GitHub App installation: `GET /app/installations/{id}` (as the App) lists the
//!   installation's permissions (`read`/`write` per area), and `GET /installation/repositories`
//!   (as the installation) proves an installation token can be minted.
//!
//! 401 → `reauth_required` for every permission; a refused connection, a timeout or an
//! address the connection's rule refuses (an internal one for a non-admin: see [`api`]) →
//! `unreachable`; `X-RateLimit-Remaining: 0` → `rate_limited_until` from `X-RateLimit-Reset`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use http::Method;
use serde_json::{Map, Value, json};

use super::PERMISSIONS;
use super::api::{self, ACCEPT_JSON, Api, MAX_JSON_BYTES, Reply, seg};
use crate::connections::{Access, CheckReport, ConnectionKind, Driver, Opened};
use crate::error::ErrorCode;
use crate::registry::ToolError;

/// Most repositories in a connection's allowlist.
pub const MAX_REPOSITORIES: usize = 100;

/// The `github` driver.
pub struct GithubDriver;

/// The areas of a GitHub permission (`contents` of `contents:read`).
const AREAS: [&str; 4] = ["contents", "issues", "pull_requests", "actions"];

fn every(access: &Access) -> BTreeMap<String, Access> {
    PERMISSIONS.iter().map(|(p, _)| ((*p).to_owned(), access.clone())).collect()
}

/// Permissions of a classic token with `scopes` (the `X-OAuth-Scopes` list).
pub fn classic_access(scopes: &[&str]) -> BTreeMap<String, Access> {
    let has = |s: &str| scopes.iter().any(|x| x.eq_ignore_ascii_case(s));
    let mut out = BTreeMap::new();
    for (p, _) in PERMISSIONS {
        let write = p.ends_with(":write");
        let access = if has("repo") || !write {
            Access::Granted
        } else if has("public_repo") {
            Access::Unknown {
                message: "the scope public_repo covers public repositories only; add repo for private ones".into(),
            }
        } else {
            Access::Missing { scope: "repo".into() }
        };
        out.insert((*p).to_owned(), access);
    }
    out
}

/// Permissions of a GitHub App installation with `permissions` (`{"contents": "write", …}`).
pub fn app_access(permissions: &Map<String, Value>) -> BTreeMap<String, Access> {
    let mut out = BTreeMap::new();
    for area in AREAS {
        let level = permissions.get(area).and_then(Value::as_str).unwrap_or("");
        let read = matches!(level, "read" | "write" | "admin");
        let write = matches!(level, "write" | "admin");
        let missing = |need: &str| Access::Missing { scope: format!("{area}:{need}") };
        out.insert(format!("{area}:read"), if read { Access::Granted } else { missing("read") });
        out.insert(format!("{area}:write"), if write { Access::Granted } else { missing("write") });
    }
    out
}

fn transport(e: &ToolError) -> Access {
    match e.code {
        ErrorCode::ConnectionUnreachable | ErrorCode::InternalAddress => {
            Access::Unreachable { message: e.message.clone() }
        }
        _ => Access::Unknown { message: e.message.clone() },
    }
}

/// The report of a failed answer: 401 → reauth, rate limit → its end, else unknown.
fn failed(reply: &Reply, what: &str) -> CheckReport {
    let status = reply.status.as_u16();
    let message = format!("{what} answered {status}: {}", reply.message());
    let until = reply.rate_limited_until().filter(|_| matches!(status, 403 | 429));
    let access = match (status, &until) {
        (401, _) => Access::ReauthRequired { message },
        (_, Some(until)) => Access::Unknown { message: format!("rate limited until {until}") },
        _ => Access::Unknown { message },
    };
    CheckReport { account: None, access: every(&access), rate_limited_until: until, inventory: None }
}

impl GithubDriver {
    async fn check_token(&self, api: &Api, settings: &Value) -> CheckReport {
        let reply = match api.send(Method::GET, "/user", None, ACCEPT_JSON, MAX_JSON_BYTES).await {
            Ok(r) => r,
            Err(e) => {
                return CheckReport {
                    account: None,
                    access: every(&transport(&e)),
                    rate_limited_until: None,
                    inventory: None,
                };
            }
        };
        if !reply.status.is_success() {
            return failed(&reply, "GET /user");
        }
        let account = reply.json().ok().and_then(|u| u.get("login").and_then(Value::as_str).map(str::to_owned));
        let until = reply.rate_limited_until();
        let access = match reply.header("x-oauth-scopes") {
            Some(scopes) => {
                let scopes: Vec<&str> = scopes.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
                classic_access(&scopes)
            }
            None => probe_fine_grained(api, settings).await,
        };
        CheckReport { account, access, rate_limited_until: until, inventory: None }
    }

    async fn check_app(&self, api: &Api) -> CheckReport {
        let Some((app, installation_id)) = api.app() else {
            return CheckReport::default();
        };
        let path = format!("/app/installations/{installation_id}");
        let reply = match api::send_with(app, Method::GET, &path, None, ACCEPT_JSON, MAX_JSON_BYTES).await {
            Ok(r) => r,
            Err(failure) => {
                return CheckReport {
                    account: None,
                    access: every(&Access::Unreachable { message: failure.message }),
                    rate_limited_until: None,
                    inventory: None,
                };
            }
        };
        if !reply.status.is_success() {
            // A 404 here means the App (its id and key) does not reach this installation.
            let mut report = failed(&reply, &format!("GET {path}"));
            if reply.status.as_u16() == 404 {
                report.access = every(&Access::ReauthRequired { message: "the App has no such installation".into() });
            }
            return report;
        }
        let installation = reply.json().unwrap_or(Value::Null);
        let account = installation.pointer("/account/login").and_then(Value::as_str).map(str::to_owned);
        let permissions = installation.get("permissions").and_then(Value::as_object).cloned().unwrap_or_default();
        // The installation token itself (minted here) must work.
        let token_reply = match api
            .send(Method::GET, "/installation/repositories?per_page=1", None, ACCEPT_JSON, MAX_JSON_BYTES)
            .await
        {
            Ok(r) => r,
            Err(e) => {
                return CheckReport {
                    account,
                    access: every(&transport(&e)),
                    rate_limited_until: None,
                    inventory: None,
                };
            }
        };
        if !token_reply.status.is_success() {
            let mut report = failed(&token_reply, "GET /installation/repositories");
            report.account = account;
            return report;
        }
        CheckReport {
            account,
            access: app_access(&permissions),
            rate_limited_until: token_reply.rate_limited_until(),
            inventory: None,
        }
    }
}

/// A fine-grained token: every read is probed on every allowlisted repository; writes are
/// unknown (GitHub reports no permissions for these tokens).
async fn probe_fine_grained(api: &Api, settings: &Value) -> BTreeMap<String, Access> {
    let repos: Vec<String> = settings
        .get("repositories")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    let unknown_write = Access::Unknown {
        message: "a fine-grained token does not report its write permissions; use a classic token or a GitHub App \
                  installation for write tools"
            .into(),
    };
    for area in AREAS {
        out.insert(format!("{area}:write"), unknown_write.clone());
        let read = if repos.is_empty() {
            Access::Unknown {
                message: "a fine-grained token's permissions can only be probed on the connection's repositories \
                          setting, which is empty"
                    .into(),
            }
        } else {
            let mut access = Access::Granted;
            for repo in &repos {
                let Some((owner, name)) = repo.split_once('/') else { continue };
                let base = format!("/repos/{}/{}", seg(owner), seg(name));
                let probe = match area {
                    "contents" => format!("{base}/contents/"),
                    "issues" => format!("{base}/issues?per_page=1"),
                    "pull_requests" => format!("{base}/pulls?per_page=1"),
                    _ => format!("{base}/actions/runs?per_page=1"),
                };
                match api.send(Method::GET, &probe, None, ACCEPT_JSON, MAX_JSON_BYTES).await {
                    Ok(r) if r.status.is_success() => {}
                    Ok(r) if r.status.as_u16() == 401 => {
                        access = Access::ReauthRequired { message: r.message() };
                        break;
                    }
                    Ok(r) if matches!(r.status.as_u16(), 403 | 404) => {
                        access = Access::Missing { scope: format!("{area}:read") };
                        break;
                    }
                    Ok(r) => {
                        access = Access::Unknown { message: format!("probing {repo} answered {}", r.status.as_u16()) };
                        break;
                    }
                    Err(e) => {
                        access = transport(&e);
                        break;
                    }
                }
            }
            access
        };
        out.insert(format!("{area}:read"), read);
    }
    out
}

#[async_trait]
impl Driver for GithubDriver {
    fn kind(&self) -> ConnectionKind {
        ConnectionKind::Github
    }

    fn permissions(&self) -> &'static [(&'static str, &'static str)] {
        PERMISSIONS
    }

    fn validate_settings(&self, settings: Value) -> Result<Value, ToolError> {
        let settings = match settings {
            Value::Null => Value::Object(Map::new()),
            s @ Value::Object(_) => s,
            _ => return Err(ToolError::new(ErrorCode::InvalidRequest, "GitHub settings are a JSON object")),
        };
        if let Some(k) =
            settings.as_object().and_then(|o| o.keys().find(|k| !matches!(k.as_str(), "base_url" | "repositories")))
        {
            return Err(ToolError::new(
                ErrorCode::InvalidField,
                format!("{k} is not a GitHub setting (base_url, repositories)"),
            ));
        }
        if settings.get("base_url").is_some_and(|b| !b.is_string()) {
            return Err(ToolError::new(ErrorCode::InvalidUrl, "base_url must be a string"));
        }
        let base = api::base_url(&settings)?;
        let mut out = json!({"base_url": base.as_str().trim_end_matches('/')});
        match settings.get("repositories") {
            None | Some(Value::Null) => {}
            Some(Value::Array(list)) => {
                if list.is_empty() || list.len() > MAX_REPOSITORIES {
                    return Err(ToolError::new(
                        ErrorCode::InvalidField,
                        format!("repositories lists 1 to {MAX_REPOSITORIES} owner/repo names (leave it out for any)"),
                    ));
                }
                let mut repos = Vec::new();
                for r in list {
                    let r = r.as_str().ok_or_else(|| {
                        ToolError::new(ErrorCode::InvalidField, "repositories lists owner/repo strings")
                    })?;
                    super::check_repo(r)?;
                    repos.push(r.to_ascii_lowercase());
                }
                repos.sort();
                repos.dedup();
                out["repositories"] = json!(repos);
            }
            Some(_) => {
                return Err(ToolError::new(ErrorCode::InvalidField, "repositories lists owner/repo strings"));
            }
        }
        Ok(out)
    }

    fn validate_credential(&self, credential: &Value) -> Result<(), ToolError> {
        api::Credential::parse(credential).map(|_| ())
    }

    fn endpoints(&self, settings: &Value) -> Vec<String> {
        vec![settings.get("base_url").and_then(Value::as_str).unwrap_or(api::DEFAULT_BASE_URL).to_owned()]
    }

    async fn check(&self, conn: &Opened) -> CheckReport {
        let api = match Api::for_check(conn) {
            Ok(api) => api,
            // An internal address under the connection's rule is unreachable, like a server
            // that is down; anything else (a credential that does not parse) is unknown.
            Err(e) => {
                return CheckReport {
                    account: None,
                    access: every(&transport(&e)),
                    rate_limited_until: None,
                    inventory: None,
                };
            }
        };
        if api.app().is_some() { self.check_app(&api).await } else { self.check_token(&api, &conn.settings).await }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn classic_scopes_map_to_permissions() {
        let full = classic_access(&["repo", "workflow"]);
        assert!(full.values().all(|a| *a == Access::Granted));
        let none = classic_access(&["read:user", "gist"]);
        assert_eq!(none["contents:read"], Access::Granted);
        assert_eq!(none["issues:write"], Access::Missing { scope: "repo".into() });
        let public = classic_access(&["public_repo"]);
        assert!(matches!(public["pull_requests:write"], Access::Unknown { .. }));
    }

    #[test]
    fn app_permissions_map_to_access() {
        let p = json!({"contents": "read", "issues": "write", "metadata": "read"});
        let a = app_access(p.as_object().unwrap());
        assert_eq!(a["contents:read"], Access::Granted);
        assert_eq!(a["contents:write"], Access::Missing { scope: "contents:write".into() });
        assert_eq!(a["issues:write"], Access::Granted);
        assert_eq!(a["actions:read"], Access::Missing { scope: "actions:read".into() });
    }

    #[test]
    fn settings_are_canonical() {
        let d = GithubDriver;
        let s = d.validate_settings(json!({"repositories": ["Octo/Hello", "octo/hello"]})).unwrap();
        assert_eq!(s, json!({"base_url": "https://api.github.com", "repositories": ["octo/hello"]}));
        assert_eq!(d.validate_settings(json!({"base_url": "ftp://x"})).unwrap_err().code, ErrorCode::InvalidUrl);
        assert_eq!(d.validate_settings(json!({"repositories": ["../x"]})).unwrap_err().code, ErrorCode::InvalidField);
        assert_eq!(d.validate_settings(json!({"nope": 1})).unwrap_err().code, ErrorCode::InvalidField);
        assert!(d.validate_credential(&json!({"token": "ghp_abc"})).is_ok());
        assert!(d.validate_credential(&json!({"token": "a b"})).is_err());
        assert!(d.validate_credential(&json!({"app_id": 1, "installation_id": 2, "private_key": "x"})).is_err());
    }
}
