//! The HTTP side of a GitHub call: an `octocrab` client for one opened connection, requests
//! with bodies read under a byte cap, and GitHub's answers turned into tool errors — and into
//! what the connection hub should learn about the whole connection (a 401 means the credential
//! must be replaced, `X-RateLimit-Remaining: 0` a rate limit, a refused connection an
//! unreachable server).
//!
//! A 403 is about one resource, never about the connection: "Resource not accessible by …"
//! or an `X-Accepted-GitHub-Permissions` header fails the call with `scope_missing` (naming
//! the permission and GitHub's message) and nothing is recorded on the connection. A
//! fine-grained token limited to some repositories, a locked issue, an organisation that
//! forbids such tokens all answer it for their resource only; recorded, one user's call to
//! one such resource would turn the permission `scope_missing` for every user of a shared
//! connection, on every replica, until the next check. Whether a connection grants a
//! permission is decided by its checks alone (at creation or change, the owner's
//! `POST …/check`, the periodic one).
//!
//! Addresses: every client of a connection applies its [`Opened::address_rule`] when it
//! connects. Under [`AddressRule::PublicOnly`] (a non-admin's own connection, unless the
//! deployment allows internal addresses) the API client resolves names through
//! [`crate::net::PublicResolver`] on every connection — a name that resolves (or is rebound)
//! to an internal address is refused — and an IP-literal `base_url` is checked when the client
//! is built, since no resolver sees it. Either way the call fails `internal_address` (403) and
//! the connection is noted `unreachable`; the check reports `unreachable`.
//!
//! Downloads (a job log's redirect to a signed blob URL) go through a second client without the
//! credential, whose resolver admits the API's own host under the connection's rule and any
//! other host only at public addresses. The signed URL carries a token in its query: it never
//! appears in an output, evidence or error message (errors name the host at most).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::BodyExt;
use octocrab::Octocrab;
use serde_json::{Value, json};

use crate::connections::{Access, ConnectionHub, Opened};
use crate::error::ErrorCode;
use crate::net::AddressRule;
use crate::registry::ToolError;

/// The API root of GitHub.com.
pub const DEFAULT_BASE_URL: &str = "https://api.github.com";

/// Longest a request (connect, send, whole answer) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest JSON answer read, in bytes.
pub const MAX_JSON_BYTES: usize = 8 * 1024 * 1024;

/// Largest raw answer (a file, a diff, a log) read, in bytes.
pub const MAX_RAW_BYTES: usize = 4 * 1024 * 1024;

/// `Accept` for JSON answers (GitHub's v3 media type, as the recorded fixtures expect).
pub const ACCEPT_JSON: &str = "application/vnd.github.v3+json";

/// `Accept` for a file's raw bytes.
pub const ACCEPT_RAW: &str = "application/vnd.github.v3.raw";

/// `Accept` for a pull request's unified diff.
pub const ACCEPT_DIFF: &str = "application/vnd.github.v3.diff";

/// The credential of a GitHub connection, read from its opened JSON.
pub enum Credential {
    /// A personal access token (classic `ghp_…` or fine-grained `github_pat_…`), sent as
    /// `Authorization: token …`.
    Token(String),
    /// A GitHub App installation: the App's id and RSA private key (PEM) mint installation
    /// tokens (octocrab refreshes them before they expire).
    App {
        /// The App's id.
        app_id: u64,
        /// The installation's id.
        installation_id: u64,
        /// PEM of the App's private key.
        private_key: String,
    },
}

