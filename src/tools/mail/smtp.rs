//! SMTP submission (RFC 5321/6409) through lettre's connection on tokio with rustls: connect
//! (implicit TLS, STARTTLS — refused when the server does not offer it — or plain), `EHLO`,
//! `AUTH` (`PLAIN`/`LOGIN` with a password, `XOAUTH2` with a token), then `MAIL`, `RCPT`,
//! `DATA` and the frozen bytes.
//!
//! [`send`] marks the call's commit point ([`ExecContext::commit`]) after the server accepted
//! `DATA` (354) and right before the first byte of the message: a stop that wins before it
//! means nothing was sent. After it, only a reply to the final `.` decides: 250 is sent, a
//! 4xx/5xx is refused (`mail_rejected`, nothing was sent), and anything else — the connection
//! dropped, no answer in time — is `outcome_unknown`: the server may have queued the message,
//! so it is never sent again automatically.

use std::time::Duration;

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, AsyncTokioStream, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::ClientId;

use super::imap::MailStream;
use super::wire::{self, Budget, Budgeted};
use super::{IO_TIMEOUT, MailSettings, Secret, TlsMode};
use crate::connections::Access;
use crate::error::ErrorCode;
use crate::net::AddressRule;
use crate::registry::{ExecContext, ToolError};

/// How long the server may take to answer the message's final `.` (it may scan the message).
pub const DATA_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest the commands before the message (`MAIL`, every `RCPT`, `DATA`) may take together.
pub const ENVELOPE_TIMEOUT: Duration = Duration::from_secs(60);
/// Most bytes of one SMTP reply (lettre reads a reply line without a bound of its own).
pub const REPLY_BYTES: u64 = 64 * 1024;
/// Most bytes one SMTP session may read in all.
pub const SESSION_BYTES: u64 = 2 * 1024 * 1024;

impl AsyncTokioStream for Budgeted<MailStream> {
    fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.get_ref().peer_addr()
    }
}

fn unreachable(settings: &MailSettings, why: impl std::fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::ConnectionUnreachable,
        format!("the SMTP server {}:{} cannot be reached: {why}", settings.smtp.host, settings.smtp.port),
    )
}

fn text(e: &lettre::transport::smtp::Error) -> String {
    super::imap::server_text(&e.to_string())
}

/// The read limit `e` met, if any (a hostile or broken server: `mail_error`).
fn exceeded(e: &lettre::transport::smtp::Error) -> Option<String> {
    wire::exceeded_in(e).map(|x| format!("the SMTP server's answer was cut: {x}"))
}

fn hello(settings: &MailSettings) -> ClientId {
    ClientId::Domain(settings.address.rsplit_once('@').map_or("localhost", |(_, d)| d).to_owned())
}

fn tls_parameters(settings: &MailSettings) -> Result<TlsParameters, ToolError> {
    TlsParameters::builder(settings.smtp.host.clone())
        .build_rustls()
        .map_err(|e| unreachable(settings, format!("TLS set-up: {}", text(&e))))
}

