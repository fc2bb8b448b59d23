//! One fetched feed document → the items to store, with `feed-rs` (RSS 0.9x/1.0/2.0, Atom,
//! JSON Feed).
//!
//! - Encoding: feed-rs decodes the encoding an XML declaration names. A document without a
//!   declaration whose HTTP `Content-Type` names another charset is transcoded to UTF-8
//!   first (WHATWG encoding labels, `encoding_rs`).
//! - Identity: the entry's own id (RSS `guid`, Atom `id`, JSON Feed `id`) when it has one —
//!   feed-rs's synthetic ids are switched off so a missing one is seen as missing — else
//!   the canonical URL of its page, else a hash of its title. Entries without any of these
//!   are skipped; a key seen twice in one document keeps its first entry.
//! - Text: titles, summaries and content become plain text (HTML stripped), capped at
//!   [`MAX_TITLE_BYTES`], [`MAX_SUMMARY_BYTES`] and [`MAX_CONTENT_BYTES`].
//! - Cap: at most `max_items` entries are taken, in document order (feeds list newest first).

use serde_json::json;

use crate::store::NewNewsItem;
use crate::tools::search::text;

/// Longest stored title, in bytes.
pub const MAX_TITLE_BYTES: usize = 1024;
/// Longest stored summary, in bytes.
pub const MAX_SUMMARY_BYTES: usize = 8 * 1024;
/// Longest stored content, in bytes (well under Postgres' 1 MB tsvector limit).
pub const MAX_CONTENT_BYTES: usize = 64 * 1024;

/// A parsed feed.
#[derive(Debug, Clone)]
pub struct ParsedFeed {
    /// The feed's title.
    pub title: Option<String>,
    /// `rss`, `atom` or `json_feed`.
    pub format: &'static str,
    /// Entries in the document.
    pub entries: usize,
    /// Items to store (deduplicated, capped).
    pub items: Vec<NewNewsItem>,
    /// True when entries beyond the cap were dropped.
    pub truncated: bool,
    /// Entries skipped because nothing identifies them.
    pub skipped: usize,
}

/// Parses `body` fetched from `feed_url` (see the module docs). The error is feed-rs's,
/// describing what is malformed.
pub fn parse(
    body: &[u8],
    content_type: Option<&str>,
    feed_url: &str,
    max_items: usize,
) -> Result<ParsedFeed, feed_rs::parser::ParseFeedError> {
    let decoded = transcode(body, content_type);
    let parser = feed_rs::parser::Builder::new()
        .base_uri(Some(feed_url))
        .id_generator(|_links, _title, _uri| String::new())
        .build();
    let feed = parser.parse(decoded.as_ref())?;
    let format = match feed.feed_type {
        feed_rs::model::FeedType::Atom => "atom",
        feed_rs::model::FeedType::JSON => "json_feed",
        feed_rs::model::FeedType::RSS0 | feed_rs::model::FeedType::RSS1 | feed_rs::model::FeedType::RSS2 => "rss",
    };
    let entries = feed.entries.len();
    let truncated = entries > max_items;
    let mut seen = std::collections::HashSet::new();
    let mut items = Vec::new();
    let mut skipped = 0;
    for entry in feed.entries.into_iter().take(max_items) {
        match item(entry) {
            Some(item) => {
                if seen.insert(item.dedup_key.clone()) {
                    items.push(item);
                }
            }
            None => skipped += 1,
        }
    }
    let title = feed.title.map(|t| text_of(&t)).filter(|t| !t.is_empty());
    Ok(ParsedFeed { title, format, entries, items, truncated, skipped })
}

fn transcode<'a>(body: &'a [u8], content_type: Option<&str>) -> std::borrow::Cow<'a, [u8]> {
    let Some(label) = content_type.and_then(charset_of) else { return body.into() };
    let Some(encoding) = encoding_rs::Encoding::for_label(label.as_bytes()) else { return body.into() };
    if encoding == encoding_rs::UTF_8 || declares_encoding(body) {
        return body.into();
    }
    let (text, _, _) = encoding.decode(body);
    text.into_owned().into_bytes().into()
}

fn charset_of(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim().eq_ignore_ascii_case("charset")).then(|| v.trim().trim_matches('"').to_owned())
    })
}

fn declares_encoding(body: &[u8]) -> bool {
    let head = &body[..body.len().min(200)];
    head.starts_with(b"<?xml")
        && head
            .split(|&b| b == b'>')
            .next()
            .is_some_and(|decl| decl.windows(8).any(|w| w.eq_ignore_ascii_case(b"encoding")))
}

fn text_of(t: &feed_rs::model::Text) -> String {
    if t.content_type.to_string().contains("html") || t.content.contains('<') {
        text::html_to_text(&t.content)
    } else {
        text::collapse_whitespace(&text::decode_entities(&t.content))
    }
}

