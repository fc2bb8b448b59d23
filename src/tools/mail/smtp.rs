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
use lettre::transport::smtp::client::{AsyncSmtpConnection, TlsParameters};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::ClientId;

use super::{IO_TIMEOUT, MailSettings, Secret, TlsMode};
use crate::connections::Access;
use crate::error::ErrorCode;
use crate::registry::{ExecContext, ToolError};

/// How long the server may take to answer the message's final `.` (it may scan the message).
pub const DATA_TIMEOUT: Duration = Duration::from_secs(120);

fn unreachable(settings: &MailSettings, why: impl std::fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::ConnectionUnreachable,
        format!("the SMTP server {}:{} cannot be reached: {why}", settings.smtp.host, settings.smtp.port),
    )
}

fn text(e: &lettre::transport::smtp::Error) -> String {
    super::imap::server_text(&e.to_string())
}

fn hello(settings: &MailSettings) -> ClientId {
    ClientId::Domain(settings.address.rsplit_once('@').map_or("localhost", |(_, d)| d).to_owned())
}

fn tls_parameters(settings: &MailSettings) -> Result<TlsParameters, ToolError> {
    TlsParameters::builder(settings.smtp.host.clone())
        .build_rustls()
        .map_err(|e| unreachable(settings, format!("TLS set-up: {}", text(&e))))
}

async fn connect_and_auth(settings: &MailSettings, secret: &Secret) -> Result<AsyncSmtpConnection, ToolError> {
    crate::net::install_tls_provider();
    let hello = hello(settings);
    let addr = (settings.smtp.host.as_str(), settings.smtp.port);
    let implicit = if settings.smtp.tls == TlsMode::Tls { Some(tls_parameters(settings)?) } else { None };
    let mut conn = AsyncSmtpConnection::connect_tokio1(addr, Some(IO_TIMEOUT), &hello, implicit, None)
        .await
        .map_err(|e| unreachable(settings, text(&e)))?;
    if settings.smtp.tls == TlsMode::Starttls {
        if !conn.can_starttls() {
            conn.abort().await;
            return Err(unreachable(settings, "the server does not offer STARTTLS (tls: starttls)"));
        }
        conn.starttls(tls_parameters(settings)?, &hello)
            .await
            .map_err(|e| unreachable(settings, format!("STARTTLS: {}", text(&e))))?;
    }
    let (credentials, mechanisms) = match secret {
        Secret::Password(p) => {
            (Credentials::new(settings.username.clone(), p.clone()), vec![Mechanism::Plain, Mechanism::Login])
        }
        Secret::OAuthToken(t) => (Credentials::new(settings.username.clone(), t.clone()), vec![Mechanism::Xoauth2]),
    };
    if let Err(e) = conn.auth(&mechanisms, &credentials).await {
        conn.abort().await;
        return Err(if e.is_permanent() {
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

/// Connects, says EHLO and authenticates, within [`super::IO_TIMEOUT`].
pub async fn login(settings: &MailSettings, secret: &Secret) -> Result<AsyncSmtpConnection, ToolError> {
    match tokio::time::timeout(IO_TIMEOUT, connect_and_auth(settings, secret)).await {
        Ok(r) => r,
        Err(_) => Err(unreachable(settings, format!("no answer within {} s", IO_TIMEOUT.as_secs()))),
    }
}

/// The `mail.send` state: connect, EHLO, AUTH, QUIT.
pub async fn check(settings: &MailSettings, secret: &Secret) -> Access {
    match login(settings, secret).await {
        Ok(mut conn) => {
            let _ = tokio::time::timeout(IO_TIMEOUT, conn.quit()).await;
            Access::Granted
        }
        Err(e) => super::access_of(&e).unwrap_or(Access::Unknown { message: e.message }),
    }
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
    if let Err(e) = before.await {
        conn.abort().await;
        return Outcome::NotSent(e);
    }
    // The commit point: from the first byte of the message on, the server may deliver it.
    if let Err(stop) = ctx.commit() {
        conn.abort().await;
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
        Ok(Err(e)) if e.is_permanent() || e.is_transient() => {
            conn.abort().await;
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
