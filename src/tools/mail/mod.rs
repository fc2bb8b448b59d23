//! Mail: a user's mail account as a connection (kind `mail`) and its three tools.
//!
//! - `mail_search` — IMAP `UID SEARCH` in one folder (text, sender, dates), newest first, with
//!   each hit's headers; permission `mail.read`; no approval.
//! - `mail_read` — one message by folder and UID: headers, text, the attachment list; an
//!   attachment's bytes only when asked for, size-capped; permission `mail.read`; no approval.
//!   The text is third-party evidence (`provenance.trust = "third_party"`).
//! - `mail_send` — a new message or a reply over SMTP; permission `mail.send`; every call waits
//!   for an exact approval. `prepare` builds the exact RFC 5322 message (Message-ID and Date
//!   fixed there) and freezes its bytes, so the approval covers those bytes; `execute` sends
//!   exactly them, once, with the Message-ID as idempotency key (the store's send ledger, [`send`]).
//!
//! The connection's settings are `{imap: {host, port, tls}, smtp: {host, port, tls},
//! username, address}` (`tls`: `tls` = implicit TLS, `starttls`, `none`); its credential is
//! `{"password": …}` (an app password: IMAP `LOGIN`, SMTP `AUTH PLAIN`/`LOGIN`) or
//! `{"oauth_token": …}` (SASL `XOAUTH2` on both). IMAP and SMTP are checked and tracked
//! separately: `mail.read` is IMAP's state, `mail.send` SMTP's, so search works while sending
//! cannot (and the other way round).

pub mod compose;
pub mod imap;
pub mod read;
pub mod search;
pub mod send;
pub mod smtp;
pub mod wire;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::connections::{
    Access, AddressRule, CheckReport, ConnectionHub, ConnectionKind, Driver, FINGERPRINT_KEY, Opened,
};
use crate::error::ErrorCode;
use crate::registry::{Prepared, Registry, RegistryError, ToolError};
use crate::tools::ToolDeps;

/// The permission of reading mail (IMAP).
pub const READ: &str = "mail.read";
/// The permission of sending mail (SMTP).
pub const SEND: &str = "mail.send";

/// Longest a connect, login or single command may take (under the hub's 20 s check limit,
/// so each side of a check reports its own state).
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// How a mail server is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// TLS from the first byte (IMAPS 993, SMTPS 465).
    Tls,
    /// Plain TCP upgraded with `STARTTLS` before login (IMAP 143, submission 587); a server
    /// that does not offer it is refused.
    Starttls,
    /// No encryption (a server on the same host, tests).
    None,
}

/// One server of the account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Host name or IP address.
    pub host: String,
    /// TCP port (1–65535).
    pub port: u16,
    /// Transport security.
    pub tls: TlsMode,
}

/// The settings of a `mail` connection (not secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MailSettings {
    /// The IMAP server (reading).
    pub imap: ServerSettings,
    /// The SMTP submission server (sending).
    pub smtp: ServerSettings,
    /// The login name on both servers.
    pub username: String,
    /// The account's address: the `From` of every message sent.
    pub address: String,
}

/// The secret of a `mail` connection.
#[derive(Clone)]
pub enum Secret {
    /// A password or app password.
    Password(String),
    /// An OAuth 2 access token (SASL XOAUTH2).
    OAuthToken(String),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Secret::Password(_) => "Secret::Password(…)",
            Secret::OAuthToken(_) => "Secret::OAuthToken(…)",
        })
    }
}

/// Longest host name.
const MAX_HOST: usize = 253;
/// Longest user name or address.
const MAX_NAME: usize = 320;
/// Longest credential.
const MAX_SECRET: usize = 8192;

fn bad(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError::new(code, message)
}

fn check_host(which: &str, host: &str) -> Result<String, ToolError> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).map_or(host.clone(), str::to_owned);
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(host);
    }
    let valid = !host.is_empty()
        && host.len() <= MAX_HOST
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if valid {
        Ok(host)
    } else {
        Err(bad(ErrorCode::InvalidField, format!("{which}.host is not a host name or IP address")))
    }
}

