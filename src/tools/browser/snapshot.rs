//! Rendering a page's accessibility tree (CDP `Accessibility.getFullAXTree`, read as raw JSON
//! so a newer Chromium's roles and properties never fail to parse) into compact text with
//! element references:
//!
//! ```text
//! - heading "Welcome" [level=1]
//! - link "Docs" [ref=e3]
//! - textbox "Name" [ref=e4] value="Ada"
//! - button "Send" [ref=e5]
//! ```
//!
//! A reference (`e3`) belongs to the snapshot that printed it: [`Rendered::refs`] maps it to
//! the element's `backendDOMNodeId`, and [`Rendered::digest`] fingerprints the tree's
//! structure (roles, names, depth; not the values of form fields) so that a later action can
//! tell whether the page changed since.

use std::collections::HashMap;
use std::rc::Rc;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// One element a reference names.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Element {
    /// The DOM node (`backendDOMNodeId`), stable for the document's life.
    pub backend_node_id: i64,
    /// Its accessibility role (`button`, `link`, `textbox`, `combobox`…).
    pub role: String,
    /// Its accessible name.
    pub name: String,
}

/// A rendered snapshot.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// The text shown to the Planner.
    pub text: String,
    /// Reference (`e1`…) → element.
    pub refs: HashMap<String, Element>,
    /// Lowercase hex SHA-256 of the tree's structure (see the module docs).
    pub digest: String,
    /// Nodes printed.
    pub nodes: usize,
    /// True when `max_nodes` or the text limit cut the tree.
    pub truncated: bool,
}

/// Longest name or value printed for one node, in characters.
const MAX_LABEL_CHARS: usize = 200;

/// Roles that carry no meaning of their own when unnamed: not printed, their children are.
const TRANSPARENT: [&str; 8] =
    ["none", "generic", "LineBreak", "presentation", "ignored", "LabelText", "MenuListPopup", "ListMarker"];

/// Roles never printed (their text is their parent's `StaticText`).
const HIDDEN: [&str; 2] = ["InlineTextBox", "ListMarker"];

/// Roles of named elements that also get a reference (besides [`INTERACTIVE`]).
const NAMED_TARGETS: [&str; 9] =
    ["img", "cell", "gridcell", "row", "listitem", "treeitem", "menuitemcheckbox", "menuitemradio", "columnheader"];

/// Roles of elements worth a reference even without a name.
const INTERACTIVE: [&str; 15] = [
    "button",
    "link",
    "textbox",
    "searchbox",
    "combobox",
    "listbox",
    "option",
    "checkbox",
    "radio",
    "switch",
    "slider",
    "spinbutton",
    "menuitem",
    "tab",
    "textarea",
];