async fn connect_and_auth(
    settings: &MailSettings,
    secret: &Secret,
    rule: AddressRule,
) -> Result<AsyncSmtpConnection, ToolError> {
    crate::net::install_tls_provider();
    wire::refuse_plaintext("smtp", settings.smtp.tls, rule)?;
    let hello = hello(settings);
    let tcp = wire::connect(&settings.smtp.host, settings.smtp.port, rule, |why| unreachable(settings, why)).await?;
    let stream = match settings.smtp.tls {
        TlsMode::Tls => {
            let config = super::imap::tls_config().map_err(|e| unreachable(settings, format!("TLS set-up: {e}")))?;
            let name = rustls::pki_types::ServerName::try_from(settings.smtp.host.clone())
                .map_err(|e| unreachable(settings, format!("bad server name: {e}")))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|e| unreachable(settings, format!("TLS handshake: {e}")))?;
            MailStream::Tls(Box::new(tls))
        }
        TlsMode::None | TlsMode::Starttls => MailStream::Plain(tcp),
    };
    // Every reply within REPLY_BYTES (a write starts the next), the session within SESSION_BYTES.
    let budget = Budget::new(SESSION_BYTES, "one SMTP reply", REPLY_BYTES, true);
    let mut conn = AsyncSmtpConnection::connect_with_transport(Box::new(Budgeted::new(stream, budget, false)), &hello)
        .await
        .map_err(|e| match exceeded(&e) {
            Some(m) => ToolError::new(ErrorCode::MailError, m),
            None => unreachable(settings, text(&e)),
        })?;
    if settings.smtp.tls == TlsMode::Starttls {
        if !conn.can_starttls() {
            abort(&mut conn).await;
            return Err(unreachable(settings, "the server does not offer STARTTLS (tls: starttls)"));
        }
        conn.starttls(tls_parameters(settings)?, &hello).await.map_err(|e| match exceeded(&e) {
            Some(m) => ToolError::new(ErrorCode::MailError, m),
            None => unreachable(settings, format!("STARTTLS: {}", text(&e))),
        })?;
    }
    let (credentials, mechanisms) = match secret {
        Secret::Password(p) => {
            (Credentials::new(settings.username.clone(), p.clone()), vec![Mechanism::Plain, Mechanism::Login])
        }
        Secret::OAuthToken(t) => (Credentials::new(settings.username.clone(), t.clone()), vec![Mechanism::Xoauth2]),
    };
    if let Err(e) = conn.auth(&mechanisms, &credentials).await {
        abort(&mut conn).await;
        return Err(if let Some(m) = exceeded(&e) {
            ToolError::new(ErrorCode::MailError, m)
        } else if e.is_permanent() {
            ToolError::new(
                ErrorCode::ReauthRequired,
                format!("the SMTP server refused the login of {}: {}", settings.username, text(&e)),
            )
        } else if e.is_transient() {
            unreachable(settings, format!("temporary authentication failure: {}", text(&e)))
        } else if e.is_client() {
            ToolError::new(
                ErrorCode::MailError,
                format!("the SMTP server offers no authentication this credential can use: {}", text(&e)),
            )
        } else {
            unreachable(settings, text(&e))
        });
    }
    Ok(conn)
}

/// Connects to an address `rule` allows (see [`wire::connect`]), says EHLO and
/// authenticates, within [`super::IO_TIMEOUT`].
pub async fn login(
    settings: &MailSettings,
    secret: &Secret,
    rule: AddressRule,
) -> Result<AsyncSmtpConnection, ToolError> {
    match tokio::time::timeout(IO_TIMEOUT, connect_and_auth(settings, secret, rule)).await {
        Ok(r) => r,
        Err(_) => Err(unreachable(settings, format!("no answer within {} s", IO_TIMEOUT.as_secs()))),
    }
}

/// The `mail.send` state: connect, EHLO, AUTH, QUIT.
pub async fn check(settings: &MailSettings, secret: &Secret, rule: AddressRule) -> Access {
    match login(settings, secret, rule).await {
        Ok(mut conn) => {
            let _ = tokio::time::timeout(IO_TIMEOUT, conn.quit()).await;
            Access::Granted
        }
        Err(e) => super::access_of(&e).unwrap_or(Access::Unknown { message: e.message }),
    }
}

/// Ends the session (QUIT when it is still sane), within [`IO_TIMEOUT`]: a server that does
/// not answer QUIT does not hold the call.
async fn abort(conn: &mut AsyncSmtpConnection) {
    let _ = tokio::time::timeout(IO_TIMEOUT, conn.abort()).await;
}

/// How a send ended.
#[derive(Debug)]
pub enum Outcome {
    /// The server accepted the message (its reply to the final `.`).
    Sent {
        /// The reply, e.g. `250 2.0.0 Ok: queued as 4F1C…`.
        reply: String,
    },
    /// Refused before the commit point or by the reply to the final `.`: nothing was sent.
    NotSent(ToolError),
    /// The commit point passed and no reply came (connection dropped, timeout).
    Unknown(ToolError),
}

