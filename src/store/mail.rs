//! The Mail send ledger (`mail_sends`): the Message-ID of every message `mail_send` started to
//! send, so that the same message is never sent twice (see `tools::mail::ledger`).

use super::{Store, StoreError, StoreResult};

/// Where a send stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MailSendState {
    /// Claimed: the connection to the server is being made or the message transmitted.
    Sending,
    /// The server accepted the message.
    Sent,
    /// The commit point passed and no reply came: the server may or may not have it.
    Unknown,
}

impl MailSendState {
    /// The stored string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sending => "sending",
            Self::Sent => "sent",
            Self::Unknown => "unknown",
        }
    }

    fn parse(s: &str) -> StoreResult<Self> {
        match s {
            "sending" => Ok(Self::Sending),
            "sent" => Ok(Self::Sent),
            "unknown" => Ok(Self::Unknown),
            other => Err(StoreError::Corrupt(format!("mail_sends.state {other:?}"))),
        }
    }
}

/// One ledger row.
#[derive(Debug, Clone)]
pub struct MailSendRow {
    /// The Message-ID (`<…@…>`).
    pub message_id: String,
    /// The invocation that claimed it.
    pub invocation_id: String,
    /// The connection it is sent through.
    pub connection_id: String,
    /// SHA-256 of the message bytes.
    pub message_sha256: String,
    /// Where it stands.
    pub state: MailSendState,
    /// The server's reply to the message (when sent).
    pub reply: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// What claiming a Message-ID found.
#[derive(Debug, Clone)]
pub enum SendClaim {
    /// The row is new: this call sends.
    Claimed,
    /// A row exists: the message was (or may have been) sent already.
    Existing(MailSendRow),
}

type Row = (String, String, String, String, String, Option<String>, String, String);

impl Store {
    /// Claims `message_id` for a send (state `sending`), or returns the existing row.
    pub async fn claim_mail_send(
        &self,
        message_id: &str,
        invocation_id: &str,
        connection_id: &str,
        message_sha256: &str,
    ) -> StoreResult<SendClaim> {
        let now = crate::ids::now();
        let done = sqlx::query(
            "INSERT INTO mail_sends (message_id, invocation_id, connection_id, message_sha256, state, reply, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, NULL, $6, $6) ON CONFLICT (message_id) DO NOTHING",
        )
        .bind(message_id)
        .bind(invocation_id)
        .bind(connection_id)
        .bind(message_sha256)
        .bind(MailSendState::Sending.as_str())
        .bind(&now)
        .execute(self.pool())
        .await?;
        if done.rows_affected() == 1 {
            return Ok(SendClaim::Claimed);
        }
        let row: Option<Row> = sqlx::query_as(
            "SELECT message_id, invocation_id, connection_id, message_sha256, state, reply, created_at, updated_at
             FROM mail_sends WHERE message_id = $1",
        )
        .bind(message_id)
        .fetch_optional(self.pool())
        .await?;
        match row {
            Some((message_id, invocation_id, connection_id, message_sha256, state, reply, created_at, updated_at)) => {
                Ok(SendClaim::Existing(MailSendRow {
                    message_id,
                    invocation_id,
                    connection_id,
                    message_sha256,
                    state: MailSendState::parse(&state)?,
                    reply,
                    created_at,
                    updated_at,
                }))
            }
            // Removed between the insert and the read (a refused send released it): claim again.
            None => Box::pin(self.claim_mail_send(message_id, invocation_id, connection_id, message_sha256)).await,
        }
    }

    /// Records how the claimed send of `message_id` ended (`sent` or `unknown`).
    pub async fn finish_mail_send(
        &self,
        message_id: &str,
        state: MailSendState,
        reply: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query("UPDATE mail_sends SET state = $1, reply = $2, updated_at = $3 WHERE message_id = $4")
            .bind(state.as_str())
            .bind(reply)
            .bind(crate::ids::now())
            .bind(message_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Releases a claim whose send certainly did not happen (refused before or at the
    /// message), so a later execution may send.
    pub async fn release_mail_send(&self, message_id: &str) -> StoreResult<()> {
        sqlx::query("DELETE FROM mail_sends WHERE message_id = $1 AND state = $2")
            .bind(message_id)
            .bind(MailSendState::Sending.as_str())
            .execute(self.pool())
            .await?;
        Ok(())
    }
}
