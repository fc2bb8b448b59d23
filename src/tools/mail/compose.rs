//! Building the exact RFC 5322 message `mail_send` freezes, and refusing bad input before
//! anything is stored: malformed addresses (`invalid_address`), CR/LF or other control
//! characters in a header field (`header_injection`), attachments over the limit
//! (`attachment_too_large`, judged by the base64 length before decoding).
//!
//! The message is built with lettre's builder with every varying part fixed by the caller:
//! the Message-ID and Date (generated once, in `prepare`), and the MIME boundary (derived
//! from the Message-ID), so the bytes are a function of the frozen fields. The result is
//! 7-bit ASCII (lettre encodes non-ASCII header text as RFC 2047 words and bodies as
//! quoted-printable or base64), so it is frozen as a JSON string byte for byte.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use lettre::message::header::{ContentTransferEncoding, ContentType};
use lettre::message::{Attachment, Body, Mailbox, MultiPart, SinglePart};
use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;
use crate::evidence::sha256_hex;
use crate::registry::ToolError;

/// Most recipients (To, Cc and Bcc together).
pub const MAX_RECIPIENTS: usize = 50;
/// Longest subject, in characters.
pub const MAX_SUBJECT_CHARS: usize = 998;
/// Largest body text, in bytes of UTF-8.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Most attachments of one message.
pub const MAX_ATTACHMENTS: usize = 10;
/// Largest attachment, and largest sum of a message's attachments, in decoded bytes (5 MiB:
/// with base64 and the rest of the call it stays under the default 8 MiB request body limit).
pub const MAX_ATTACHMENT_BYTES: usize = 5 * 1024 * 1024;
/// Longest attachment file name, in bytes.
pub const MAX_FILENAME_BYTES: usize = 255;
/// Most `references` entries.
pub const MAX_REFERENCES: usize = 50;

/// An attachment as the caller gives it.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachmentInput {
    /// File name shown to the recipient (no control characters, at most 255 bytes)
    pub filename: String,
    /// MIME type, e.g. application/pdf (default application/octet-stream)
    pub content_type: Option<String>,
    /// The file's bytes, base64 (standard alphabet, padded); at most 5 MiB decoded, all attachments together too
    pub content_base64: String,
}

/// What the approval shows of an attachment (its bytes are in the frozen message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentFacts {
    /// File name.
    pub filename: String,
    /// MIME type.
    pub content_type: String,
    /// Decoded size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the decoded bytes.
    pub sha256: String,
}

/// The validated, canonical request of a `mail_send` call: everything of the caller's input
/// that decides the message, with the body and the attachments' bytes by hash. A pure
/// function of the input (no clock, no server), so a retried call compares equal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// `To` mailboxes as given (`Name <a@b>` or `a@b`), trimmed.
    pub to: Vec<String>,
    /// `Cc` mailboxes.
    pub cc: Vec<String>,
    /// `Bcc` mailboxes (envelope only; no header).
    pub bcc: Vec<String>,
    /// Subject.
    pub subject: String,
    /// SHA-256 of the body text.
    pub body_sha256: String,
    /// `In-Reply-To` (a reply), `<id@host>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<String>,
    /// `References`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<String>,
    /// Attachments by hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<AttachmentFacts>,
}

/// A validated request with the decoded attachment bytes, ready to build.
pub struct Validated {
    /// The canonical request.
    pub request: Request,
    /// The body text.
    pub body: String,
    /// Decoded attachments, in order.
    pub attachment_bytes: Vec<Vec<u8>>,
}

/// The raw send fields (from the tool input).
pub struct Fields<'a> {
    /// To.
    pub to: &'a [String],
    /// Cc.
    pub cc: &'a [String],
    /// Bcc.
    pub bcc: &'a [String],
    /// Subject.
    pub subject: &'a str,
    /// Body.
    pub body: &'a str,
    /// In-Reply-To.
    pub in_reply_to: Option<&'a str>,
    /// References.
    pub references: &'a [String],
    /// Attachments.
    pub attachments: &'a [AttachmentInput],
}

fn err(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError::new(code, message)
}

