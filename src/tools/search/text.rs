//! Text helpers: HTML to plain text (feed summaries, provider snippets), bounded cutting,
//! and canonical URLs for deduplication.

/// Decodes the HTML character references the feeds we read use: the XML five, common
/// typographic names, and numeric references (`&#233;`, `&#xE9;`). Unknown names are kept
/// verbatim.
pub fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let tail = &rest[amp..];
        let end = tail.char_indices().take(12).find(|&(_, c)| c == ';').map(|(i, _)| i);
        let decoded = end.and_then(|end| entity(&tail[1..end]).map(|c| (c, end)));
        match decoded {
            Some((c, end)) => {
                out.push(c);
                rest = &tail[end + 1..];
            }
            None => {
                out.push('&');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn entity(name: &str) -> Option<char> {
    if let Some(num) = name.strip_prefix('#') {
        let code = match num.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => num.parse().ok()?,
        };
        return char::from_u32(code);
    }
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "hellip" => '…',
        "mdash" => '—',
        "ndash" => '–',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "laquo" => '«',
        "raquo" => '»',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "middot" => '·',
        "bull" => '•',
        "euro" => '€',
        _ => return None,
    })
}

/// Plain text of an HTML fragment: `script`/`style` bodies dropped, tags removed (block
/// tags become spaces), character references decoded, whitespace collapsed.
pub fn html_to_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(lt) = rest.find('<') {
        out.push_str(&rest[..lt]);
        let tail = &rest[lt..];
        let starts_tag = tail[1..].starts_with(|c: char| c.is_ascii_alphabetic() || "/!?".contains(c));
        if !starts_tag {
            out.push('<');
            rest = &tail[1..];
            continue;
        }
        let Some(gt) = tail.find('>') else {
            // A lone '<' is text.
            out.push_str(tail);
            rest = "";
            break;
        };
        let tag = tail[1..gt].trim_start_matches('/').trim();
        let name: String = tag.chars().take_while(|c| c.is_ascii_alphanumeric()).collect::<String>().to_lowercase();
        rest = &tail[gt + 1..];
        if (name == "script" || name == "style") && !tail[1..].starts_with('/') {
            rest = match find_close_tag(rest, &name) {
                Some(i) => rest[i..].find('>').map_or("", |j| &rest[i + j + 1..]),
                None => "",
            };
        }
        out.push(' ');
    }
    out.push_str(rest);
    collapse_whitespace(&decode_entities(&out))
}

/// Where the first `</name` (ASCII case ignored) starts in `text`. Scans from the start
/// up to that point only, without copying: a document of many `<script></script>` pairs
/// stays linear (lower-casing the rest at each one was quadratic — a 1 MiB feed field took
/// seconds).
fn find_close_tag(text: &str, name: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    text.match_indices("</")
        .map(|(i, _)| i)
        .find(|&i| bytes.get(i + 2..i + 2 + name.len()).is_some_and(|n| n.eq_ignore_ascii_case(name.as_bytes())))
}

/// `text` with every run of whitespace replaced by one space, trimmed.
pub fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` cut to at most `max` bytes on a character boundary (no marker added).
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Query parameters that only track the reader and never select content (Google
/// Analytics' `utm_*`, Facebook's `fbclid`, Google Ads' `gclid`, Microsoft's `msclkid`,
/// Mailchimp's `mc_cid`/`mc_eid`).
const TRACKING_PARAMS: [&str; 5] = ["fbclid", "gclid", "msclkid", "mc_cid", "mc_eid"];

/// The canonical form of an http(s) URL used for deduplication: scheme and host lower-case
/// (the `url` crate's WHATWG parsing), default port and fragment dropped, tracking
/// parameters removed, and a bare `?` removed. None for anything that is not http(s).
pub fn canonical_url(raw: &str) -> Option<String> {
    let mut url = url::Url::parse(raw.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return None;
    }
    url.set_fragment(None);
    let kept: Vec<(String, String)> = url
        .query_pairs()
        .filter(|(k, _)| !k.starts_with("utm_") && !TRACKING_PARAMS.contains(&k.as_ref()))
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    if kept.is_empty() {
        url.set_query(None);
    } else if url.query().is_some_and(|q| q.split('&').count() != kept.len()) {
        url.query_pairs_mut().clear().extend_pairs(kept);
    }
    Some(url.to_string())
}

/// True for an absolute http(s) URL of at most 2048 bytes.
pub fn is_http_url(raw: &str) -> bool {
    raw.len() <= 2048
        && url::Url::parse(raw).is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_becomes_text() {
        assert_eq!(
            html_to_text("<p>Caf&eacute; &amp; <b>tea</b></p><script>alert('x')</script><br/>done&#33; &#x263A;"),
            "Caf&eacute; & tea done! ☺"
        );
        assert_eq!(html_to_text("a < b and c > d"), "a < b and c > d");
        assert_eq!(html_to_text("<STYLE>p{}</STYLE>visible"), "visible");
        assert_eq!(html_to_text("x <unclosed"), "x <unclosed");
    }

    #[test]
    fn many_script_blocks_take_linear_time() {
        assert_eq!(html_to_text("a<ScRiPt>x</sCrIpT >b<style>y</STYLE>c<script>never closed"), "a b c");
        // 4 MiB of empty script blocks: quadratic work (the rest lower-cased at each block)
        // would take minutes here; linear work takes milliseconds.
        let html = "<script></script>".repeat(4 << 20 >> 4) + "end";
        let started = std::time::Instant::now();
        assert_eq!(html_to_text(&html), "end");
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "{:?}", started.elapsed());
    }

    #[test]
    fn canonical_urls() {
        assert_eq!(
            canonical_url("HTTPS://Example.COM:443/a/b?utm_source=x&id=3#frag").as_deref(),
            Some("https://example.com/a/b?id=3")
        );
        assert_eq!(canonical_url("http://example.com/?fbclid=1").as_deref(), Some("http://example.com/"));
        assert_eq!(canonical_url("http://example.com/p?b=2&a=1").as_deref(), Some("http://example.com/p?b=2&a=1"));
        assert_eq!(canonical_url("mailto:x@example.com"), None);
        assert_eq!(canonical_url("not a url"), None);
    }

    #[test]
    fn cut_respects_char_boundaries() {
        assert_eq!(cut("héllo", 2), "h");
        assert_eq!(cut("abc", 10), "abc");
    }
}