impl Credential {
    /// Reads and checks a credential object: `{"token"}` or `{"app_id", "installation_id",
    /// "private_key"}`. Errors never quote the secret.
    pub fn parse(credential: &Value) -> Result<Credential, ToolError> {
        let Some(obj) = credential.as_object() else {
            return Err(ToolError::new(ErrorCode::InvalidRequest, "a GitHub credential is a JSON object"));
        };
        if let Some(token) = obj.get("token") {
            if obj.len() != 1 {
                return Err(ToolError::new(ErrorCode::InvalidField, "a token credential has only the field token"));
            }
            let token = token.as_str().unwrap_or_default();
            let printable = token.bytes().all(|b| b.is_ascii_graphic());
            if token.is_empty() || token.len() > 255 || !printable {
                return Err(ToolError::new(
                    ErrorCode::InvalidApiKey,
                    "token must be 1 to 255 printable ASCII characters without spaces",
                ));
            }
            return Ok(Credential::Token(token.to_owned()));
        }
        let id = |name: &str| -> Result<u64, ToolError> {
            let v = obj.get(name).ok_or_else(|| {
                ToolError::new(
                    ErrorCode::CredentialRequired,
                    format!("a GitHub credential is {{\"token\"}} or {{\"app_id\", \"installation_id\", \"private_key\"}}: {name} is missing"),
                )
            })?;
            v.as_u64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                .filter(|n| *n > 0)
                .ok_or_else(|| ToolError::new(ErrorCode::InvalidField, format!("{name} must be a positive integer")))
        };
        let app_id = id("app_id")?;
        let installation_id = id("installation_id")?;
        let private_key = obj.get("private_key").and_then(Value::as_str).unwrap_or_default().to_owned();
        if obj.len() != 3 {
            return Err(ToolError::new(
                ErrorCode::InvalidField,
                "an App credential has only the fields app_id, installation_id and private_key",
            ));
        }
        if private_key.len() > 16 * 1024
            || Octocrab::builder().app_from_rsa_pem(app_id.into(), private_key.as_bytes()).is_err()
        {
            return Err(ToolError::new(ErrorCode::InvalidField, "private_key is not an RSA private key in PEM form"));
        }
        Ok(Credential::App { app_id, installation_id, private_key })
    }
}

/// A client for one call on one opened connection.
pub struct Api {
    octo: Octocrab,
    /// For a GitHub App: the client authenticated as the App itself (JWT), for the
    /// installation's own description.
    app: Option<(Octocrab, u64)>,
    conn_id: String,
    settings: Value,
    base: url::Url,
    hub: Option<Arc<ConnectionHub>>,
    permission: &'static str,
    plain: reqwest::Client,
    rule: AddressRule,
}

/// A failed request: no answer came (or the address rule refused the server).
#[derive(Debug, Clone)]
pub struct Transport {
    /// What failed, in one line; never the credential or a URL's query.
    pub message: String,
    /// Whether the connection's [`AddressRule`] refused the address (an internal address
    /// under [`AddressRule::PublicOnly`]) rather than the network failing.
    pub internal_address: bool,
}

/// The resolver of the download client: the API's own host under the connection's rule, any
/// other host at public addresses only — checked on every connection (no DNS rebinding).
#[derive(Debug, Clone)]
struct DownloadResolver {
    api_host: Option<String>,
    rule: AddressRule,
}

impl reqwest::dns::Resolve for DownloadResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        let rule = if self.api_host.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(&host)) {
            self.rule
        } else {
            AddressRule::PublicOnly
        };
        Box::pin(async move {
            let addrs = crate::net::resolve_host(&host, 0, rule)
                .await
                .map_err(|e| Box::new(std::io::Error::new(std::io::ErrorKind::PermissionDenied, e)))?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// An answer: status, headers, body.
pub struct Reply {
    /// HTTP status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body (at most the cap given to the request).
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON (`provider_bad_response` style error `github_error` if it is not).
    pub fn json(&self) -> Result<Value, ToolError> {
        serde_json::from_slice(&self.body)
            .map_err(|e| ToolError::new(ErrorCode::GithubError, format!("GitHub's answer is not JSON: {e}")))
    }

    /// GitHub's `message` of an error body, cut to 300 bytes.
    pub fn message(&self) -> String {
        let m = serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&self.body).into_owned());
        super::cut(m.trim(), 300).0
    }

    /// The header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The end of the rate limit this answer reports (`X-RateLimit-Remaining: 0`, or 429, with
    /// `X-RateLimit-Reset` in epoch seconds or `Retry-After`), RFC 3339.
    pub fn rate_limited_until(&self) -> Option<String> {
        let exhausted = self.header("x-ratelimit-remaining").map(str::trim) == Some("0");
        let limited_status = matches!(self.status.as_u16(), 403 | 429);
        if !(exhausted || (limited_status && self.header("retry-after").is_some()) || self.status.as_u16() == 429) {
            return None;
        }
        // A server's reset time counts for at most a day: a hostile or broken server cannot
        // shut a connection for longer than that.
        let latest = chrono::Utc::now() + chrono::TimeDelta::days(1);
        let from_reset = self
            .header("x-ratelimit-reset")
            .and_then(|r| r.trim().parse::<i64>().ok())
            .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0))
            .map(|t| t.min(latest).to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        let from_retry = self
            .header("retry-after")
            .and_then(|r| r.trim().parse::<u64>().ok())
            .map(|s| crate::ids::now_plus_ms(s.min(86_400).saturating_mul(1000)));
        Some(from_reset.or(from_retry).unwrap_or_else(|| crate::ids::now_plus_ms(60_000)))
    }
}

