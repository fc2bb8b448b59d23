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

/// True when Postgres may turn `text` into a phrase query (`<->`): a quoted phrase, or a
/// word its parser splits (`e-mail`). Only then is [`phrase_pairs`] worth a round trip.
pub fn may_have_phrase(text: &str) -> bool {
    parse(text).iter().any(|t| matches!(t, Term::Phrase(w) if w.len() > 1))
}

/// A node of a parsed `tsquery` (its text form, as `websearch_to_tsquery(…)::text` prints it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum TsNode {
    Lexeme(String),
    Not(Box<TsNode>),
    And(Box<TsNode>, Box<TsNode>),
    Or(Box<TsNode>, Box<TsNode>),
    /// `<N>`: the right side starts N positions after the left side ends.
    Phrase(Box<TsNode>, u32, Box<TsNode>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TsToken {
    Lexeme(String),
    Not,
    And,
    Or,
    Phrase(u32),
    Open,
    Close,
}

/// Tokens of a tsquery's text form; None for anything this reader does not know (weights,
/// prefix marks, backslashes), which leaves the query without a pair prefilter.
fn ts_tokens(text: &str) -> Option<Vec<TsToken>> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' => {}
            '!' => out.push(TsToken::Not),
            '&' => out.push(TsToken::And),
            '|' => out.push(TsToken::Or),
            '(' => out.push(TsToken::Open),
            ')' => out.push(TsToken::Close),
            '<' => {
                let mut n = String::new();
                loop {
                    match chars.next()? {
                        '>' => break,
                        d => n.push(d),
                    }
                }
                out.push(TsToken::Phrase(if n == "-" { 1 } else { n.parse().ok()? }));
            }
            '\'' => {
                let mut lexeme = String::new();
                loop {
                    match chars.next()? {
                        '\'' if chars.peek() == Some(&'\'') => {
                            chars.next();
                            lexeme.push('\'');
                        }
                        '\'' => break,
                        '\\' => return None,
                        ch => lexeme.push(ch),
                    }
                }
                if chars.peek() == Some(&':') {
                    return None;
                }
                out.push(TsToken::Lexeme(lexeme));
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Recursive descent over the tokens, tsquery precedence: `|` < `&` < `<N>` < `!`.
struct TsParser {
    tokens: Vec<TsToken>,
    at: usize,
}

impl TsParser {
    fn peek(&self) -> Option<&TsToken> {
        self.tokens.get(self.at)
    }

    fn or(&mut self) -> Option<TsNode> {
        let mut left = self.and()?;
        while self.peek() == Some(&TsToken::Or) {
            self.at += 1;
            left = TsNode::Or(Box::new(left), Box::new(self.and()?));
        }
        Some(left)
    }

    fn and(&mut self) -> Option<TsNode> {
        let mut left = self.phrase()?;
        while self.peek() == Some(&TsToken::And) {
            self.at += 1;
            left = TsNode::And(Box::new(left), Box::new(self.phrase()?));
        }
        Some(left)
    }

    fn phrase(&mut self) -> Option<TsNode> {
        let mut left = self.unary()?;
        while let Some(TsToken::Phrase(n)) = self.peek() {
            let n = *n;
            self.at += 1;
            left = TsNode::Phrase(Box::new(left), n, Box::new(self.unary()?));
        }
        Some(left)
    }

    fn unary(&mut self) -> Option<TsNode> {
        let token = self.peek()?.clone();
        self.at += 1;
        match token {
            TsToken::Not => Some(TsNode::Not(Box::new(self.unary()?))),
            TsToken::Lexeme(l) => Some(TsNode::Lexeme(l)),
            TsToken::Open => {
                let inner = self.or()?;
                (self.peek() == Some(&TsToken::Close)).then_some(())?;
                self.at += 1;
                Some(inner)
            }
            _ => None,
        }
    }
}

impl TsNode {
    /// The lexeme a match of this node starts with, when it is one lexeme.
    fn first(&self) -> Option<&str> {
        match self {
            TsNode::Lexeme(l) => Some(l),
            TsNode::Phrase(left, _, _) => left.first(),
            _ => None,
        }
    }

    /// The lexeme a match of this node ends with, when it is one lexeme.
    fn last(&self) -> Option<&str> {
        match self {
            TsNode::Lexeme(l) => Some(l),
            TsNode::Phrase(_, _, right) => right.last(),
            _ => None,
        }
    }

    /// Adds the adjacent pairs every matching document has.
    fn required_pairs(&self, out: &mut Vec<(String, String)>) {
        match self {
            TsNode::And(a, b) => {
                a.required_pairs(out);
                b.required_pairs(out);
            }
            TsNode::Phrase(a, n, b) => {
                a.required_pairs(out);
                b.required_pairs(out);
                if let (1, Some(x), Some(y)) = (*n, a.last(), b.first()) {
                    let pair = (x.to_owned(), y.to_owned());
                    if !out.contains(&pair) {
                        out.push(pair);
                    }
                }
            }
            // Nothing is required of every match of an OR, a negation, or a single lexeme.
            TsNode::Or(..) | TsNode::Not(_) | TsNode::Lexeme(_) => {}
        }
    }
}

/// The pairs of lexemes that every document matching a tsquery holds at adjacent positions
/// (`x` at p, `y` at p + 1), read from the tsquery's text form (`websearch_to_tsquery(…)::text`):
/// the `<->` links of phrases that every match needs (under AND, not under OR or NOT).
/// Postgres' GIN index over the lexemes cannot see positions, so the store also indexes
/// each item's adjacent pairs (`news_items.phrase_pairs`, migration 0020) and uses these as a
/// prefilter; `@@` still decides. Empty when there are none, or when the text holds
/// something this reader does not know (then there is no prefilter, never a wrong one).
pub fn phrase_pairs(tsquery: &str) -> Vec<(String, String)> {
    let Some(tokens) = ts_tokens(tsquery) else { return Vec::new() };
    let mut parser = TsParser { tokens, at: 0 };
    let Some(root) = parser.or() else { return Vec::new() };
    if parser.at != parser.tokens.len() {
        return Vec::new();
    }
    let mut out = Vec::new();
    root.required_pairs(&mut out);
    out
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

    fn pairs(q: &str) -> Vec<String> {
        phrase_pairs(q).into_iter().map(|(a, b)| format!("{a} {b}")).collect()
    }

    #[test]
    fn phrase_pairs_of_tsqueries() {
        // As websearch_to_tsquery('english', …)::text prints them (Postgres 15).
        assert_eq!(pairs("'rust' <-> 'async' & 'tokio'"), ["rust async"]);
        assert_eq!(pairs("'e-mail' <-> 'e' <-> 'mail'"), ["e-mail e", "e mail"]);
        assert_eq!(pairs("'cat' <2> 'sat'"), Vec::<String>::new());
        assert_eq!(pairs("'a' <-> 'b' <2> 'c' <-> 'd'"), ["a b", "c d"]);
        // Under OR or NOT nothing is required.
        assert_eq!(
            pairs("'cat' <-> 'sat' | 'dog' & !( 'big' <-> 'e-mail' ) & 'foo.bar' & 'b' <-> 'c'"),
            Vec::<String>::new()
        );
        assert_eq!(pairs("( 'a' | 'b' ) & 'c' <-> 'd' & !( 'e' <-> 'f' )"), ["c d"]);
        assert_eq!(pairs("( 'a' <-> 'b' ) <-> ( 'c' <-> 'd' )"), ["a b", "c d", "b c"]);
        assert_eq!(pairs("'it''s' <-> 'x'"), ["it's x"]);
        // Unknown forms: no prefilter.
        assert!(pairs("'a':* <-> 'b'").is_empty());
        assert!(pairs("'a\\b' <-> 'c'").is_empty());
        assert!(pairs("'a' <-> ").is_empty());
        assert!(pairs("").is_empty());
        assert!(may_have_phrase("\"rust async\" x") && may_have_phrase("e-mail") && !may_have_phrase("rust or go"));
    }
}
