//! IMAP (RFC 3501/9051) through `async-imap` on tokio: connect (implicit TLS, STARTTLS or
//! plain), log in (`LOGIN` with a password, `AUTHENTICATE XOAUTH2` with a token), `EXAMINE`
//! (read-only: reading never changes a flag), `UID SEARCH`, `UID FETCH … BODY.PEEK[…]`.
//!
//! Errors: a connection or TLS failure is `connection_unreachable`, a refused login
//! `reauth_required` (both teach the connection's `mail.read` state), any other server answer
//! `mail_error`. The server's text is third-party and appears only in error messages and
//! outputs; the credential never does.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::TryStreamExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::wire::{self, Budget, Budgeted};
use super::{IO_TIMEOUT, MailSettings, Secret, TlsMode};
use crate::connections::Access;
use crate::error::ErrorCode;
use crate::net::AddressRule;
use crate::registry::ToolError;

/// A TCP stream, with or without TLS.
pub enum MailStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl std::fmt::Debug for MailStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MailStream::Plain(_) => "MailStream::Plain",
            MailStream::Tls(_) => "MailStream::Tls",
        })
    }
}

impl AsyncRead for MailStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for MailStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_flush(cx),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            MailStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MailStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl MailStream {
    /// The peer's address.
    pub fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        match self {
            MailStream::Plain(s) => s.peer_addr(),
            MailStream::Tls(s) => s.get_ref().0.peer_addr(),
        }
    }
}

/// A logged-in IMAP session over a [`Budgeted`] stream.
pub type Session = async_imap::Session<Budgeted<MailStream>>;

/// Most bytes one IMAP session may read in all.
pub const SESSION_BYTES: u64 = 40 * 1024 * 1024;
/// Most bytes of the answer to one simple command (greeting, `LOGIN`, `EXAMINE`, a `FETCH` of
/// sizes and flags, `LOGOUT`).
pub const COMMAND_BYTES: u64 = 1024 * 1024;
/// Most bytes of the answer to `UID SEARCH` (each of its lines at most
/// [`wire::IMAP_LINE_BYTES`]).
pub const SEARCH_BYTES: u64 = 2 * 1024 * 1024;
/// Most UIDs a `UID SEARCH` answer may hold (after removing duplicates).
pub const MAX_SEARCH_RESULTS: usize = 300_000;

/// A logged-in session and its read [`Budget`] (each command runs in a phase of its own).
pub struct Imap {
    session: Session,
    budget: Budget,
}

fn unreachable(settings: &MailSettings, why: impl std::fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::ConnectionUnreachable,
        format!("the IMAP server {}:{} cannot be reached: {why}", settings.imap.host, settings.imap.port),
    )
}

/// A server text cut for an error message (it is third-party text).
pub(crate) fn server_text(s: &str) -> String {
    let s: String = s.chars().filter(|c| !c.is_control()).collect();
    crate::evidence::excerpt(s.trim(), 300)
}

/// The TLS client configuration (ring, the system's root certificates).
pub(crate) fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err("no root certificates found on this host".into());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