fn item(entry: feed_rs::model::Entry) -> Option<NewNewsItem> {
    let guid = Some(entry.id.trim().to_owned()).filter(|g| !g.is_empty()).map(|g| text::cut(&g, 2048));
    let link = entry
        .links
        .iter()
        .find(|l| l.rel.as_deref().is_none_or(|r| r == "alternate"))
        .or_else(|| entry.links.first())
        .and_then(|l| text::canonical_url(&l.href));
    let title = text::cut(&entry.title.as_ref().map(text_of).unwrap_or_default(), MAX_TITLE_BYTES);
    let summary = text::cut(&entry.summary.as_ref().map(text_of).unwrap_or_default(), MAX_SUMMARY_BYTES);
    let content = entry
        .content
        .as_ref()
        .and_then(|c| {
            let body = c.body.as_deref()?;
            Some(if c.content_type.to_string().contains("html") || body.contains('<') {
                text::html_to_text(body)
            } else {
                text::collapse_whitespace(body)
            })
        })
        .map(|c| text::cut(&c, MAX_CONTENT_BYTES))
        .unwrap_or_default();
    let authors: Vec<String> = entry.authors.iter().filter_map(|p| p.name.clone()).filter(|n| !n.is_empty()).collect();
    let author = (!authors.is_empty()).then(|| text::cut(&authors.join(", "), 512));
    let published_at = entry.published.or(entry.updated).map(crate::ids::format_time);
    let dedup_key = match (&guid, &link) {
        (Some(g), _) => format!("guid:{g}"),
        (None, Some(u)) => format!("url:{u}"),
        (None, None) if !title.is_empty() => format!("title:{}", crate::evidence::sha256_hex(title.as_bytes())),
        (None, None) => return None,
    };
    let content_sha256 = crate::evidence::sha256_hex(
        json!([guid, link, title, summary, content, author, published_at]).to_string().as_bytes(),
    );
    Some(NewNewsItem { dedup_key, guid, url: link, title, summary, content, author, published_at, content_sha256 })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSS: &str = r#"<?xml version="1.0"?>
<rss version="2.0"><channel><title>Example News</title><link>https://news.example/</link>
<item><guid>a-1</guid><title>First &amp; best</title><link>https://news.example/a?utm_source=rss</link>
<description>&lt;p&gt;Hello &lt;b&gt;world&lt;/b&gt;&lt;/p&gt;</description><pubDate>Tue, 10 Jun 2025 04:00:00 GMT</pubDate></item>
<item><title>No guid</title><link>/relative/b</link></item>
<item><guid>a-1</guid><title>Duplicate guid, second copy</title></item>
<item><description>nothing identifies me</description></item>
</channel></rss>"#;

    #[test]
    fn rss_items_with_identity_dedup_and_text() {
        let f = parse(RSS.as_bytes(), Some("application/rss+xml"), "https://news.example/feed.xml", 100).unwrap();
        assert_eq!(f.format, "rss");
        assert_eq!(f.title.as_deref(), Some("Example News"));
        assert_eq!(f.entries, 4);
        assert_eq!(f.skipped, 1);
        assert_eq!(f.items.len(), 2, "{:#?}", f.items);
        let a = &f.items[0];
        assert_eq!(a.dedup_key, "guid:a-1");
        assert_eq!(a.title, "First & best");
        assert_eq!(a.summary, "Hello world");
        assert_eq!(a.url.as_deref(), Some("https://news.example/a"));
        assert_eq!(a.published_at.as_deref(), Some("2025-06-10T04:00:00.000Z"));
        let b = &f.items[1];
        assert_eq!(b.dedup_key, "url:https://news.example/relative/b");
        assert_eq!(b.guid, None);
    }

    #[test]
    fn latin1_without_declaration_uses_the_http_charset() {
        let mut body = b"<rss version=\"2.0\"><channel><title>t</title><item><guid>1</guid><title>Caf".to_vec();
        body.push(0xE9);
        body.extend_from_slice(b"</title></item></channel></rss>");
        let f = parse(&body, Some("text/xml; charset=ISO-8859-1"), "https://x.example/", 10).unwrap();
        assert_eq!(f.items[0].title, "Café");
    }

    #[test]
    fn malformed_is_an_error_and_the_cap_holds() {
        assert!(parse(b"<rss version=\"2.0\"><channel><item>", None, "https://x.example/", 10).is_err());
        assert!(parse(b"this is not a feed", None, "https://x.example/", 10).is_err());
        let mut many = String::from("<rss version=\"2.0\"><channel><title>t</title>");
        for i in 0..50 {
            many.push_str(&format!("<item><guid>{i}</guid><title>item {i}</title></item>"));
        }
        many.push_str("</channel></rss>");
        let f = parse(many.as_bytes(), None, "https://x.example/", 10).unwrap();
        assert_eq!((f.entries, f.items.len(), f.truncated), (50, 10, true));
    }
}