/// Refuses CR, LF and every other control character (tab included) in a header field (400
/// `header_injection`), and invisible characters that change how it reads (400
/// `invalid_field`): bidirectional controls (an attachment `invoice\u{202E}fdp.exe` reads
/// `invoiceexe.pdf` in the approval and to the recipient), zero-width spaces and joiners other
/// than U+200D (which emoji sequences use), word joiners, the byte-order mark, the soft hyphen
/// — and `=?` (an RFC 2047 encoded word, decoded by the reader's client into any of those).
pub fn no_controls(field: &str, value: &str) -> Result<(), ToolError> {
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return Err(err(
            ErrorCode::HeaderInjection,
            format!("{field} contains the control character U+{:04X}; header fields cannot contain CR, LF or other control characters", c as u32),
        )
        .with_details(serde_json::json!({"field": field})));
    }
    let invisible = |c: &char| {
        matches!(
            c,
            '\u{00AD}'
                | '\u{061C}'
                | '\u{180E}'
                | '\u{200B}'
                | '\u{200C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
    };
    // An RFC 2047 encoded-word is sent as it is (lettre leaves ASCII words alone) and decoded
    // by the recipient's client: what the approval showed would not be what is read.
    if value.contains("=?") {
        return Err(err(
            ErrorCode::InvalidField,
            format!("{field} contains \"=?\", the start of an encoded word, which mail clients decode; write the text itself"),
        )
        .with_details(serde_json::json!({"field": field})));
    }
    if let Some(c) = value.chars().find(invisible) {
        return Err(err(
            ErrorCode::InvalidField,
            format!(
                "{field} contains the invisible character U+{:04X}, which changes how it reads; remove it",
                c as u32
            ),
        )
        .with_details(serde_json::json!({"field": field})));
    }
    Ok(())
}

/// Parses a bare address (`local@domain`, ASCII): returns it as given (trimmed).
pub fn parse_address(field: &str, raw: &str) -> Result<String, ToolError> {
    no_controls(field, raw)?;
    let addr = lettre::Address::from_str(raw)
        .map_err(|e| err(ErrorCode::InvalidAddress, format!("{field} {raw:?} is not a mail address: {e}")))?;
    if !raw.is_ascii() {
        return Err(err(ErrorCode::InvalidAddress, format!("{field} {raw:?}: only ASCII addresses are supported")));
    }
    Ok(addr.to_string())
}

/// Parses a mailbox (`Name <local@domain>` or `local@domain`; ASCII address, any name).
pub fn parse_mailbox(field: &str, raw: &str) -> Result<Mailbox, ToolError> {
    no_controls(field, raw)?;
    let mbox = Mailbox::from_str(raw.trim())
        .map_err(|e| err(ErrorCode::InvalidAddress, format!("{field} {raw:?} is not a mail address: {e}")))?;
    if !mbox.email.to_string().is_ascii() {
        return Err(err(ErrorCode::InvalidAddress, format!("{field} {raw:?}: only ASCII addresses are supported")));
    }
    Ok(mbox)
}

/// Checks a Message-ID (`<left@right>`, printable ASCII without spaces or angle brackets
/// inside).
pub fn parse_message_id(field: &str, raw: &str) -> Result<String, ToolError> {
    no_controls(field, raw)?;
    let raw = raw.trim();
    let inner = raw.strip_prefix('<').and_then(|r| r.strip_suffix('>'));
    let ok = inner.is_some_and(|i| {
        i.len() <= 250
            && i.split_once('@').is_some_and(|(l, r)| !l.is_empty() && !r.is_empty())
            && i.bytes().all(|b| b.is_ascii_graphic() && b != b'<' && b != b'>')
    });
    if ok {
        Ok(raw.to_owned())
    } else {
        Err(err(ErrorCode::InvalidField, format!("{field} {raw:?} is not a Message-ID (<left@right>)")))
    }
}

/// Decoded size of `b64` (standard, padded), from its length alone.
fn decoded_len(b64: &str) -> usize {
    let trimmed = b64.trim_end_matches('=');
    trimmed.len() / 4 * 3 + (trimmed.len() % 4).saturating_sub(1)
}