fn ax_str(node: &Value, field: &str) -> String {
    match &node[field]["value"] {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `text` on one line (runs of white space as one space, none at the ends), cut after
/// [`MAX_LABEL_CHARS`] characters with `…`. Reads no further than it keeps: a page's name may
/// be megabytes long.
fn label(text: &str) -> String {
    let mut out = String::new();
    let mut chars = 0;
    for (n, word) in text.split_whitespace().enumerate() {
        for c in (n > 0).then_some(' ').into_iter().chain(word.chars()) {
            if chars == MAX_LABEL_CHARS {
                out.push('…');
                return out;
            }
            out.push(c);
            chars += 1;
        }
    }
    out
}

fn quoted(text: &str) -> String {
    serde_json::to_string(&label(text)).unwrap_or_default()
}

/// Renders `nodes` (the `nodes` array of `Accessibility.getFullAXTree`), printing at most
/// `max_nodes` nodes and `max_bytes` bytes of text; the walk stops at the first node past
/// them. Memory and time are linear in the tree's size whatever its shape: a node's label is
/// computed once and shared by its descendants' stack entries (a long name over thousands of
/// children was copied into each of them).
pub fn render(nodes: &[Value], max_nodes: usize, max_bytes: usize) -> Rendered {
    let by_id: HashMap<&str, &Value> = nodes.iter().filter_map(|n| n["nodeId"].as_str().map(|id| (id, n))).collect();
    let root = nodes.iter().find(|n| n.get("parentId").is_none_or(Value::is_null)).or(nodes.first());
    let mut out =
        Rendered { text: String::new(), refs: HashMap::new(), digest: String::new(), nodes: 0, truncated: false };
    let mut hasher = Sha256::new();
    // Depth-first, children in order; (node, depth, the label of the nearest printed ancestor).
    let mut stack: Vec<(&Value, usize, Rc<str>)> = root.map(|r| vec![(r, 0, Rc::from(""))]).unwrap_or_default();
    let mut visited = 0usize;
    while let Some((node, depth, parent_label)) = stack.pop() {
        visited += 1;
        if visited > nodes.len() {
            break; // a cycle in a malformed tree
        }
        let role = ax_str(node, "role");
        let name = ax_str(node, "name");
        let ignored = node["ignored"].as_bool().unwrap_or(false);
        let hidden = ignored
            || HIDDEN.contains(&role.as_str())
            || (TRANSPARENT.contains(&role.as_str()) && name.is_empty())
            || (role == "StaticText" && *label(&name) == *parent_label)
            || (role == "RootWebArea" && depth > 0 && name.is_empty());
        let shown = !hidden;
        let child_depth = if shown { depth + 1 } else { depth };
        if shown {
            if out.nodes >= max_nodes || out.text.len() >= max_bytes {
                out.truncated = true;
                break;
            }
            {
                out.nodes += 1;
                hasher.update(format!("{depth}\u{1f}{role}\u{1f}{name}\n").as_bytes());
                let mut line =
                    format!("{}- {}", "  ".repeat(depth.min(40)), if role == "StaticText" { "text" } else { &role });
                if !name.is_empty() {
                    line.push(' ');
                    line.push_str(&quoted(&name));
                }
                let backend = node["backendDOMNodeId"].as_i64();
                let referable = INTERACTIVE.contains(&role.as_str())
                    || (NAMED_TARGETS.contains(&role.as_str()) && !name.is_empty());
                if let (Some(id), true) = (backend, referable) {
                    let reference = format!("e{}", out.refs.len() + 1);
                    line.push_str(&format!(" [ref={reference}]"));
                    out.refs.insert(reference, Element { backend_node_id: id, role: role.clone(), name: label(&name) });
                }
                for prop in node["properties"].as_array().into_iter().flatten() {
                    let pname = prop["name"].as_str().unwrap_or_default();
                    if matches!(pname, "checked" | "selected" | "expanded" | "disabled" | "level" | "required") {
                        let v = &prop["value"]["value"];
                        if !matches!(v, Value::Null | Value::Bool(false)) {
                            line.push_str(&format!(
                                " [{pname}={}]",
                                v.as_str().map_or_else(|| v.to_string(), str::to_owned)
                            ));
                        }
                    }
                }
                let value = ax_str(node, "value");
                if !value.is_empty() {
                    line.push_str(&format!(" value={}", quoted(&value)));
                }
                line.push('\n');
                out.text.push_str(&line);
            }
        }
        // A text field's children are its value's text, printed as `value=`: not descended
        // into, so typing does not change the tree's structure.
        if matches!(role.as_str(), "textbox" | "searchbox" | "spinbutton" | "textarea") {
            continue;
        }
        let children: Vec<&Value> = node["childIds"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c.as_str().and_then(|id| by_id.get(id).copied()))
            .collect();
        let inherited: Rc<str> = if shown { Rc::from(label(&name)) } else { parent_label };
        for child in children.into_iter().rev() {
            stack.push((child, child_depth, Rc::clone(&inherited)));
        }
    }
    out.digest = hex::encode(hasher.finalize());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(id: &str, role: &str, name: &str, parent: Option<&str>, children: &[&str], backend: i64) -> Value {
        json!({"nodeId": id, "ignored": false, "role": {"type": "role", "value": role},
               "name": {"type": "computedString", "value": name}, "parentId": parent,
               "childIds": children, "backendDOMNodeId": backend})
    }

    #[test]
    fn renders_refs_and_digest() {
        let nodes = vec![
            node("1", "RootWebArea", "Page", None, &["2", "3"], 1),
            node("2", "generic", "", Some("1"), &["4"], 2),
            node("3", "heading", "Title", Some("1"), &[], 3),
            node("4", "button", "Go", Some("2"), &["5"], 4),
            node("5", "StaticText", "Go", Some("4"), &["6"], 5),
            node("6", "InlineTextBox", "Go", Some("5"), &[], 5),
        ];
        let r = render(&nodes, 100, 10_000);
        assert_eq!(r.text, "- RootWebArea \"Page\"\n  - button \"Go\" [ref=e1]\n  - heading \"Title\"\n");
        assert_eq!(r.refs["e1"].backend_node_id, 4);
        let mut changed = nodes.clone();
        changed[3]["name"]["value"] = json!("Stop");
        assert_ne!(render(&changed, 100, 10_000).digest, r.digest);
        let cut = render(&nodes, 2, 10_000);
        assert!(cut.truncated);
        assert_eq!(cut.nodes, 2);
    }

    /// A page's group with a 4 MiB name over 2,000 texts: each text's stack entry carried a
    /// copy of the name (8 GiB in all) and each text re-read it.
    #[test]
    fn a_long_name_over_many_children_is_read_once() {
        let big = "x ".repeat(2 * 1024 * 1024);
        let kids: Vec<String> = (0..2_000).map(|i| format!("t{i}")).collect();
        let kid_ids: Vec<&str> = kids.iter().map(String::as_str).collect();
        let mut nodes =
            vec![node("1", "RootWebArea", "Page", None, &["g"], 1), node("g", "group", &big, Some("1"), &kid_ids, 2)];
        nodes.extend(kids.iter().map(|id| node(id, "StaticText", id, Some("g"), &[], 3)));
        let r = render(&nodes, 500, 1_000_000);
        assert!(r.truncated);
        assert_eq!(r.nodes, 500);
        let line = r.text.lines().nth(1).unwrap();
        assert!(line.len() < 2 * MAX_LABEL_CHARS + 20 && line.ends_with("…\""), "{line}");
    }

    #[test]
    fn labels_are_one_line_and_cut() {
        assert_eq!(label("  a \n\t b  "), "a b");
        let long = "ab ".repeat(100);
        let cut = label(&long);
        assert_eq!(cut.chars().count(), MAX_LABEL_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(label(&"a".repeat(MAX_LABEL_CHARS)), "a".repeat(MAX_LABEL_CHARS));
    }
}
