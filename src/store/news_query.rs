//! The `news_search` query language, the one Postgres' `websearch_to_tsquery` reads (the
//! store runs it on either back-end: [`super::Store::search_news`]):
//! words are ANDed, `"quoted text"` is a phrase, `or` between two terms is OR, and a
//! leading `-` negates a term. On SQLite the same text is translated to an FTS5
//! expression ([`to_fts5`]) in which every term is a quoted string, so no input can be an
//! FTS5 syntax error or reach a column filter.
//!
//! One difference remains: FTS5's `NOT` is binary, so negated terms are subtracted from the
//! whole positive expression (`a or b -c` is `(a OR b) NOT c` here, `a | (b & !c)` on
//! Postgres).

/// One term of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Term {
    /// Words that must appear in this order (one word is a one-word phrase).
    Phrase(Vec<String>),
    /// The OR operator between the terms around it.
    Or,
    /// A phrase that must not appear.
    Not(Vec<String>),
}

/// Splits `text` into words the way FTS5's `unicode61` tokenizer does (runs of letters and
/// digits), lower-cased.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

/// Parses the query text into terms.
pub fn parse(text: &str) -> Vec<Term> {
    let mut terms = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let negated = rest.starts_with('-');
        let body = if negated { &rest[1..] } else { rest };
        let (raw, next, quoted) = if let Some(inner) = body.strip_prefix('"') {
            match inner.find('"') {
                Some(end) => (&inner[..end], &inner[end + 1..], true),
                None => (inner, "", true),
            }
        } else {
            let end = body.find(char::is_whitespace).unwrap_or(body.len());
            (&body[..end], &body[end..], false)
        };
        rest = next.trim_start();
        if !quoted && !negated && raw.eq_ignore_ascii_case("or") {
            if matches!(terms.last(), Some(Term::Phrase(_))) {
                terms.push(Term::Or);
            }
            continue;
        }
        let w = words(raw);
        if w.is_empty() {
            continue;
        }
        terms.push(if negated { Term::Not(w) } else { Term::Phrase(w) });
    }
    while matches!(terms.last(), Some(Term::Or)) {
        terms.pop();
    }
    terms
}

/// True when the query has at least one term that is not negated (anything else matches
/// nothing or everything).
pub fn has_positive_term(text: &str) -> bool {
    parse(text).iter().any(|t| matches!(t, Term::Phrase(_)))
}

fn quoted(words: &[String]) -> String {
    // Words hold only letters and digits, so no quote can appear inside.
    format!("\"{}\"", words.join(" "))
}

/// The FTS5 expression of `text`, or None when it has no positive term.
pub fn to_fts5(text: &str) -> Option<String> {
    let terms = parse(text);
    let mut positive = String::new();
    let mut negative = Vec::new();
    let mut pending_or = false;
    for term in &terms {
        match term {
            Term::Phrase(w) => {
                if !positive.is_empty() {
                    positive.push_str(if pending_or { " OR " } else { " AND " });
                }
                positive.push_str(&quoted(w));
                pending_or = false;
            }
            Term::Or => pending_or = true,
            Term::Not(w) => negative.push(quoted(w)),
        }
    }
    if positive.is_empty() {
        return None;
    }
    Some(if negative.is_empty() { positive } else { format!("({positive}) NOT ({})", negative.join(" OR ")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translations() {
        assert_eq!(to_fts5("rust async").as_deref(), Some("\"rust\" AND \"async\""));
        assert_eq!(to_fts5("\"tokio runtime\" or smol").as_deref(), Some("\"tokio runtime\" OR \"smol\""));
        assert_eq!(to_fts5("rust -java -\"c sharp\"").as_deref(), Some("(\"rust\") NOT (\"java\" OR \"c sharp\")"));
        assert_eq!(to_fts5("e-mail NEAR(x) title:y").as_deref(), Some("\"e mail\" AND \"near x\" AND \"title y\""));
        assert_eq!(to_fts5("Café \"unterminated").as_deref(), Some("\"café\" AND \"unterminated\""));
        assert_eq!(to_fts5("or or"), None);
        assert_eq!(to_fts5("-only"), None);
        assert_eq!(to_fts5("*** ((( "), None);
    }
}
