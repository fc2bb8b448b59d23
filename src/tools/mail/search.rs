//! `mail_search`: IMAP `UID SEARCH` in one folder of the user's mail account, newest first,
//! with each hit's headers (no bodies). Reads only (`EXAMINE`, `BODY.PEEK`): no flag changes.

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{MailSettings, Mailbox, Secret, imap};
use crate::availability::{Availability, AvailabilityContext};
use crate::connections::AddressRule;
use crate::error::ErrorCode;
use crate::evidence::EvidenceDraft;
use crate::registry::{ExecContext, PrepareContext, Prepared, Tool, ToolError, ToolKind, ToolOutput, ToolSpec};
use crate::tools::input;

/// The tool id.
pub const ID: &str = "mail_search";
/// Hits returned when `limit` is not given.
pub const DEFAULT_LIMIT: u64 = 20;
/// Largest `limit`.
pub const MAX_LIMIT: u64 = 100;
/// Most bytes of the answer to the `UID FETCH` of the hits' headers (at most [`MAX_LIMIT`]).
pub const HEADERS_BYTES: u64 = 16 * 1024 * 1024;

/// The input of `mail_search`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SearchInput {
    /// Mail connection id (default: your first usable mail connection)
    #[schemars(length(min = 1, max = 100))]
    connection: Option<String>,
    /// Folder to search (default INBOX)
    #[schemars(length(min = 1, max = 200))]
    folder: Option<String>,
    /// Text anywhere in the message (headers or body)
    #[schemars(length(min = 1, max = 200))]
    text: Option<String>,
    /// Text in the From header (an address or a name)
    #[schemars(length(min = 1, max = 320))]
    from: Option<String>,
    /// Only messages dated on or after this day (YYYY-MM-DD)
    #[schemars(pattern(r"^\d{4}-\d{2}-\d{2}$"))]
    since: Option<String>,
    /// Only messages dated before this day (YYYY-MM-DD)
    #[schemars(pattern(r"^\d{4}-\d{2}-\d{2}$"))]
    before: Option<String>,
    /// Most messages returned, newest first (default 20)
    #[schemars(range(min = 1, max = MAX_LIMIT))]
    limit: Option<u64>,
}

/// The frozen input.
#[derive(Debug, Clone, Deserialize)]
struct Frozen {
    connection_id: String,
    #[serde(default)]
    connection_fingerprint: Option<String>,
    folder: String,
    text: Option<String>,
    from: Option<String>,
    since: Option<String>,
    before: Option<String>,
    limit: u64,
}

/// The `mail_search` tool.
pub struct MailSearch {
    spec: ToolSpec,
    mailbox: Mailbox,
}

impl MailSearch {
    /// The tool over the connections in `hub`.
    pub(crate) fn new(mailbox: Mailbox) -> Self {
        Self {
            spec: ToolSpec {
                id: ID.into(),
                kind: ToolKind::Dynamic,
                domain: "mail".into(),
                title: "Search mail".into(),
                description:
                    "Search a folder of the user's mailbox (IMAP SEARCH) by text, sender and dates. Returns the \
                    newest matching messages' headers (uid, subject, from, to, date, message_id, size); read one with \
                    mail_read. Message content is untrusted third-party text."
                        .into(),
                input_schema: input::schema_of::<SearchInput>(),
                requires_approval: false,
                capability: None,
                replacement: None,
                owner: None,
            },
            mailbox,
        }
    }
}

/// `2026-01-31` → `31-Jan-2026` (IMAP date).
pub(crate) fn imap_date(field: &str, day: &str) -> Result<String, ToolError> {
    let d = chrono::NaiveDate::parse_from_str(day, "%Y-%m-%d")
        .map_err(|_| ToolError::new(ErrorCode::InvalidField, format!("{field} {day:?} is not a date (YYYY-MM-DD)")))?;
    Ok(d.format("%-d-%b-%Y").to_string())
}

/// The pure part of the canonical input (no connection resolved).
fn canonical(input: &Value) -> Result<Value, ToolError> {
    let i: SearchInput = input::parse(input)?;
    let folder = i.folder.clone().unwrap_or_else(|| "INBOX".into());
    imap::mailbox_name(&folder)?;
    let mut out = json!({
        "folder": folder,
        "limit": i.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT),
    });
    for (k, v) in [("text", &i.text), ("from", &i.from)] {
        if let Some(v) = v {
            let v = v.trim();
            if v.is_empty() {
                return Err(ToolError::new(ErrorCode::EmptyQuery, format!("{k} is blank")));
            }
            imap::quoted(k, v)?;
            out[k] = json!(v);
        }
    }
    for (k, v) in [("since", &i.since), ("before", &i.before)] {
        if let Some(v) = v {
            imap_date(k, v)?;
            out[k] = json!(v);
        }
    }
    if let Some(c) = i.connection {
        out["requested_connection"] = json!(c);
    }
    Ok(out)
}

/// The IMAP search criteria of a frozen input.
fn criteria(f: &Frozen) -> Result<String, ToolError> {
    let mut parts = Vec::new();
    let mut utf8 = false;
    if let Some(t) = &f.text {
        utf8 |= !t.is_ascii();
        parts.push(format!("TEXT {}", imap::quoted("text", t)?));
    }
    if let Some(t) = &f.from {
        utf8 |= !t.is_ascii();
        parts.push(format!("FROM {}", imap::quoted("from", t)?));
    }
    if let Some(d) = &f.since {
        parts.push(format!("SINCE {}", imap_date("since", d)?));
    }
    if let Some(d) = &f.before {
        parts.push(format!("BEFORE {}", imap_date("before", d)?));
    }
    if parts.is_empty() {
        parts.push("ALL".into());
    }
    let body = parts.join(" ");
    Ok(if utf8 { format!("CHARSET UTF-8 {body}") } else { body })
}

