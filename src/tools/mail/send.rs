//! `mail_send`: a new message or a reply (`in_reply_to`, `references`) from the connection's
//! address, over SMTP. Every call waits for an exact approval.
//!
//! `prepare` validates everything (addresses, header fields, sizes: `invalid_address`,
//! `header_injection`, `attachment_too_large` — before anything is stored), resolves the
//! connection, generates the Message-ID and fixes the Date, and builds the exact RFC 5322
//! message. The canonical input holds those bytes (`message`) with their SHA-256, the envelope
//! and the request by hash, so the input hash an approval names covers the exact bytes; the
//! preview renders the message for the approver. A retried freeze of the same call (same
//! `tool_call_id`, same input) compares the caller's request only and keeps the frozen
//! message, Message-ID and Date ([`Tool::replay_input`]).
//!
//! `execute` checks the bytes against their hash, claims the Message-ID in the store's send
//! ledger (`mail_sends`) and sends exactly those bytes once ([`smtp::send`], commit point right
//! before the first byte). A second execution of the same message never sends: the ledger
//! answers `sent` (the first result again, `already_sent: true`) or, when the first outcome is
//! not known, `outcome_unknown`. An ambiguous SMTP end (connection lost after the data) is
//! `outcome_unknown` and is never retried automatically.

use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::compose::{self, AttachmentInput, Request};
use super::{MailSettings, SEND, Secret, smtp};
use crate::availability::{Availability, AvailabilityContext};
use crate::connections::{ConnectionHub, ConnectionKind, FINGERPRINT_KEY};
use crate::error::ErrorCode;
use crate::evidence::{EvidenceDraft, sha256_hex};
use crate::harness::SideEffects;
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::store::{MailSendState, SendClaim, Store};
use crate::tools::input;

/// The tool id.
pub const ID: &str = "mail_send";
/// Most bytes of the message (and of the body) the approval preview shows.
pub const PREVIEW_BYTES: usize = 64 * 1024;

/// The input of `mail_send`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SendInput {
    /// Mail connection id (default: your first usable mail connection); the message is sent from its address
    #[schemars(length(min = 1, max = 100))]
    connection: Option<String>,
    /// Recipients: "Name <a@example.com>" or "a@example.com"
    #[schemars(length(min = 1, max = 50), inner(length(min = 1, max = 400)))]
    to: Vec<String>,
    /// Copy recipients
    #[schemars(length(max = 50), inner(length(min = 1, max = 400)))]
    cc: Option<Vec<String>>,
    /// Blind copy recipients (not shown in the message)
    #[schemars(length(max = 50), inner(length(min = 1, max = 400)))]
    bcc: Option<Vec<String>>,
    /// Subject line
    #[schemars(length(max = 998))]
    subject: String,
    /// Plain-text body
    body: String,
    /// For a reply: the Message-ID of the message replied to, e.g. <abc@example.com> (mail_read's message_id)
    #[schemars(length(min = 3, max = 256))]
    in_reply_to: Option<String>,
    /// For a reply: the thread's Message-IDs (mail_read's references plus its message_id)
    #[schemars(length(max = 50), inner(length(min = 3, max = 256)))]
    references: Option<Vec<String>>,
    /// Files to attach (at most 10, 5 MiB together)
    #[schemars(length(max = 10))]
    attachments: Option<Vec<AttachmentInput>>,
}

/// The frozen input.
#[derive(Debug, Clone, Deserialize)]
struct Frozen {
    connection_id: String,
    #[serde(default)]
    connection_fingerprint: Option<String>,
    from: String,
    recipients: Vec<String>,
    message_id: String,
    message: String,
    message_sha256: String,
}

/// The `mail_send` tool.
pub struct MailSend {
    spec: ToolSpec,
    hub: Arc<ConnectionHub>,
    store: Store,
}

impl MailSend {
    /// The tool over the connections in `hub`, with its send ledger in `store`.
    pub fn new(hub: Arc<ConnectionHub>, store: Store) -> Self {
        Self {
            spec: ToolSpec {
                id: ID.into(),
                kind: ToolKind::Dynamic,
                domain: "mail".into(),
                title: "Send mail".into(),
                description:
                    "Send a plain-text mail message (or a reply: give in_reply_to and references from mail_read) \
                    from the user's mail account, with optional attachments (base64, at most 5 MiB together). The user \
                    approves the exact message before it is sent; it is sent once."
                        .into(),
                input_schema: input::schema_of::<SendInput>(),
                requires_approval: true,
                capability: None,
                replacement: None,
                owner: None,
            },
            hub,
            store,
        }
    }
}