impl MailSettings {
    /// Parses and validates settings (400 `invalid_request`, `invalid_field`,
    /// `invalid_address`); returns them canonical (hosts lowercased, names trimmed).
    pub fn parse(settings: Value) -> Result<Self, ToolError> {
        let mut s: MailSettings = serde_json::from_value(settings).map_err(|e| {
            bad(
                ErrorCode::InvalidRequest,
                format!(
                    "mail settings must be {{imap: {{host, port, tls}}, smtp: {{host, port, tls}}, username, address}} \
                     with tls one of tls, starttls, none: {e}"
                ),
            )
        })?;
        s.imap.host = check_host("imap", &s.imap.host)?;
        s.smtp.host = check_host("smtp", &s.smtp.host)?;
        for (which, port) in [("imap", s.imap.port), ("smtp", s.smtp.port)] {
            if port == 0 {
                return Err(bad(ErrorCode::InvalidField, format!("{which}.port must be 1–65535")));
            }
        }
        s.username = s.username.trim().to_owned();
        if s.username.is_empty() || s.username.len() > MAX_NAME || s.username.chars().any(char::is_control) {
            return Err(bad(ErrorCode::InvalidField, "username must be 1–320 bytes without control characters"));
        }
        s.address = compose::parse_address("address", s.address.trim())?;
        Ok(s)
    }

    /// The settings of an opened connection (validated when stored; a value that no longer
    /// parses is `mail_error`).
    pub fn of(conn: &Opened) -> Result<Self, ToolError> {
        Self::parse(conn.settings.clone()).map_err(|e| {
            ToolError::new(
                ErrorCode::MailError,
                format!("the stored settings of connection {} are invalid: {}", conn.id, e.message),
            )
        })
    }
}

impl Secret {
    /// Validates a credential object: exactly one of `password` or `oauth_token`, a
    /// non-empty string without control characters (400 `credential_required`,
    /// `invalid_field`). Never echoes the value.
    pub fn parse(credential: &Value) -> Result<Self, ToolError> {
        let obj = credential.as_object().ok_or_else(|| {
            bad(ErrorCode::CredentialRequired, "the mail credential must be {\"password\": …} or {\"oauth_token\": …}")
        })?;
        if let Some(extra) = obj.keys().find(|k| *k != "password" && *k != "oauth_token") {
            return Err(bad(
                ErrorCode::InvalidField,
                format!("unknown credential field {extra:?} (password or oauth_token)"),
            ));
        }
        let secret = match (obj.get("password"), obj.get("oauth_token")) {
            (Some(_), Some(_)) => {
                return Err(bad(ErrorCode::InvalidField, "give either password or oauth_token, not both"));
            }
            (Some(Value::String(p)), None) => Secret::Password(p.clone()),
            (None, Some(Value::String(t))) => Secret::OAuthToken(t.clone()),
            (None, None) => {
                return Err(bad(ErrorCode::CredentialRequired, "the mail credential needs password or oauth_token"));
            }
            _ => return Err(bad(ErrorCode::InvalidField, "the credential must be a string")),
        };
        let value = match &secret {
            Secret::Password(v) | Secret::OAuthToken(v) => v,
        };
        if value.is_empty() || value.len() > MAX_SECRET || value.chars().any(char::is_control) {
            return Err(bad(ErrorCode::InvalidField, "the credential must be 1–8192 bytes without control characters"));
        }
        Ok(secret)
    }

    /// The secret of an opened connection.
    pub fn of(conn: &Opened) -> Result<Self, ToolError> {
        Self::parse(&conn.credential).map_err(|_| {
            ToolError::new(
                ErrorCode::CredentialUnavailable,
                format!("the credential of connection {} is not a mail credential", conn.id),
            )
        })
    }
}

