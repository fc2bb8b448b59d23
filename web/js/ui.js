// Small DOM helpers. Text is always set as text (never parsed as HTML), so nothing the API
// returns can inject markup into the page.

/** Creates an element: h('p', {class: 'x', onclick: fn}, 'text', child, [more]). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** Appends children, skipping null/undefined/false (Element.append would write "null"). */
export function put(el, ...children) {
  append(el, children);
  return el;
}

/** Replaces the children of el. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A definition list from [term, value] pairs (pairs with an undefined value are skipped). */
export function dl(pairs, cls = 'facts') {
  return h('dl', { class: cls }, pairs.filter((p) => p && p[1] !== undefined).map(([k, v]) => [h('dt', {}, k), h('dd', {}, v ?? '—')]));
}

// Characters that print as nothing, as a space, or change the order text prints in: controls,
// format characters (bidirectional controls U+202A–202E, U+2066–2069, U+200E/200F, U+061C,
// zero-width characters…), line/paragraph separators, unusual spaces, and the default-ignorable
// characters outside those classes that print blank (Hangul fillers U+3164/U+115F/U+1160/U+FFA0,
// variation selectors, U+034F, U+180B–180F) and the blank Braille pattern U+2800.
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Default_Ignorable_Code_Point}\u00a0\u1680\u2000-\u200a\u202f\u205f\u2800\u3000]/gu;

/**
 * Text with every invisible, control, bidirectional or unusual space character written as
 * \u{…}, except the characters of `keep` (a multi-line block keeps '\n', a diff line '\t').
 */
export function escapeInvisible(text, keep = '') {
  return String(text ?? '').replace(INVISIBLE, (c) => (keep.includes(c) ? c : `\\u{${c.codePointAt(0).toString(16)}}`));
}

/**
 * Text from a call's input or preview, shown as its bytes: escaped by escapeInvisible, inside
 * a span marked data-escaped when anything was (the approval card then shows a warning).
 */
export function shown(text, keep = '') {
  const raw = String(text ?? '');
  const esc = escapeInvisible(raw, keep);
  return esc === raw ? raw : h('span', { class: 'escaped', dataset: { escaped: 'true' } }, esc);
}

/** Pretty JSON in a <pre> (escaped as shown() does, after stringify: its newlines stay). */
export function jsonBlock(value, label) {
  const raw = JSON.stringify(value, null, 2) ?? '';
  const esc = escapeInvisible(raw, '\n');
  return h('pre', { class: 'json', tabindex: '0', 'aria-label': label ?? 'JSON', dataset: esc === raw ? {} : { escaped: 'true' } }, esc);
}

/** Monospace text that may wrap anywhere (ids, hashes, paths); escaped as shown() does. */
export function code(text, cls = '') {
  if (text === undefined || text === null) return h('code', { class: `mono ${cls}` }, '—');
  const raw = String(text);
  const esc = escapeInvisible(raw);
  return h('code', { class: `mono ${cls}`, dataset: esc === raw ? {} : { escaped: 'true' } }, esc);
}

/** A status badge; the word is always shown, colour only reinforces it. */
export function badge(word, kind = word) {
  return h('span', { class: `badge badge-${String(kind).replace(/[^a-z_]/gi, '')}` }, String(word).replaceAll('_', ' '));
}

/** Announces a message to assistive technology (polite). */
export function announce(message) {
  const s = document.getElementById('status');
  if (!s) return;
  s.textContent = '';
  setTimeout(() => { s.textContent = message; }, 30);
}

/** An error shown in words, in place: returns the element. */
export function errorBox(err, what) {
  const text = typeof err?.describe === 'function' ? err.describe() : (err?.message ?? String(err));
  return h('div', { class: 'error-box', role: 'alert' }, what ? h('strong', {}, `${what}: `) : null, text);
}

/** Shows an error at the top of the page (dismissable). */
export function alertError(err, what) {
  const alerts = document.getElementById('alerts');
  const box = errorBox(err, what);
  const close = h('button', { type: 'button', class: 'link', 'aria-label': 'Dismiss this error', onclick: () => box.remove() }, 'Dismiss');
  box.appendChild(close);
  alerts.appendChild(box);
  while (alerts.children.length > 4) alerts.firstElementChild.remove();
}

/** "Not available in this build" for a view whose API route the server does not have. */
export function notAvailable(what, route) {
  return h('div', { class: 'notice', role: 'note', dataset: { unavailable: 'true' } },
    h('strong', {}, `${what}: not available in this build.`),
    ' This server has no ', h('code', {}, route), ' route (it answered 404 for the route itself), so there is nothing to show yet.');
}

/** A live-stream status line. */
export function streamState(el, s) {
  el.dataset.state = s.state;
  const parts = {
    connecting: 'Connecting…',
    open: 'Live',
    reconnecting: 'Reconnecting…',
    closed: 'Closed',
    failed: 'Stream failed',
  };
  let text = parts[s.state] ?? s.state;
  if (s.state === 'open' && s.resumedAfter) text += ` · resumed after event ${s.resumedAfter}`;
  if (s.reconnects) text += ` · reconnected ${s.reconnects}×`;
  if (s.error) text += ` · ${typeof s.error.describe === 'function' ? s.error.describe() : s.error.message}`;
  if (s.retryInMs) text += ` · retrying in ${(s.retryInMs / 1000).toFixed(1)} s`;
  el.textContent = text;
}

export function fmtTime(t) {
  if (!t) return '—';
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? t : d.toLocaleString();
}

export function fmtMs(ms) {
  if (ms === undefined || ms === null) return '—';
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 120) return `${s % 1 ? s.toFixed(1) : s} s (${ms} ms)`;
  const m = s / 60;
  return `${m % 1 ? m.toFixed(1) : m} min (${ms} ms)`;
}

/** A heading for a view, focused after navigation so screen readers announce it. */
export function title(text, sub) {
  return h('header', { class: 'view-head' }, h('h1', { tabindex: '-1' }, text), sub ? h('p', { class: 'sub' }, sub) : null);
}

/** A reason {code, message} or a string, in words. */
export function reasonText(r) {
  if (!r) return '';
  if (typeof r === 'string') return r;
  if (r.message && r.code) return `${r.message} (${r.code})`;
  return r.message ?? r.code ?? JSON.stringify(r);
}