/// Percent-encodes one path segment (everything but RFC 3986 unreserved characters).
pub fn seg(s: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');
    percent_encoding::utf8_percent_encode(s, SET).to_string()
}

/// Percent-encodes a `/`-separated path, segment by segment.
pub fn path(s: &str) -> String {
    s.split('/').map(seg).collect::<Vec<_>>().join("/")
}

/// The canonical base URL of settings (`base_url`, default GitHub.com's API).
pub fn base_url(settings: &Value) -> Result<url::Url, ToolError> {
    let raw = settings.get("base_url").and_then(Value::as_str).unwrap_or(DEFAULT_BASE_URL);
    let url = url::Url::parse(raw)
        .map_err(|e| ToolError::new(ErrorCode::InvalidUrl, format!("base_url {raw:?} does not parse: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ToolError::new(ErrorCode::InvalidUrl, "base_url must be an http or https URL with a host"));
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err(ToolError::new(ErrorCode::InvalidUrl, "base_url may not have a query, a fragment or credentials"));
    }
    Ok(url)
}

fn client_error(e: impl std::fmt::Display) -> ToolError {
    ToolError::new(ErrorCode::Internal, format!("the GitHub client cannot be built: {e}"))
}

impl Api {
    /// A client for `conn` for a tool needing `permission`; `hub` learns what calls find out
    /// about the whole connection.
    pub fn new(conn: Opened, hub: Arc<ConnectionHub>, permission: &'static str) -> Result<Api, ToolError> {
        Self::build(conn, Some(hub), permission)
    }

    /// A client for a check (nothing is noted in the hub: the check reports instead).
    pub fn for_check(conn: &Opened) -> Result<Api, ToolError> {
        Self::build(conn.clone(), None, "")
    }

    fn build(conn: Opened, hub: Option<Arc<ConnectionHub>>, permission: &'static str) -> Result<Api, ToolError> {
        let base = base_url(&conn.settings)?;
        let rule = conn.address_rule;
        // An IP literal reaches no resolver: its address is checked here.
        let literal = match base.host() {
            Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
            _ => None,
        };
        if let Some(ip) = literal.filter(|ip| rule == AddressRule::PublicOnly && crate::net::is_internal(*ip)) {
            return Err(internal_address(&conn.id, &format!("{ip} is an internal address")));
        }
        let credential = Credential::parse(&conn.credential).map_err(|e| {
            ToolError::new(
                ErrorCode::CredentialUnavailable,
                format!("the connection's credential is unusable: {}", e.message),
            )
        })?;
        let http = crate::net::with_rule(crate::net::client_builder(), rule)
            .user_agent(crate::tools::search::net::USER_AGENT)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(client_error)?;
        let base_uri = base.as_str().trim_end_matches('/').to_owned();
        let builder = || Octocrab::builder().base_uri(base_uri.as_str()).map_err(client_error);
        let (octo, app) = match credential {
            Credential::Token(token) => {
                let oauth = octocrab::auth::OAuth {
                    access_token: token.into(),
                    token_type: "token".into(),
                    scope: Vec::new(),
                    expires_in: None,
                    refresh_token: None,
                    refresh_token_expires_in: None,
                };
                (builder()?.oauth(oauth).build_with_reqwest(http.clone()).map_err(client_error)?, None)
            }
            Credential::App { app_id, installation_id, private_key } => {
                let app = builder()?
                    .app_from_rsa_pem(app_id.into(), private_key.as_bytes())
                    .map_err(|_| ToolError::new(ErrorCode::CredentialUnavailable, "the App's private key is unusable"))?
                    .build_with_reqwest(http.clone())
                    .map_err(client_error)?;
                let installation = app.installation(installation_id.into()).map_err(client_error)?;
                (installation, Some((app, installation_id)))
            }
        };
        let plain = crate::net::client_builder()
            .user_agent(crate::tools::search::net::USER_AGENT)
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            // No redirects: each hop would need the address check again.
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(DownloadResolver { api_host: base.host_str().map(str::to_owned), rule }))
            .build()
            .map_err(client_error)?;
        Ok(Api { octo, app, conn_id: conn.id, settings: conn.settings, base, hub, permission, plain, rule })
    }

    /// The connection's id.
    pub fn connection_id(&self) -> &str {
        &self.conn_id
    }

    /// The connection's settings.
    pub fn settings(&self) -> &Value {
        &self.settings
    }

    /// For a GitHub App: the App client and the installation id.
    pub fn app(&self) -> Option<(&Octocrab, u64)> {
        self.app.as_ref().map(|(o, id)| (o, *id))
    }

    /// Sends one request to `path` (with its query) on the connection's API root; reads at
    /// most `cap` bytes of the answer. Transport failures are `connection_unreachable`, an
    /// address the connection's rule refuses `internal_address` (both noted as unreachable);
    /// statuses are returned as they are.
    pub async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<&Value>,
        accept: &str,
        cap: usize,
    ) -> Result<Reply, ToolError> {
        send_with(&self.octo, method, path_and_query, body, accept, cap).await.map_err(|t| {
            self.note(Access::Unreachable { message: t.message.clone() });
            if t.internal_address {
                internal_address(&self.conn_id, &t.message)
            } else {
                ToolError::new(ErrorCode::ConnectionUnreachable, format!("GitHub cannot be reached: {}", t.message))
            }
        })
    }

    /// `send` with a JSON answer, any non-2xx status turned into its tool error.
    pub async fn json(&self, method: Method, path_and_query: &str, body: Option<&Value>) -> Result<Value, ToolError> {
        let reply = self.send(method, path_and_query, body, ACCEPT_JSON, MAX_JSON_BYTES).await?;
        let reply = self.ok(reply)?;
        if reply.body.is_empty() {
            return Ok(Value::Null);
        }
        reply.json()
    }

    /// GET with a JSON answer.
    pub async fn get(&self, path_and_query: &str) -> Result<Value, ToolError> {
        self.json(Method::GET, path_and_query, None).await
    }

    /// The reply when its status is 2xx, else its tool error (and what the hub should learn).
    pub fn ok(&self, reply: Reply) -> Result<Reply, ToolError> {
        if reply.status.is_success() {
            if let Some(until) = reply.rate_limited_until() {
                self.note_rate_limit(until);
            }
            return Ok(reply);
        }
        Err(self.error(&reply))
    }

    /// The tool error of a non-2xx answer; notes a refused credential and a rate limit in the
    /// hub (never a 403: see the module docs).
    pub fn error(&self, reply: &Reply) -> ToolError {
        let status = reply.status.as_u16();
        let message = reply.message();
        let details = json!({"status": status, "github_message": message});
        if let Some(until) = reply.rate_limited_until().filter(|_| matches!(status, 403 | 429)) {
            self.note_rate_limit(until.clone());
            return ToolError::new(ErrorCode::RateLimited, format!("GitHub's rate limit is used up until {until}"))
                .with_details(json!({"status": status, "reset_at": until}));
        }
        match status {
            401 => {
                self.note(Access::ReauthRequired { message: message.clone() });
                ToolError::new(
                    ErrorCode::ReauthRequired,
                    format!("GitHub refused the connection's credential: {message}"),
                )
                .with_details(details)
            }
            // One resource refused: the call fails, the connection is not marked (module docs).
            403 if message.contains("not accessible by") || reply.header("x-accepted-github-permissions").is_some() => {
                ToolError::new(
                    ErrorCode::ScopeMissing,
                    format!("GitHub refused this request for lack of {} on it: {message}", self.permission),
                )
                .with_details(details)
            }
            403 => ToolError::new(ErrorCode::Forbidden, format!("GitHub refused the request: {message}"))
                .with_details(details),
            404 => ToolError::new(ErrorCode::NotFound, format!("GitHub answered 404: {message}")).with_details(details),
            _ => ToolError::new(ErrorCode::GithubError, format!("GitHub answered {status}: {message}"))
                .with_details(details),
        }
    }

    /// Records `access` for every permission of the connection (what a call learned about the
    /// whole connection: a refused credential, an unreachable server).
    fn note(&self, access: Access) {
        let Some(hub) = &self.hub else { return };
        for (p, _) in super::PERMISSIONS {
            hub.note_access(&self.conn_id, p, access.clone());
        }
    }

    fn note_rate_limit(&self, until: String) {
        if let Some(hub) = &self.hub {
            hub.note_rate_limit(&self.conn_id, until);
        }
    }

    /// Follows a redirect GitHub answers for a download (job logs live in blob storage): a
    /// plain GET without the credential, to the API's own host (under the connection's address
    /// rule) or to a public address. The URL is secret (a signed blob URL carries a token in
    /// its query): the error names its host at most.
    pub async fn download(&self, location: &str, cap: usize) -> Result<Bytes, String> {
        let url = url::Url::parse(location).map_err(|_| "the download URL does not parse".to_owned())?;
        let host = url.host_str().unwrap_or_default().to_owned();
        if !matches!(url.scheme(), "http" | "https") || host.is_empty() {
            return Err("the download URL is not an http or https URL with a host".into());
        }
        // IP literals reach no resolver: checked here (names are checked again by the
        // client's resolver on every connection).
        let api_host = self.base.host_str().is_some_and(|h| h.eq_ignore_ascii_case(&host));
        if self.rule == AddressRule::PublicOnly || !api_host {
            crate::net::check_public_url(url.as_str()).await.map_err(|e| e.0)?;
        }
        let fail = |e: reqwest::Error| match crate::net::refused_address(&e) {
            Some(p) => p.0.clone(),
            None => {
                format!("the download from {host} failed: {}", crate::tools::search::net::describe(&e.without_url()))
            }
        };
        let resp = self.plain.get(url.clone()).send().await.map_err(fail)?;
        if !resp.status().is_success() {
            return Err(format!("the download from {host} answered {}", resp.status().as_u16()));
        }
        crate::tools::search::net::read_capped(resp, cap as u64).await.map(Bytes::from).map_err(|e| match e {
            crate::tools::search::net::BodyError::TooLarge(max) => format!("larger than {max} bytes"),
            crate::tools::search::net::BodyError::Transfer(e) => fail(e),
        })
    }
}