/// 400 `invalid_field` when validated mail `settings` use `tls: none` on either server: a
/// non-admin's connection (outside `--allow-internal-urls` deployments) must be encrypted,
/// or its password would cross the network in clear. Calls refuse it again at connect time
/// ([`wire::refuse_plaintext`]).
pub fn refuse_plaintext_settings(settings: &Value) -> Result<(), ToolError> {
    let s = MailSettings::parse(settings.clone())?;
    for (which, srv) in [("imap", &s.imap), ("smtp", &s.smtp)] {
        if srv.tls == TlsMode::None {
            return Err(bad(
                ErrorCode::InvalidField,
                format!(
                    "{which}.tls: none (no encryption) is allowed only on an admin's connection; use tls or starttls"
                ),
            ));
        }
    }
    Ok(())
}

/// The SASL XOAUTH2 initial response (`user=…^Aauth=Bearer …^A^A`), unencoded.
pub(crate) fn xoauth2(user: &str, token: &str) -> String {
    format!("user={user}\x01auth=Bearer {token}\x01\x01")
}

/// The `mail` connection kind.
pub struct MailDriver;

/// The driver of `mail` connections.
pub fn driver() -> Arc<dyn Driver> {
    Arc::new(MailDriver)
}

const PERMISSIONS: &[(&str, &str)] = &[
    (READ, "read the mailbox over IMAP (log in, search, fetch): mail_search, mail_read"),
    (SEND, "send mail over SMTP (connect, EHLO, AUTH): mail_send"),
];

#[async_trait]
impl Driver for MailDriver {
    fn kind(&self) -> ConnectionKind {
        ConnectionKind::Mail
    }

    fn permissions(&self) -> &'static [(&'static str, &'static str)] {
        PERMISSIONS
    }

    fn validate_settings(&self, settings: Value) -> Result<Value, ToolError> {
        let s = MailSettings::parse(settings)?;
        serde_json::to_value(&s).map_err(|e| ToolError::new(ErrorCode::Internal, e.to_string()))
    }

    fn validate_credential(&self, credential: &Value) -> Result<(), ToolError> {
        Secret::parse(credential).map(|_| ())
    }

    fn endpoints(&self, settings: &Value) -> Vec<String> {
        let Ok(s) = MailSettings::parse(settings.clone()) else { return Vec::new() };
        let url = |scheme: &str, tls_scheme: &str, srv: &ServerSettings| {
            let host = if srv.host.contains(':') { format!("[{}]", srv.host) } else { srv.host.clone() };
            let scheme = if srv.tls == TlsMode::Tls { tls_scheme } else { scheme };
            format!("{scheme}://{host}:{}", srv.port)
        };
        vec![url("imap", "imaps", &s.imap), url("smtp", "smtps", &s.smtp)]
    }

    async fn check(&self, conn: &Opened) -> CheckReport {
        let mut report = CheckReport::default();
        let (settings, secret) = match (MailSettings::of(conn), Secret::of(conn)) {
            (Ok(s), Ok(c)) => (s, c),
            (Err(e), _) | (_, Err(e)) => {
                for (p, _) in PERMISSIONS {
                    report.access.insert((*p).to_owned(), Access::Unknown { message: e.message.clone() });
                }
                return report;
            }
        };
        let rule = conn.address_rule;
        let (read, send) = tokio::join!(imap::check(&settings, &secret, rule), smtp::check(&settings, &secret, rule));
        report.account = Some(settings.address.clone());
        report.access.insert(READ.to_owned(), read);
        report.access.insert(SEND.to_owned(), send);
        report
    }
}

/// The [`Access`] a failed call teaches about its permission, if any: a refused login is
/// `reauth_required`; a server that cannot be reached, or may not be (an internal address or
/// plaintext under the public-only rule, see [`wire`]), `connection_unreachable`.
pub(crate) fn access_of(e: &ToolError) -> Option<Access> {
    match e.code {
        ErrorCode::ReauthRequired => Some(Access::ReauthRequired { message: e.message.clone() }),
        ErrorCode::ConnectionUnreachable | ErrorCode::InternalAddress | ErrorCode::Forbidden => {
            Some(Access::Unreachable { message: e.message.clone() })
        }
        _ => None,
    }
}