fn check_list(field: &str, list: &[String]) -> Result<Vec<String>, ToolError> {
    let mut out = Vec::with_capacity(list.len());
    for (i, raw) in list.iter().enumerate() {
        let name = format!("{field}[{i}]");
        parse_mailbox(&name, raw)?;
        out.push(raw.trim().to_owned());
    }
    Ok(out)
}

/// Validates the caller's fields in order of cost: sizes and header fields first, then
/// addresses, then (only when every size is within the limits) the attachments' base64.
pub fn validate(f: &Fields<'_>) -> Result<Validated, ToolError> {
    // Sizes first: a huge attachment is refused by its length before anything is decoded.
    if f.attachments.len() > MAX_ATTACHMENTS {
        return Err(err(ErrorCode::InvalidField, format!("at most {MAX_ATTACHMENTS} attachments")));
    }
    let mut total = 0usize;
    for (i, a) in f.attachments.iter().enumerate() {
        let size = decoded_len(&a.content_base64);
        if size > MAX_ATTACHMENT_BYTES {
            return Err(err(
                ErrorCode::AttachmentTooLarge,
                format!(
                    "attachments[{i}] ({}) is {size} bytes; the limit is {MAX_ATTACHMENT_BYTES} bytes",
                    a.filename.chars().take(80).collect::<String>()
                ),
            )
            .with_details(serde_json::json!({"index": i, "size": size, "limit": MAX_ATTACHMENT_BYTES})));
        }
        total = total.saturating_add(size);
    }
    if total > MAX_ATTACHMENT_BYTES {
        return Err(err(
            ErrorCode::AttachmentTooLarge,
            format!("the attachments together are {total} bytes; the limit is {MAX_ATTACHMENT_BYTES} bytes"),
        )
        .with_details(serde_json::json!({"size": total, "limit": MAX_ATTACHMENT_BYTES})));
    }
    if f.body.len() > MAX_BODY_BYTES {
        return Err(err(
            ErrorCode::InvalidField,
            format!("body is {} bytes; the limit is {MAX_BODY_BYTES}", f.body.len()),
        ));
    }
    if f.body.contains('\0') {
        return Err(err(ErrorCode::NulByte, "body contains NUL"));
    }
    no_controls("subject", f.subject)?;
    if f.subject.chars().count() > MAX_SUBJECT_CHARS {
        return Err(err(ErrorCode::InvalidField, format!("subject is longer than {MAX_SUBJECT_CHARS} characters")));
    }
    let to = check_list("to", f.to)?;
    let cc = check_list("cc", f.cc)?;
    let bcc = check_list("bcc", f.bcc)?;
    if to.is_empty() {
        return Err(err(ErrorCode::MissingField, "to needs at least one recipient"));
    }
    if to.len() + cc.len() + bcc.len() > MAX_RECIPIENTS {
        return Err(err(
            ErrorCode::InvalidField,
            format!("at most {MAX_RECIPIENTS} recipients (to, cc and bcc together)"),
        ));
    }
    let in_reply_to = f.in_reply_to.map(|m| parse_message_id("in_reply_to", m)).transpose()?;
    if f.references.len() > MAX_REFERENCES {
        return Err(err(ErrorCode::InvalidField, format!("at most {MAX_REFERENCES} references")));
    }
    let references = f
        .references
        .iter()
        .enumerate()
        .map(|(i, r)| parse_message_id(&format!("references[{i}]"), r))
        .collect::<Result<Vec<_>, _>>()?;
    let mut facts = Vec::with_capacity(f.attachments.len());
    let mut bytes = Vec::with_capacity(f.attachments.len());
    for (i, a) in f.attachments.iter().enumerate() {
        let field = format!("attachments[{i}].filename");
        no_controls(&field, &a.filename)?;
        if a.filename.trim().is_empty() || a.filename.len() > MAX_FILENAME_BYTES {
            return Err(err(ErrorCode::InvalidField, format!("{field} must be 1–{MAX_FILENAME_BYTES} bytes")));
        }
        let content_type = a.content_type.as_deref().unwrap_or("application/octet-stream").trim().to_owned();
        no_controls(&format!("attachments[{i}].content_type"), &content_type)?;
        ContentType::parse(&content_type).map_err(|_| {
            err(ErrorCode::InvalidField, format!("attachments[{i}].content_type {content_type:?} is not a MIME type"))
        })?;
        let data = base64::engine::general_purpose::STANDARD
            .decode(a.content_base64.as_bytes())
            .map_err(|e| err(ErrorCode::InvalidField, format!("attachments[{i}].content_base64 is not base64: {e}")))?;
        facts.push(AttachmentFacts {
            filename: a.filename.clone(),
            content_type,
            size: data.len() as u64,
            sha256: sha256_hex(&data),
        });
        bytes.push(data);
    }
    Ok(Validated {
        request: Request {
            to,
            cc,
            bcc,
            subject: f.subject.to_owned(),
            body_sha256: sha256_hex(f.body.as_bytes()),
            in_reply_to,
            references,
            attachments: facts,
        },
        body: f.body.to_owned(),
        attachment_bytes: bytes,
    })
}