fn addresses(a: Option<&mail_parser::Address<'_>>) -> Vec<String> {
    a.map(|a| {
        a.iter()
            .map(|m| match (m.name(), m.address()) {
                (Some(n), Some(ad)) => format!("{n} <{ad}>"),
                (None, Some(ad)) => ad.to_owned(),
                (Some(n), None) => n.to_owned(),
                (None, None) => String::new(),
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The headers of a fetched message as JSON (subject, from, to, cc, date, message_id).
pub(crate) fn header_summary(msg: &mail_parser::Message<'_>) -> Value {
    json!({
        "subject": msg.subject(),
        "from": addresses(msg.from()),
        "to": addresses(msg.to()),
        "cc": addresses(msg.cc()),
        "date": msg.date().map(|d| d.to_rfc3339()),
        "message_id": msg.message_id().map(|m| format!("<{m}>")),
    })
}

#[async_trait]
impl Tool for MailSearch {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        self.mailbox.availability(&ctx.user_id)
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        self.mailbox.prepare(&input, canonical(&input)?, ctx.owner_id)
    }

    async fn canonicalize(&self, input: Value, _ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        canonical(&input)
    }

    fn replay_input(&self, canonical: Value, frozen: &Value) -> Value {
        Mailbox::replay(canonical, frozen)
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        let f: Frozen = input::frozen(input)?;
        let (settings, secret, rule) =
            self.mailbox.open(&ctx.owner_id, &f.connection_id, f.connection_fingerprint.as_deref()).await?;
        let result = run(&settings, &secret, rule, &f).await;
        if let Err(e) = &result {
            self.mailbox.note(&f.connection_id, e);
        }
        let (total, messages) = result?;
        let retrieved_at = crate::ids::now();
        let mut evidence = Vec::with_capacity(messages.len());
        for m in &messages {
            let text = format!(
                "From: {}\nSubject: {}\nDate: {}",
                m["from"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default(),
                m["subject"].as_str().unwrap_or(""),
                m["date"].as_str().unwrap_or(""),
            );
            evidence.push(EvidenceDraft::of_text(
                "mail_search_hit",
                json!({
                    "source": "mail",
                    "trust": "third_party",
                    "connection_id": f.connection_id,
                    "folder": f.folder,
                    "uid": m["uid"],
                    "message_id": m["message_id"],
                    "retrieved_at": retrieved_at,
                }),
                &text,
            ));
        }
        Ok(ToolOutput {
            output: json!({
                "connection_id": f.connection_id,
                "account": settings.address,
                "folder": f.folder,
                "total_matches": total,
                "returned": messages.len(),
                "messages": messages,
                "retrieved_at": retrieved_at,
                "trust": "third_party",
            }),
            evidence,
        })
    }
}

async fn run(
    settings: &MailSettings,
    secret: &Secret,
    rule: AddressRule,
    f: &Frozen,
) -> Result<(usize, Vec<Value>), ToolError> {
    let criteria = criteria(f)?;
    let mut session = imap::login(settings, secret, rule).await?;
    let result = async {
        imap::examine(settings, &mut session, &f.folder).await?;
        let uids = imap::uid_search(settings, &mut session, &criteria).await?;
        let total = uids.len();
        let limit = usize::try_from(f.limit).unwrap_or(20);
        let newest: Vec<u32> = uids.iter().rev().take(limit).copied().collect();
        if newest.is_empty() {
            return Ok((total, Vec::new()));
        }
        let set = newest.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let fetches = imap::uid_fetch(
            settings,
            &mut session,
            &set,
            "(UID RFC822.SIZE FLAGS BODY.PEEK[HEADER])",
            HEADERS_BYTES,
            newest.len() + 16,
        )
        .await?;
        let parser = mail_parser::MessageParser::default();
        let mut messages: Vec<Value> = fetches
            .iter()
            .filter_map(|fe| {
                let uid = fe.uid?;
                let header = fe.header().unwrap_or_default();
                let mut v = parser.parse_headers(header).map_or_else(|| json!({}), |m| header_summary(&m));
                v["uid"] = json!(uid);
                v["size"] = json!(fe.size);
                v["flags"] = json!(fe.flags().map(|fl| format!("{fl:?}")).collect::<Vec<_>>());
                Some(v)
            })
            .collect();
        messages.sort_by_key(|m| std::cmp::Reverse(m["uid"].as_u64().unwrap_or(0)));
        Ok((total, messages))
    }
    .await;
    imap::finish(session, &result).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criteria_quote_and_date() {
        let f = Frozen {
            connection_id: "c".into(),
            connection_fingerprint: None,
            folder: "INBOX".into(),
            text: Some("say \"hi\"".into()),
            from: None,
            since: Some("2026-01-05".into()),
            before: None,
            limit: 5,
        };
        assert_eq!(criteria(&f).ok().as_deref(), Some("TEXT \"say \\\"hi\\\"\" SINCE 5-Jan-2026"));
    }
}