/// The validated request and the pure part of the canonical input.
fn validated(input: &Value) -> Result<(compose::Validated, Value), ToolError> {
    let i: SendInput = input::parse(input)?;
    let (cc, bcc, refs, atts) = (
        i.cc.unwrap_or_default(),
        i.bcc.unwrap_or_default(),
        i.references.unwrap_or_default(),
        i.attachments.unwrap_or_default(),
    );
    let v = compose::validate(&compose::Fields {
        to: &i.to,
        cc: &cc,
        bcc: &bcc,
        subject: &i.subject,
        body: &i.body,
        in_reply_to: i.in_reply_to.as_deref(),
        references: &refs,
        attachments: &atts,
    })?;
    let mut pure = json!({"request": v.request});
    if let Some(c) = i.connection {
        pure["requested_connection"] = json!(c);
    }
    Ok((v, pure))
}

fn cut_bytes(s: &str, max: usize) -> (String, bool) {
    if s.len() <= max { (s.to_owned(), false) } else { (crate::evidence::excerpt(s, max), true) }
}

#[async_trait]
impl Tool for MailSend {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        self.hub.availability(&ctx.user_id, ConnectionKind::Mail, SEND)
    }

    fn side_effects(&self) -> SideEffects {
        SideEffects::AtCommitPoint
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let (v, mut canonical) = validated(&input)?;
        let requested = super::requested_connection(&input);
        let resolved = self.hub.resolve(ctx.owner_id, ConnectionKind::Mail, SEND, requested.as_deref())?;
        let id = resolved.id;
        let settings = MailSettings::of(&self.hub.open(ctx.owner_id, &id, ConnectionKind::Mail, SEND)?)?;
        let from = settings.address.clone();
        let message_id = compose::new_message_id(&from);
        let date = compose::now_unix();
        let built = compose::build(&v, &from, &message_id, date)?;
        let sha = sha256_hex(built.message.as_bytes());
        let date_rfc3339 = chrono::DateTime::from_timestamp(i64::try_from(date).unwrap_or(0), 0)
            .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
            .unwrap_or_default();
        let o = canonical.as_object_mut().ok_or_else(|| ToolError::new(ErrorCode::Internal, "canonical input"))?;
        o.insert("connection_id".into(), json!(id));
        o.insert(FINGERPRINT_KEY.into(), json!(resolved.fingerprint));
        o.insert("from".into(), json!(from));
        o.insert("recipients".into(), json!(built.recipients));
        o.insert("message_id".into(), json!(message_id));
        o.insert("date".into(), json!(date_rfc3339));
        o.insert("message_sha256".into(), json!(sha));
        o.insert("message_size".into(), json!(built.message.len()));
        o.insert("message".into(), json!(built.message));
        let (body, body_cut) = cut_bytes(&v.body, PREVIEW_BYTES);
        let (message, message_cut) = cut_bytes(&built.message, PREVIEW_BYTES);
        let preview = json!({
            "kind": "mail_message",
            "connection_id": id,
            "from": from,
            "to": v.request.to,
            "cc": v.request.cc,
            "bcc": v.request.bcc,
            "recipients": built.recipients,
            "subject": v.request.subject,
            "message_id": message_id,
            "date": date_rfc3339,
            "in_reply_to": v.request.in_reply_to,
            "references": v.request.references,
            "body": body,
            "body_truncated": body_cut,
            "attachments": v.request.attachments,
            "message_sha256": sha,
            "message_size": built.message.len(),
            "message": message,
            "message_truncated": message_cut,
        });
        Ok(Prepared { input: canonical, preview })
    }

    async fn canonicalize(&self, input: Value, _ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        Ok(validated(&input)?.1)
    }

    fn replay_input(&self, canonical: Value, frozen: &Value) -> Value {
        let same_request = frozen.get("request").is_some()
            && frozen.get("request") == canonical.get("request")
            && frozen.get("requested_connection") == canonical.get("requested_connection");
        if same_request { frozen.clone() } else { canonical }
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let f: Frozen = input::frozen(input)?;
        let request: Request = input::frozen(input.get("request").unwrap_or(&Value::Null))?;
        if sha256_hex(f.message.as_bytes()) != f.message_sha256 || !f.message.is_ascii() {
            return Err(ToolError::new(ErrorCode::CorruptInput, "the frozen message does not match its SHA-256"));
        }
        let conn = self
            .hub
            .open_frozen_current(
                &ctx.owner_id,
                &f.connection_id,
                f.connection_fingerprint.as_deref(),
                ConnectionKind::Mail,
                SEND,
            )
            .await?;
        let settings = MailSettings::of(&conn)?;
        let secret = Secret::of(&conn)?;
        if !settings.address.eq_ignore_ascii_case(&f.from) {
            return Err(ToolError::new(
                ErrorCode::StaleTarget,
                format!(
                    "connection {} now sends as {}, not {} as approved; nothing was sent",
                    f.connection_id, settings.address, f.from
                ),
            ));
        }
        let store_err = |e: crate::store::StoreError| {
            ToolError::new(
                ErrorCode::StoreError,
                format!("the send ledger cannot be read or written: {e}; nothing was sent"),
            )
        };
        match self
            .store
            .claim_mail_send(&f.message_id, &ctx.invocation_id, &f.connection_id, &f.message_sha256)
            .await
            .map_err(store_err)?
        {
            SendClaim::Claimed => {}
            SendClaim::Existing(row) if row.state == MailSendState::Sent => {
                return Ok(output(&f, &request, row.reply.as_deref().unwrap_or(""), &row.updated_at, true));
            }
            SendClaim::Existing(row) => {
                return Err(ToolError::new(
                    ErrorCode::OutcomeUnknown,
                    format!(
                        "message {} was already handed to the SMTP server by invocation {} and its outcome is not known; it is not sent again",
                        f.message_id, row.invocation_id
                    ),
                )
                .with_details(json!({"message_id": f.message_id, "first_invocation_id": row.invocation_id})));
            }
        }
        let message_id = f.message_id.as_str();
        let release = |e: ToolError| async move {
            if let Err(se) = self.store.release_mail_send(message_id).await {
                tracing::warn!(error = %se, "releasing a mail send claim failed; a later execution will report outcome_unknown");
            }
            e
        };
        let session = match smtp::login(&settings, &secret, conn.address_rule).await {
            Ok(s) => s,
            Err(e) => {
                if let Some(access) = super::access_of(&e) {
                    self.hub.note_access(&f.connection_id, SEND, access);
                }
                return Err(release(e).await);
            }
        };
        match smtp::send(session, &f.from, &f.recipients, f.message.as_bytes(), ctx).await {
            smtp::Outcome::Sent { reply } => {
                if let Err(e) = self.store.finish_mail_send(&f.message_id, MailSendState::Sent, Some(&reply)).await {
                    tracing::warn!(error = %e, "recording a sent mail in the ledger failed; it stays `sending` (never sent again)");
                }
                Ok(output(&f, &request, &reply, &crate::ids::now(), false))
            }
            smtp::Outcome::NotSent(e) => Err(release(e).await),
            smtp::Outcome::Unknown(e) => {
                if let Err(se) = self.store.finish_mail_send(&f.message_id, MailSendState::Unknown, None).await {
                    tracing::warn!(error = %se, "recording an unknown mail outcome failed; it stays `sending` (never sent again)");
                }
                Err(e.with_details(json!({"message_id": f.message_id, "message_sha256": f.message_sha256})))
            }
        }
    }
}

fn output(f: &Frozen, request: &Request, reply: &str, sent_at: &str, already_sent: bool) -> ToolOutput {
    let provenance = json!({
        "source": "mail",
        "connection_id": f.connection_id,
        "from": f.from,
        "recipients": f.recipients,
        "subject": request.subject,
        "message_id": f.message_id,
        "message_sha256": f.message_sha256,
        "smtp_reply": reply,
        "sent_at": sent_at,
    });
    ToolOutput {
        output: json!({
            "sent": true,
            "already_sent": already_sent,
            "connection_id": f.connection_id,
            "from": f.from,
            "recipients": f.recipients,
            "message_id": f.message_id,
            "message_sha256": f.message_sha256,
            "message_size": f.message.len(),
            "smtp_reply": reply,
            "sent_at": sent_at,
        }),
        evidence: vec![EvidenceDraft::of_text("mail_sent", provenance, &f.message)],
    }
}