async fn step<T>(
    what: &str,
    f: impl std::future::Future<Output = Result<T, lettre::transport::smtp::Error>>,
) -> Result<T, ToolError> {
    match tokio::time::timeout(IO_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) if exceeded(&e).is_some() => Err(ToolError::new(
            ErrorCode::MailError,
            format!("SMTP {what} failed: {}; nothing was sent", exceeded(&e).unwrap_or_default()),
        )),
        Ok(Err(e)) if e.is_permanent() || e.is_transient() => Err(ToolError::new(
            ErrorCode::MailRejected,
            format!("the SMTP server refused {what}: {}; nothing was sent", text(&e)),
        )),
        Ok(Err(e)) => {
            Err(ToolError::new(ErrorCode::MailError, format!("SMTP {what} failed: {}; nothing was sent", text(&e))))
        }
        Err(_) => Err(ToolError::new(
            ErrorCode::MailError,
            format!("the SMTP server did not answer {what} within {} s; nothing was sent", IO_TIMEOUT.as_secs()),
        )),
    }
}

/// Sends `message` (exact bytes) from `from` to `recipients` over a logged-in connection,
/// passing the call's commit point between the server's 354 to `DATA` and the first byte.
pub async fn send(
    mut conn: AsyncSmtpConnection,
    from: &str,
    recipients: &[String],
    message: &[u8],
    ctx: &ExecContext,
) -> Outcome {
    let parse = |a: &str| a.parse::<lettre::Address>();
    let Ok(sender) = parse(from) else {
        return Outcome::NotSent(ToolError::new(ErrorCode::CorruptInput, "the frozen sender does not parse"));
    };
    let before = async {
        step("MAIL FROM", conn.command(Mail::new(Some(sender), vec![]))).await?;
        for r in recipients {
            let rcpt =
                parse(r).map_err(|_| ToolError::new(ErrorCode::CorruptInput, "a frozen recipient does not parse"))?;
            step(&format!("the recipient {r}"), conn.command(Rcpt::new(rcpt, vec![]))).await?;
        }
        step("DATA", conn.command(Data)).await?;
        Ok::<(), ToolError>(())
    };
    let before = tokio::time::timeout(ENVELOPE_TIMEOUT, before).await.unwrap_or_else(|_| {
        Err(ToolError::new(
            ErrorCode::MailError,
            format!(
                "the SMTP server did not accept the envelope (MAIL, RCPT, DATA) within {} s; nothing was sent",
                ENVELOPE_TIMEOUT.as_secs()
            ),
        ))
    });
    if let Err(e) = before {
        abort(&mut conn).await;
        return Outcome::NotSent(e);
    }
    // The commit point: from the first byte of the message on, the server may deliver it.
    if let Err(stop) = ctx.commit() {
        abort(&mut conn).await;
        return Outcome::NotSent(stop);
    }
    // lettre ends the data with CRLF "." CRLF itself: the message's own final CRLF is that
    // first CRLF, so the server stores exactly `message`.
    let data = message.strip_suffix(b"\r\n").unwrap_or(message);
    match tokio::time::timeout(DATA_TIMEOUT, conn.message(data)).await {
        Ok(Ok(reply)) => {
            let reply = format!("{} {}", reply.code(), reply.message().collect::<Vec<_>>().join(" "));
            let _ = tokio::time::timeout(IO_TIMEOUT, conn.quit()).await;
            Outcome::Sent { reply: super::imap::server_text(&reply) }
        }
        Ok(Err(e)) if exceeded(&e).is_none() && (e.is_permanent() || e.is_transient()) => {
            abort(&mut conn).await;
            Outcome::NotSent(ToolError::new(
                ErrorCode::MailRejected,
                format!("the SMTP server refused the message: {}; nothing was sent", text(&e)),
            ))
        }
        Ok(Err(e)) => Outcome::Unknown(ToolError::new(
            ErrorCode::OutcomeUnknown,
            format!(
                "the connection to the SMTP server failed after the message was transmitted ({}); the server may have accepted it, so it is not sent again",
                text(&e)
            ),
        )),
        Err(_) => Outcome::Unknown(ToolError::new(
            ErrorCode::OutcomeUnknown,
            format!(
                "the SMTP server did not answer the message within {} s; it may have accepted it, so it is not sent again",
                DATA_TIMEOUT.as_secs()
            ),
        )),
    }
}
