//! The DevTools methods the control plane may send to a user's attached browser, shared by
//! the control plane (checked before a message leaves the server) and the device runner
//! (checked again before a message reaches the browser on the device): no cookie, storage
//! or script access (docs/browser.md, "Attached browser").

/// Every DevTools method the attached client sends; anything else is refused.
pub const ALLOWED_METHODS: &[&str] = &[
    "Accessibility.getFullAXTree",
    "Accessibility.getPartialAXTree",
    "DOM.focus",
    "DOM.getContentQuads",
    "DOM.getNodeForLocation",
    "DOM.resolveNode",
    "DOM.scrollIntoViewIfNeeded",
    "Fetch.continueRequest",
    "Fetch.enable",
    "Fetch.failRequest",
    "Input.dispatchKeyEvent",
    "Input.dispatchMouseEvent",
    "Input.insertText",
    "Page.bringToFront",
    "Page.captureScreenshot",
    "Page.createIsolatedWorld",
    "Page.enable",
    "Page.getFrameTree",
    "Page.getLayoutMetrics",
    "Page.navigate",
    "Runtime.callFunctionOn",
    "Runtime.releaseObject",
    "Target.attachToTarget",
    "Target.detachFromTarget",
    "Target.getTargetInfo",
    "Target.getTargets",
    "Target.setDiscoverTargets",
];

/// The fixed function that empties a text field before typing (the browser tools' own code).
pub const CLEAR_FIELD: &str = "function() { if ('value' in this) { this.value = ''; } else if (this.isContentEditable) { this.textContent = ''; } }";

/// The fixed function that chooses an option of a `<select>` by value or label (the browser
/// tools' own code); returns the chosen option's value, or null.
pub const SELECT_OPTION: &str = "function(want) { if (!(this instanceof HTMLSelectElement)) { return null; } \
    const o = Array.from(this.options).find(o => o.value === want || o.label === want || o.text === want); \
    if (!o) { return null; } this.value = o.value; \
    this.dispatchEvent(new Event('input', {bubbles: true})); this.dispatchEvent(new Event('change', {bubbles: true})); \
    return o.value; }";

/// The fixed function that tells whether a click at an element's centre reaches it: its one
/// argument, the node a hit test there finds (what the click would land on), is the element
/// itself or inside it in the flattened tree (through slots and shadow roots), and is not a
/// frame showing another document (a click there lands in that document). Also reached: a
/// text element through its parent element; a form control through its `<label>` (the
/// visible part of a styled checkbox) when nothing else interactive lies between; an element
/// in a shadow tree through its host when the hit is the host itself and one of the host's
/// own text children is slotted into the element (the hit test lifts text to its parent).
/// Run in an isolated world, where the page cannot rewrite the built-ins it uses. Returns
/// true or false (the tools' own code).
pub const REACHES: &str = "function(hit) { \
    if (hit !== this && ['iframe', 'frame', 'object', 'embed', 'portal', 'fencedframe'].includes(hit.localName)) { return false; } \
    if (this.nodeType === 3 && hit === this.parentNode) { return true; } \
    const up = (n) => n.assignedSlot || n.parentNode || (n instanceof ShadowRoot ? n.host : null); \
    const inside = (from) => { for (let n = from; n; n = up(n)) { if (n === this) { return true; } } return false; }; \
    if (inside(hit)) { return true; } \
    for (const c of hit.childNodes) { if (c.nodeType === 3 && c.textContent.trim() && c.assignedSlot && inside(c.assignedSlot)) { return true; } } \
    const el = hit.nodeType === 1 ? hit : hit.parentElement; \
    const label = el && el.closest('label'); \
    if (!label || label.control !== this) { return false; } \
    for (let n = el; n && n !== label; n = n.parentElement) { \
        if (n.matches('a[href], button, input, select, textarea, [tabindex], iframe')) { return false; } } \
    return true; }";

/// The largest DevTools message (and WebSocket frame) accepted from a browser, in bytes: a
/// screenshot's answer fits; a larger one closes the connection.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// The largest event (a message that is not the answer to a command) passed on, in bytes;
/// larger ones are dropped unread.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// Refuses a method outside [`ALLOWED_METHODS`], and a `Runtime.callFunctionOn` whose
/// function is not [`CLEAR_FIELD`], [`SELECT_OPTION`] or [`REACHES`]; the sentence says why.
pub fn check_method(method: &str, params: &serde_json::Value) -> Result<(), String> {
    if !ALLOWED_METHODS.contains(&method) {
        return Err(format!("{method} is not sent to an attached browser (no cookie, storage or script access)"));
    }
    if method == "Page.createIsolatedWorld" && params["grantUniveralAccess"].as_bool() == Some(true) {
        return Err("an isolated world is created without universal access".into());
    }
    if method == "Runtime.callFunctionOn" {
        let f = params["functionDeclaration"].as_str().unwrap_or_default();
        if ![CLEAR_FIELD, SELECT_OPTION, REACHES].contains(&f) {
            return Err("only the tools' own fixed functions run in an attached tab".into());
        }
    }
    Ok(())
}

/// The command id of a DevTools message as the browser writes an answer (`{"id":N,…`),
/// read without parsing the message.
pub fn answer_id(text: &str) -> Option<u64> {
    let rest = text.strip_prefix("{\"id\":")?;
    let digits: String = rest.bytes().take_while(u8::is_ascii_digit).map(char::from).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_list_and_the_fixed_functions_pass() {
        assert!(check_method("Runtime.evaluate", &serde_json::json!({})).is_err());
        assert!(check_method("Network.getCookies", &serde_json::json!({})).is_err());
        let f = serde_json::json!({"functionDeclaration": "function() { return document.cookie }"});
        assert!(check_method("Runtime.callFunctionOn", &f).is_err());
        assert!(
            check_method("Runtime.callFunctionOn", &serde_json::json!({"functionDeclaration": CLEAR_FIELD})).is_ok()
        );
        assert_eq!(answer_id("{\"id\":42,\"result\":{}}"), Some(42));
        assert_eq!(answer_id("{\"method\":\"x\"}"), None);
    }
}