/// `internal_address` (403): connection `conn_id` points at an address its rule refuses.
fn internal_address(conn_id: &str, why: &str) -> ToolError {
    ToolError::new(
        ErrorCode::InternalAddress,
        format!(
            "connection {conn_id} reaches an internal address ({why}); only an admin's connection, or a deployment \
             that allows internal URLs, may reach one"
        ),
    )
    .with_details(json!({"connection": conn_id}))
}

/// One request on `octo`; Err is a transport failure (never the credential).
pub async fn send_with(
    octo: &Octocrab,
    method: Method,
    path_and_query: &str,
    body: Option<&Value>,
    accept: &str,
    cap: usize,
) -> Result<Reply, Transport> {
    let plain = |message: String| Transport { message, internal_address: false };
    let builder = http::Request::builder().method(method).uri(path_and_query).header(http::header::ACCEPT, accept);
    let request = octo.build_request(builder, body).map_err(|e| plain(format!("the request cannot be built: {e}")))?;
    let resp = match octo.execute(request).await {
        Ok(resp) => resp,
        // Minting a GitHub App installation token failed with GitHub's answer (a wrong key,
        // an installation that is gone): that answer stands for the request's.
        Err(octocrab::Error::GitHub { source, .. }) => {
            let body = json!({"message": source.message}).to_string();
            return Ok(Reply {
                status: source.status_code,
                headers: source.headers.unwrap_or_default(),
                body: Bytes::from(body),
            });
        }
        Err(e) => {
            return Err(match crate::net::refused_address(&e) {
                Some(p) => Transport { message: p.0.clone(), internal_address: true },
                None => plain(describe(&e)),
            });
        }
    };
    let (parts, body) = resp.into_parts();
    let collected = http_body_util::Limited::new(body, cap).collect().await.map_err(|e| {
        plain(if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
            format!("the answer is larger than {cap} bytes")
        } else {
            format!("reading the answer failed: {e}")
        })
    })?;
    Ok(Reply { status: parts.status, headers: parts.headers, body: collected.to_bytes() })
}

/// A transport error's chain of causes, in one line (without octocrab's backtraces).
fn describe(e: &octocrab::Error) -> String {
    let mut out = match e {
        octocrab::Error::Service { .. } => "the request failed".to_owned(),
        octocrab::Error::Hyper { .. } => "the connection failed".to_owned(),
        other => format!("the request failed ({})", variant_name(other)),
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    super::cut(&out, 500).0
}

fn variant_name(e: &octocrab::Error) -> &'static str {
    match e {
        octocrab::Error::Uri { .. } | octocrab::Error::UriParse { .. } => "bad URI",
        octocrab::Error::Json { .. } | octocrab::Error::Serde { .. } => "bad JSON",
        _ => "client error",
    }
}