async fn tls_wrap(settings: &MailSettings, tcp: TcpStream) -> Result<MailStream, ToolError> {
    let config = tls_config().map_err(|e| unreachable(settings, e))?;
    let name = rustls::pki_types::ServerName::try_from(settings.imap.host.clone())
        .map_err(|e| unreachable(settings, format!("bad server name: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| unreachable(settings, format!("TLS handshake: {e}")))?;
    Ok(MailStream::Tls(Box::new(tls)))
}

struct XOAuth2 {
    response: Option<String>,
}

impl async_imap::Authenticator for XOAuth2 {
    type Response = String;

    // The first challenge gets the token; a second one is the server's error report, which
    // is answered with an empty line (RFC 7628 3.2.3) so the server ends with NO.
    fn process(&mut self, _challenge: &[u8]) -> Self::Response {
        self.response.take().unwrap_or_default()
    }
}

/// An IO error as a tool error: a spent read budget is `mail_error` naming the limit, any other
/// `connection_unreachable`.
fn io_error(settings: &MailSettings, what: &str, e: &std::io::Error) -> ToolError {
    match wire::exceeded_in(e) {
        Some(x) => ToolError::new(ErrorCode::MailError, format!("IMAP {what} stopped: {x}"))
            .with_details(serde_json::json!({"limit_bytes": x.limit, "announced_bytes": x.announced})),
        None => unreachable(settings, e),
    }
}

async fn connect_and_login(settings: &MailSettings, secret: &Secret, rule: AddressRule) -> Result<Imap, ToolError> {
    crate::net::install_tls_provider();
    wire::refuse_plaintext("imap", settings.imap.tls, rule)?;
    let tcp = wire::connect(&settings.imap.host, settings.imap.port, rule, |why| unreachable(settings, why)).await?;
    let stream = match settings.imap.tls {
        TlsMode::Tls => tls_wrap(settings, tcp).await?,
        TlsMode::None | TlsMode::Starttls => MailStream::Plain(tcp),
    };
    let budget = Budget::new(SESSION_BYTES, "the greeting and login", COMMAND_BYTES, false);
    let mut client = async_imap::Client::new(Budgeted::new(stream, budget.clone(), true));
    match client.read_response().await {
        Ok(Some(_greeting)) => {}
        Ok(None) => return Err(unreachable(settings, "the server closed the connection before its greeting")),
        Err(e) => return Err(io_error(settings, "greeting", &e)),
    }
    if settings.imap.tls == TlsMode::Starttls {
        client
            .run_command_and_check_ok("STARTTLS", None)
            .await
            .map_err(|e| unreachable(settings, format!("STARTTLS refused: {e}")))?;
        let (MailStream::Plain(tcp), budget) = client.into_inner().into_parts() else {
            return Err(unreachable(settings, "STARTTLS on a TLS stream"));
        };
        client = async_imap::Client::new(Budgeted::new(tls_wrap(settings, tcp).await?, budget, true));
    }
    let login = match secret {
        Secret::Password(p) => client.login(&settings.username, p).await,
        Secret::OAuthToken(t) => {
            let auth = XOAuth2 { response: Some(super::xoauth2(&settings.username, t)) };
            client.authenticate("XOAUTH2", auth).await
        }
    };
    let session = login.map_err(|(e, _)| match e {
        async_imap::error::Error::No(text) | async_imap::error::Error::Bad(text) => ToolError::new(
            ErrorCode::ReauthRequired,
            format!("the IMAP server refused the login of {}: {}", settings.username, server_text(&text)),
        ),
        async_imap::error::Error::Io(e) => io_error(settings, "login", &e),
        async_imap::error::Error::ConnectionLost => unreachable(settings, "the connection was lost during login"),
        other => {
            ToolError::new(ErrorCode::MailError, format!("IMAP login failed: {}", server_text(&other.to_string())))
        }
    })?;
    Ok(Imap { session, budget })
}

/// Connects to an address `rule` allows (see [`wire::connect`]) and logs in, within
/// [`IO_TIMEOUT`].
pub async fn login(settings: &MailSettings, secret: &Secret, rule: AddressRule) -> Result<Imap, ToolError> {
    match tokio::time::timeout(IO_TIMEOUT, connect_and_login(settings, secret, rule)).await {
        Ok(r) => r,
        Err(_) => Err(unreachable(settings, format!("no answer within {} s", IO_TIMEOUT.as_secs()))),
    }
}

/// The `mail.read` state: a login round trip.
pub async fn check(settings: &MailSettings, secret: &Secret, rule: AddressRule) -> Access {
    match login(settings, secret, rule).await {
        Ok(imap) => {
            logout(imap).await;
            Access::Granted
        }
        Err(e) => super::access_of(&e).unwrap_or(Access::Unknown { message: e.message }),
    }
}

/// A command's error as a tool error.
pub fn command_error(settings: &MailSettings, what: &str, e: async_imap::error::Error) -> ToolError {
    match e {
        async_imap::error::Error::Io(e) => io_error(settings, what, &e),
        async_imap::error::Error::ConnectionLost => {
            unreachable(settings, format!("the connection was lost during {what}"))
        }
        async_imap::error::Error::No(t) | async_imap::error::Error::Bad(t) => {
            ToolError::new(ErrorCode::MailError, format!("the IMAP server refused {what}: {}", server_text(&t)))
        }
        other => {
            ToolError::new(ErrorCode::MailError, format!("IMAP {what} failed: {}", server_text(&other.to_string())))
        }
    }
}

/// Runs `f` within [`IO_TIMEOUT`] (a server that stops answering is `mail_error`).
pub async fn timed<T>(what: &str, f: impl std::future::Future<Output = Result<T, ToolError>>) -> Result<T, ToolError> {
    tokio::time::timeout(IO_TIMEOUT, f).await.unwrap_or_else(|_| {
        Err(ToolError::new(
            ErrorCode::MailError,
            format!("the IMAP server did not answer {what} within {} s", IO_TIMEOUT.as_secs()),
        ))
    })
}

/// An IMAP quoted string of `s` (no control characters; `\` and `"` escaped). Non-ASCII
/// text is sent as UTF-8 (the caller adds `CHARSET UTF-8` to a search).
pub fn quoted(field: &str, s: &str) -> Result<String, ToolError> {
    if s.chars().any(char::is_control) {
        return Err(ToolError::new(ErrorCode::InvalidField, format!("{field} contains a control character")));
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

/// A mailbox name in IMAP's modified UTF-7 (RFC 3501 5.1.3), unquoted (`EXAMINE` quotes it).
pub fn mailbox_name(name: &str) -> Result<String, ToolError> {
    use base64::Engine as _;
    if name.is_empty() || name.len() > 500 || name.chars().any(char::is_control) {
        return Err(ToolError::new(ErrorCode::InvalidField, "folder must be 1–500 bytes without control characters"));
    }
    let engine = base64::engine::general_purpose::STANDARD_NO_PAD;
    let mut out = String::new();
    let mut pending: Vec<u16> = Vec::new();
    let flush = |pending: &mut Vec<u16>, out: &mut String| {
        if pending.is_empty() {
            return;
        }
        let bytes: Vec<u8> = pending.iter().flat_map(|u| u.to_be_bytes()).collect();
        out.push('&');
        out.push_str(&engine.encode(bytes).replace('/', ","));
        out.push('-');
        pending.clear();
    };
    for c in name.chars() {
        if (' '..='~').contains(&c) {
            flush(&mut pending, &mut out);
            if c == '&' {
                out.push_str("&-");
            } else {
                out.push(c);
            }
        } else {
            let mut buf = [0u16; 2];
            pending.extend_from_slice(c.encode_utf16(&mut buf));
        }
    }
    flush(&mut pending, &mut out);
    Ok(out)
}

/// Selects `folder` read-only (`EXAMINE`).
pub async fn examine(settings: &MailSettings, imap: &mut Imap, folder: &str) -> Result<(), ToolError> {
    let name = mailbox_name(folder)?;
    imap.budget.phase("EXAMINE", COMMAND_BYTES);
    timed("EXAMINE", async {
        imap.session.examine(&name).await.map(|_| ()).map_err(|e| command_error(settings, "EXAMINE", e))
    })
    .await
}

/// `UID SEARCH <criteria>`: the matching UIDs, ascending. The answer may be at most
/// [`SEARCH_BYTES`] long and hold at most [`MAX_SEARCH_RESULTS`] UIDs (`mail_error` beyond).
pub async fn uid_search(settings: &MailSettings, imap: &mut Imap, criteria: &str) -> Result<Vec<u32>, ToolError> {
    imap.budget.phase("UID SEARCH", SEARCH_BYTES);
    let uids = timed("UID SEARCH", async {
        imap.session.uid_search(criteria).await.map_err(|e| command_error(settings, "UID SEARCH", e))
    })
    .await?;
    if uids.len() > MAX_SEARCH_RESULTS {
        return Err(ToolError::new(
            ErrorCode::MailError,
            format!(
                "the IMAP server answered UID SEARCH with {} UIDs, more than the limit of {MAX_SEARCH_RESULTS}; narrow the search",
                uids.len()
            ),
        ));
    }
    let mut uids: Vec<u32> = uids.into_iter().collect();
    uids.sort_unstable();
    Ok(uids)
}

/// `UID FETCH <set> <items>`: every answer, within `max_bytes` read and at most
/// `max_responses` FETCH responses (`mail_error` beyond: a server sending endless responses).
pub async fn uid_fetch(
    settings: &MailSettings,
    imap: &mut Imap,
    set: &str,
    items: &str,
    max_bytes: u64,
    max_responses: usize,
) -> Result<Vec<async_imap::types::Fetch>, ToolError> {
    imap.budget.phase("UID FETCH", max_bytes);
    timed("UID FETCH", async {
        let mut stream =
            imap.session.uid_fetch(set, items).await.map_err(|e| command_error(settings, "UID FETCH", e))?;
        let mut out = Vec::new();
        while let Some(fetch) = stream.try_next().await.map_err(|e| command_error(settings, "UID FETCH", e))? {
            if out.len() == max_responses {
                return Err(ToolError::new(
                    ErrorCode::MailError,
                    format!("the IMAP server sent more than {max_responses} FETCH responses to one UID FETCH"),
                ));
            }
            out.push(fetch);
        }
        Ok(out)
    })
    .await
}

/// Ends a session after `result`: logs out when the session is still sane (a result, or a
/// refusal such as `not_found`); after a broken connection, a spent read limit or a timeout
/// (`mail_error`, `connection_unreachable`) it only drops the connection, as the server
/// may be sending still or not listening at all.
pub async fn finish<T>(imap: Imap, result: &Result<T, ToolError>) {
    match result {
        Err(e) if e.code == ErrorCode::MailError || e.code == ErrorCode::ConnectionUnreachable => drop(imap),
        _ => logout(imap).await,
    }
}

/// Logs out, ignoring errors (the answer is already in hand).
pub async fn logout(mut imap: Imap) {
    imap.budget.phase("LOGOUT", COMMAND_BYTES);
    let _ = tokio::time::timeout(IO_TIMEOUT, imap.session.logout()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mailbox_names_are_modified_utf7() {
        assert_eq!(mailbox_name("INBOX").ok().as_deref(), Some("INBOX"));
        assert_eq!(mailbox_name("Entwürfe").ok().as_deref(), Some("Entw&APw-rfe"));
        assert_eq!(mailbox_name("A&B").ok().as_deref(), Some("A&-B"));
        assert!(mailbox_name("a\r\nb").is_err());
        assert_eq!(quoted("t", "say \"hi\"").ok().as_deref(), Some("\"say \\\"hi\\\"\""));
    }
}