/// A new Message-ID for a message from `from` (`<uuid@domain-of-from>`).
pub fn new_message_id(from: &str) -> String {
    let domain = from.rsplit_once('@').map_or("localhost", |(_, d)| d);
    format!("<{}.{}@{domain}>", uuid::Uuid::now_v7().simple(), uuid::Uuid::now_v7().simple())
}

/// The built message.
pub struct Built {
    /// The exact bytes (ASCII, CRLF line ends).
    pub message: String,
    /// Envelope recipients (To, Cc, Bcc; each address once, in order).
    pub recipients: Vec<String>,
}

/// Builds the message from `v`, sent by `from` (the connection's address), with the given
/// Message-ID and Date (seconds since the Unix epoch).
pub fn build(v: &Validated, from: &str, message_id: &str, date_unix: u64) -> Result<Built, ToolError> {
    let internal =
        |what: &str, e: &dyn std::fmt::Display| err(ErrorCode::Internal, format!("building the message ({what}): {e}"));
    let from_mbox = parse_mailbox("from", from)?;
    let mut builder = lettre::Message::builder()
        .from(from_mbox.clone())
        .message_id(Some(message_id.to_owned()))
        .date(UNIX_EPOCH + Duration::from_secs(date_unix))
        .subject(v.request.subject.clone());
    let mut recipients: Vec<String> = Vec::new();
    let mut add = |m: &Mailbox| {
        let a = m.email.to_string();
        if !recipients.iter().any(|r| r.eq_ignore_ascii_case(&a)) {
            recipients.push(a);
        }
    };
    for (field, list) in [("to", &v.request.to), ("cc", &v.request.cc), ("bcc", &v.request.bcc)] {
        for raw in list {
            let m = parse_mailbox(field, raw)?;
            add(&m);
            builder = match field {
                "to" => builder.to(m),
                "cc" => builder.cc(m),
                _ => builder.bcc(m),
            };
        }
    }
    if let Some(id) = &v.request.in_reply_to {
        builder = builder.in_reply_to(id.clone());
    }
    if !v.request.references.is_empty() {
        builder = builder.references(v.request.references.join(" "));
    }
    let envelope = lettre::address::Envelope::new(
        Some(from_mbox.email.clone()),
        recipients
            .iter()
            .map(|r| lettre::Address::from_str(r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| internal("envelope", &e))?,
    )
    .map_err(|e| internal("envelope", &e))?;
    builder = builder.envelope(envelope);
    let text = SinglePart::plain(v.body.clone());
    let message = if v.attachment_bytes.is_empty() {
        builder.singlepart(text)
    } else {
        let boundary = format!("mira-{}", &sha256_hex(message_id.as_bytes())[..40]);
        let mut mixed = MultiPart::mixed().boundary(boundary).singlepart(text);
        for (facts, data) in v.request.attachments.iter().zip(&v.attachment_bytes) {
            let ct = ContentType::parse(&facts.content_type).map_err(|e| internal("content type", &e))?;
            // Always base64: an attachment's bytes (NUL, bare LF…) must survive transport as they are.
            let body = Body::new_with_encoding(data.clone(), ContentTransferEncoding::Base64)
                .map_err(|_| err(ErrorCode::Internal, "building the message: base64 refused"))?;
            mixed = mixed.singlepart(Attachment::new(facts.filename.clone()).body(body, ct));
        }
        builder.multipart(mixed)
    }
    .map_err(|e| internal("message", &e))?;
    let bytes = message.formatted();
    let message = String::from_utf8(bytes).map_err(|e| internal("utf-8", &e))?;
    // RFC 5322 on the wire: 7-bit, no NUL, every line ended by CRLF.
    let bytes = message.as_bytes();
    let bare = bytes.iter().enumerate().any(|(i, &b)| {
        b == 0 || (b == b'\n' && (i == 0 || bytes[i - 1] != b'\r')) || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n'))
    });
    if !message.is_ascii() || bare {
        return Err(err(ErrorCode::Internal, "the built message is not 7-bit text with CRLF line ends"));
    }
    Ok(Built { message, recipients })
}

/// Now, in whole seconds since the Unix epoch.
pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(to: &'a [String], subject: &'a str, attachments: &'a [AttachmentInput]) -> Fields<'a> {
        Fields {
            to,
            cc: &[],
            bcc: &[],
            subject,
            body: "hello\n.\nbye",
            in_reply_to: None,
            references: &[],
            attachments,
        }
    }

    #[test]
    fn header_injection_and_bad_addresses_are_refused() {
        let to = vec!["bob@example.test".to_owned()];
        let e = validate(&fields(&to, "hi\r\nBcc: eve@evil.test", &[])).err().map(|e| e.code);
        assert_eq!(e, Some(ErrorCode::HeaderInjection));
        let to = vec!["bob@example.test\r\nBcc: eve@evil.test".to_owned()];
        assert_eq!(validate(&fields(&to, "hi", &[])).err().map(|e| e.code), Some(ErrorCode::HeaderInjection));
        let to = vec!["not an address".to_owned()];
        assert_eq!(validate(&fields(&to, "hi", &[])).err().map(|e| e.code), Some(ErrorCode::InvalidAddress));
    }

    /// An attachment named `invoice<RLO>fdp.exe` reads `invoiceexe.pdf`; a subject with a
    /// zero-width space hides a word: refused. An emoji sequence (U+200D) is kept.
    #[test]
    fn invisible_characters_that_change_a_header_are_refused() {
        let to = vec!["bob@example.test".to_owned()];
        let att = |name: &str| {
            vec![AttachmentInput {
                filename: name.into(),
                content_type: Some("application/octet-stream".into()),
                content_base64: base64::engine::general_purpose::STANDARD.encode(b"x"),
            }]
        };
        let code =
            |subject: &str, atts: &[AttachmentInput]| validate(&fields(&to, subject, atts)).err().map(|e| e.code);
        assert_eq!(code("hi", &att("invoice\u{202E}fdp.exe")), Some(ErrorCode::InvalidField));
        assert_eq!(code("pay\u{200B}ment", &[]), Some(ErrorCode::InvalidField));
        assert_eq!(code("=?utf-8?b?aW52b2ljZeKArmZkcC5leGU=?=", &[]), Some(ErrorCode::InvalidField));
        assert_eq!(code("family \u{1F468}\u{200D}\u{1F469}\u{200D}\u{1F467}", &att("a.txt")), None);
    }

    #[test]
    fn same_fields_build_the_same_bytes() {
        let to = vec!["Bob <bob@example.test>".to_owned()];
        let att = vec![AttachmentInput {
            filename: "a.txt".into(),
            content_type: Some("text/plain".into()),
            content_base64: base64::engine::general_purpose::STANDARD.encode(b"attached"),
        }];
        let v = validate(&fields(&to, "Grüße", &att)).expect("valid");
        let a = build(&v, "alice@example.test", "<x@example.test>", 1_700_000_000).expect("built");
        let b = build(&v, "alice@example.test", "<x@example.test>", 1_700_000_000).expect("built");
        assert_eq!(a.message, b.message);
        assert!(a.message.contains("Message-ID: <x@example.test>\r\n"), "{}", a.message);
        assert_eq!(a.recipients, vec!["bob@example.test".to_owned()]);
        assert_eq!(decoded_len(&att[0].content_base64), 8);
        assert!(a.message.contains("Content-Transfer-Encoding: base64"), "{}", a.message);
    }
}
