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

fn label(text: &str) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(MAX_LABEL_CHARS) {
        Some((i, _)) => format!("{}…", &one_line[..i]),
        None => one_line,
    }
}

fn quoted(text: &str) -> String {
    serde_json::to_string(&label(text)).unwrap_or_default()
}

/// Renders `nodes` (the `nodes` array of `Accessibility.getFullAXTree`), printing at most
/// `max_nodes` nodes and `max_bytes` bytes of text.
pub fn render(nodes: &[Value], max_nodes: usize, max_bytes: usize) -> Rendered {
    let by_id: HashMap<&str, &Value> = nodes.iter().filter_map(|n| n["nodeId"].as_str().map(|id| (id, n))).collect();
    let root = nodes.iter().find(|n| n.get("parentId").is_none_or(Value::is_null)).or(nodes.first());
    let mut out =
        Rendered { text: String::new(), refs: HashMap::new(), digest: String::new(), nodes: 0, truncated: false };
    let mut hasher = Sha256::new();
    // Depth-first, children in order; (node, depth).
    // Depth-first, children in order; (node, depth, the name of the nearest printed ancestor).
    let mut stack: Vec<(&Value, usize, String)> = root.map(|r| vec![(r, 0, String::new())]).unwrap_or_default();
    let mut visited = 0usize;
    while let Some((node, depth, parent_name)) = stack.pop() {
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
            || (role == "StaticText" && label(&name) == label(&parent_name))
            || (role == "RootWebArea" && depth > 0 && name.is_empty());
        let shown = !hidden;
        let child_depth = if shown { depth + 1 } else { depth };
        if shown {
            if out.nodes >= max_nodes || out.text.len() >= max_bytes {
                out.truncated = true;
            } else {
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
        let inherited = if shown { name.clone() } else { parent_name };
        for child in children.into_iter().rev() {
            stack.push((child, child_depth, inherited.clone()));
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
}