/// Registers `mail_search`, `mail_read` and `mail_send` (dynamic tools of domain `mail`) and
/// declares their needs.
pub fn register(registry: &Registry, deps: &ToolDeps) -> Result<(), RegistryError> {
    let hub = deps.connections.clone();
    registry.register(Arc::new(search::MailSearch::new(Mailbox::new(hub.clone()))))?;
    registry.register(Arc::new(read::MailRead::new(Mailbox::new(hub.clone()))))?;
    registry.register(Arc::new(send::MailSend::new(hub.clone(), deps.store.clone())))?;
    hub.declare_need(search::ID, ConnectionKind::Mail, READ);
    hub.declare_need(read::ID, ConnectionKind::Mail, READ);
    hub.declare_need(send::ID, ConnectionKind::Mail, SEND);
    Ok(())
}

/// The common input field naming the connection.
pub(crate) fn requested_connection(input: &Value) -> Option<String> {
    input.get("connection").and_then(Value::as_str).map(str::to_owned)
}

/// The IMAP side `mail_search` and `mail_read` share: the connection a call uses is resolved
/// at freeze time into `connection_id` of the canonical input, kept from the frozen input on a
/// replay, opened again at execution (it must still serve `mail.read`), and what a failed call
/// learns (a refused login, an unreachable server) is recorded on it.
pub(crate) struct Mailbox {
    hub: Arc<ConnectionHub>,
}

impl Mailbox {
    /// Over the connections of `hub`.
    pub(crate) fn new(hub: Arc<ConnectionHub>) -> Self {
        Self { hub }
    }

    /// Whether `user_id` has a connection serving `mail.read`.
    pub(crate) fn availability(&self, user_id: &str) -> crate::availability::Availability {
        self.hub.availability(user_id, ConnectionKind::Mail, READ)
    }

    /// The prepared call: `canonical` (from the raw `input`) with the resolved `connection_id`.
    pub(crate) fn prepare(&self, input: &Value, mut canonical: Value, owner_id: &str) -> Result<Prepared, ToolError> {
        let requested = requested_connection(input);
        let resolved = self.hub.resolve(owner_id, ConnectionKind::Mail, READ, requested.as_deref())?;
        canonical["connection_id"] = Value::String(resolved.id);
        canonical[FINGERPRINT_KEY] = Value::String(resolved.fingerprint);
        Ok(Prepared { input: canonical, preview: Value::Null })
    }

    /// A replay's canonical input with the frozen call's `connection_id` and fingerprint.
    pub(crate) fn replay(mut canonical: Value, frozen: &Value) -> Value {
        if let Some(o) = canonical.as_object_mut() {
            for key in ["connection_id", FINGERPRINT_KEY] {
                if let Some(v) = frozen.get(key) {
                    o.insert(key.into(), v.clone());
                }
            }
        }
        canonical
    }

    /// Opens connection `id` for a frozen call of `owner_id` (still the one it was frozen
    /// with, `fingerprint`): its settings, credential and the addresses it may reach.
    pub(crate) async fn open(
        &self,
        owner_id: &str,
        id: &str,
        fingerprint: Option<&str>,
    ) -> Result<(MailSettings, Secret, AddressRule), ToolError> {
        let conn = self.hub.open_frozen_current(owner_id, id, fingerprint, ConnectionKind::Mail, READ).await?;
        Ok((MailSettings::of(&conn)?, Secret::of(&conn)?, conn.address_rule))
    }

    /// Records what a failed call on connection `id` learned about its IMAP side.
    pub(crate) fn note(&self, id: &str, e: &ToolError) {
        if let Some(access) = access_of(e) {
            self.hub.note_access(id, READ, access);
        }
    }
}
