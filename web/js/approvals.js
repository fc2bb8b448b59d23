// Approvals inbox: every pending approval of the signed-in user, live over
// GET /v1/approvals/stream (snapshots of the inbox's first page; the following pages are read
// with GET /v1/approvals and the snapshot's next_cursor). Each card shows exactly what will
// run — tool, call id, input hash, canonical input; for the terminal the command, the real
// cwd (flagged when outside the workspace), env and timeout; for edits the diff preview, the
// frozen precondition and any path with invisible or look-alike characters (escaped, each
// character's code point listed) — and Approve sends back exactly the triple the card displays.
// A four-eyes approval names its requester and its rule: its requester cannot approve it
// (another person must), while an admin or approver sees other users' four-eyes approvals
// here and may decide them.

import { get, post, seg, ApiError, authHeaders, errorFrom } from './api.js';
import { follow, json } from './sse.js';
import { h, fill, dl, jsonBlock, code, shown, escapeInvisible, badge, announce, errorBox, streamState, fmtTime, fmtMs, title } from './ui.js';

/** Most pages read after a snapshot's first (200 approvals or 1 MiB of stored inputs each). */
const MORE_PAGES = 20;

/** The app-wide inbox: one stream while signed in; views subscribe to its snapshots. */
export const inbox = {
  approvals: null,
  /** Counts snapshots: reading a snapshot's following pages stops when a newer one came. */
  generation: 0,
  state: { state: 'connecting' },
  listeners: new Set(),
  stream: null,
  poll: null,
  start(onCount) {
    this.stop();
    this.onCount = onCount;
    this.stream = follow('/v1/approvals/stream', {
      onEvent: (ev) => {
        if (ev.event === 'approvals') {
          const list = json(ev);
          if (list) this.whole(list);
        } else if (ev.event === 'error') {
          const e = json(ev);
          this.setState({ state: 'reconnecting', error: new ApiError({ status: 0, code: e?.code ?? 'stream_error', message: e?.message ?? 'the stream reported an error', method: 'GET', path: '/v1/approvals/stream' }) });
        }
      },
      onState: (s) => {
        if (s.state === 'failed' && s.error?.missingRoute) {
          // A server without the inbox stream: fall back to polling the list.
          this.setState({ state: 'polling' });
          this.startPolling();
          return;
        }
        this.setState(s);
      },
    });
  },
  startPolling() {
    const tick = async () => {
      try { await this.whole(await get('/v1/approvals?status=pending&limit=200')); this.setState({ state: 'polling' }); }
      catch (err) { this.setState({ state: 'reconnecting', error: err }); }
    };
    tick();
    this.poll = setInterval(tick, 3000);
  },
  stop() {
    if (this.stream) this.stream.close();
    if (this.poll) clearInterval(this.poll);
    this.stream = null; this.poll = null; this.approvals = null;
    this.generation += 1;
  },
  /**
   * Shows the whole inbox: the first page and the pages after it (a page ends at 200
   * approvals or 1 MiB of stored inputs, so a few large calls can fill one), up to MORE_PAGES
   * more, shown together once read (a partial list would take cards away and bring them
   * back). A newer snapshot (or stop) ends the reading; a page that cannot be read shows the
   * inbox as far as it came, flagged incomplete.
   */
  async whole(first) {
    const generation = ++this.generation;
    let list = first.approvals ?? [];
    let cursor = first.next_cursor ?? null;
    for (let pages = 0; cursor !== null && pages < MORE_PAGES; pages += 1) {
      let page;
      try {
        page = await get(`/v1/approvals?status=pending&limit=200&cursor=${encodeURIComponent(cursor)}`);
      } catch {
        break;
      }
      if (generation !== this.generation) return;
      list = list.concat(page.approvals ?? []);
      cursor = page.next_cursor ?? null;
    }
    if (generation === this.generation) this.set(list, cursor !== null);
  },
  set(list, more = false) {
    this.approvals = list;
    this.more = more;
    this.onCount?.(more ? `${list.length}+` : list.length);
    for (const l of this.listeners) l.snapshot(list, more);
  },
  setState(s) {
    this.state = s;
    document.documentElement.dataset.inboxState = s.state;
    for (const l of this.listeners) l.state(s);
  },
  subscribe(l) {
    this.listeners.add(l);
    l.state(this.state);
    if (this.approvals) l.snapshot(this.approvals, this.more);
    return () => this.listeners.delete(l);
  },
};

export async function mount(root) {
  const status = h('p', { class: 'stream-state', 'aria-live': 'off', id: 'inbox-state' });
  const list = h('div', { class: 'cards', id: 'approvals' });
  const empty = h('p', { class: 'empty', hidden: true }, 'No approval is waiting. New requests appear here as soon as a call is frozen.');
  const more = h('p', { class: 'more', id: 'inbox-more', hidden: true }, 'More approvals are pending than this page shows: they appear as these are decided.');
  const decided = h('ul', { class: 'decided', 'aria-label': 'Decided in this session' });
  root.append(
    title('Approvals', 'Calls waiting for your decision. What you see is exactly what will run, once.'),
    status, empty, list, more,
    h('section', { 'aria-labelledby': 'decided-title' }, h('h2', { id: 'decided-title' }, 'Decided here'), decided),
  );
  const cards = new Map();

  const unsubscribe = inbox.subscribe({
    state: (s) => {
      if (s.state === 'polling') { status.dataset.state = 'open'; status.textContent = 'Live (polling every 3 s: this server has no inbox stream)'; }
      else streamState(status, s);
    },
    snapshot: (approvals, incomplete) => {
      more.hidden = !incomplete;
      const ids = new Set(approvals.map((a) => a.id));
      for (const [id, card] of cards) {
        if (!ids.has(id) && !card.dataset.deciding) {
          if (card.contains(document.activeElement)) root.querySelector('h1')?.focus();
          card.remove();
          cards.delete(id);
          if (!card.dataset.decided) announce(`Approval for ${card.dataset.tool} is no longer pending`);
        }
      }
      let added = 0;
      for (const a of approvals) {
        if (cards.has(a.id)) continue;
        const card = approvalCard(a, (outcome) => {
          decided.prepend(h('li', {}, outcome));
        });
        cards.set(a.id, card);
        list.appendChild(card);
        added += 1;
      }
      if (added) announce(`${added} new approval${added > 1 ? 's' : ''} waiting`);
      empty.hidden = cards.size > 0;
    },
  });
  return unsubscribe;
}

/** Parses the facts of the terminal tool's approval (input + preview). */
function terminalFacts(inv, tool) {
  const input = inv.input ?? {};
  if (input.action && input.action !== 'start') {
    const s = tool?.session ?? {};
    return [
      ['Action', code(input.action)],
      ['Session', s.id ? code(s.id) : code(input.session_id)],
      s.command_line ? ['Session command', code(s.command_line)] : null,
      s.cwd ? ['Session cwd', code(s.cwd)] : null,
      input.data !== undefined ? ['Bytes to send', h('pre', { class: 'json' }, shown(JSON.stringify(input.data)))] : null,
      input.signal ? ['Signal', code(input.signal)] : null,
      input.cols ? ['Size', shown(`${input.cols} × ${input.rows}`)] : null,
      input.timeout_ms !== undefined ? ['Timeout', fmtMs(input.timeout_ms)] : null,
    ].filter(Boolean);
  }
  const cwd = input.cwd ?? tool?.cwd;
  const outside = tool?.cwd_outside_workspace ?? (tool?.workspace && cwd ? !(`${cwd}/`).startsWith(`${tool.workspace.replace(/\/$/, '')}/`) : undefined);
  const cmd = tool?.command_line ?? [input.program ?? input.command, ...(input.args ?? [])].filter(Boolean).join(' ');
  const env = input.env && typeof input.env === 'object' ? input.env : null;
  const setByCall = new Set(Object.keys(tool?.env_set_by_call ?? {}));
  const envTable = env ? h('table', { class: 'env' },
    h('caption', { class: 'visually-hidden' }, 'Environment of the process'),
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Variable'), h('th', { scope: 'col' }, 'Value'))),
    h('tbody', {}, Object.keys(env).sort().map((k) => h('tr', { class: setByCall.has(k) ? 'set-by-call' : '' },
      h('th', { scope: 'row' }, code(k), setByCall.has(k) ? h('span', { class: 'tag' }, ' set by this call') : null),
      h('td', {}, env[k] === null ? h('em', {}, 'removed') : code(String(env[k]))))))) : 'inherited (none given)';
  return [
    ['Command', code(cmd || '(default shell)', 'command')],
    input.program && input.program !== input.command ? ['Program', code(input.program)] : null,
    ['Working directory', h('span', {}, code(cwd, 'cwd'), outside ? h('strong', { class: 'flag-outside', role: 'note' }, ' ⚠ Outside the workspace') : null,
      tool?.workspace ? h('span', { class: 'hint' }, ' (workspace ', shown(tool.workspace), ')') : null)],
    ['Environment', envTable],
    ['Timeout', fmtMs(input.timeout_ms ?? tool?.timeout_ms)],
  ].filter(Boolean);
}

// --- Sandbox of a terminal start (issue 13): what the process may touch, from the frozen
// canonical input, so the approver sees the very sandbox the hash covers. ---
function fmtBytes(n) {
  if (typeof n !== 'number') return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0; let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${Number.isInteger(v) ? v : v.toFixed(1)} ${units[i]}`;
}

function pathList(list) {
  return list?.length ? h('ul', { class: 'paths' }, list.map((p) => h('li', {}, code(p)))) : 'none';
}

function sandboxFacts(sb) {
  if (!sb.enforced) {
    return [['Sandbox', h('strong', { class: 'flag-outside', role: 'note' }, '⚠ Not sandboxed: runs with the server\'s own access')],
      sb.reason ? ['Why', shown(sb.reason)] : null].filter(Boolean);
  }
  const net = sb.network ?? {};
  const netText = net.mode === 'deny_tcp_connect' ? `open, except TCP connect to port${net.ports.length > 1 ? 's' : ''} ${net.ports.join(', ')}`
    : net.mode === 'private' ? 'none (a private network namespace: its own loopback only)' : 'open (every address and port)';
  const lim = sb.limits ?? {};
  return [
    ['Read-write', pathList(sb.read_write)],
    ['Read-only', pathList(sb.read_only)],
    ['Hidden', pathList(sb.hidden)],
    sb.private ? ['Private', shown(`${sb.private.tmp} (${fmtBytes(sb.private.tmp_bytes)}), HOME ${sb.private.home}; /proc: ${sb.private.proc}`)] : null,
    ['Network', netText],
    ['Limits', [lim.pids_max ? `${lim.pids_max} processes` : 'no process limit', lim.memory_max_bytes ? `${fmtBytes(lim.memory_max_bytes)} memory` : 'no memory limit', `tree kill: ${lim.tree_kill ?? '—'}`].join(' · ')],
  ].filter(Boolean);
}

/** Whitespace made visible: a space as '·', a tab as '→', in a marked span saying how many. */
function wsRun(ws, what) {
  return h('span', { class: 'ws-run', title: `${ws.length} whitespace characters (${what})`, dataset: { ws: what } },
    ws.replaceAll(' ', '·').replaceAll('\t', '→'));
}

/**
 * The text of one diff line (after its +/-/space marker): escaped as shown() does, with runs of
 * 8 or more spaces or tabs inside the line marked (they can push code out of sight), and, on an
 * added line, trailing whitespace marked. The indentation at the start stays as it is.
 */
function diffText(text, added) {
  const esc = escapeInvisible(text, '\t');
  const parts = [];
  const indent = esc.match(/^[ \t]*/)[0];
  const body = esc.slice(indent.length);
  const trail = added ? body.match(/[ \t]*$/)[0] : '';
  const middle = body.slice(0, body.length - trail.length);
  if (added && !body) return indent ? [wsRun(indent, 'trailing')] : [];
  if (indent) parts.push(indent);
  let at = 0;
  for (const m of middle.matchAll(/[ \t]{8,}/g)) {
    parts.push(middle.slice(at, m.index), wsRun(m[0], 'run'));
    at = m.index + m[0].length;
  }
  parts.push(middle.slice(at));
  if (trail) parts.push(wsRun(trail, 'trailing'));
  const joined = parts.filter((p) => p !== '');
  return esc === text ? joined : h('span', { class: 'escaped', dataset: { escaped: 'true' } }, joined);
}

/** A unified diff with added/removed lines marked (not by colour alone: the +/- stays). */
function diffBlock(diff, label) {
  const lines = diff.split('\n');
  return h('pre', { class: 'diff', tabindex: '0', 'aria-label': label },
    lines.map((l) => {
      const file = l.startsWith('+++') || l.startsWith('---');
      const cls = file ? 'd-file' : l.startsWith('@@') ? 'd-hunk' : l.startsWith('+') ? 'd-add' : l.startsWith('-') ? 'd-del' : 'd-ctx';
      const content = file || cls === 'd-hunk' ? shown(l, '\t') : [l.slice(0, 1), diffText(l.slice(1), cls === 'd-add')];
      return h('span', { class: cls }, content, '\n');
    }));
}

/** A frozen target state (`precondition`) in words. */
function stateText(s) {
  if (!s) return 'not recorded';
  if (s.state === 'absent') return 'does not exist';
  if (s.state === 'file') return escapeInvisible(`file with sha256 ${s.sha256}`);
  if (s.state === 'directory') return escapeInvisible(`directory with manifest sha256 ${s.manifest_sha256}`);
  return escapeInvisible(JSON.stringify(s));
}

/** The frozen precondition of an edit: the state the preview showed, required at execution. */
function preconditionText(p) {
  if (p.from || p.to) return `source ${stateText(p.from)}; destination ${stateText(p.to)}`;
  return `target ${stateText(p)}`;
}

const FLAG_WORDS = {
  invisible: 'invisible character',
  bidi_control: 'bidirectional control (reorders the text)',
  control: 'control character',
  whitespace: 'unusual whitespace',
  edge_whitespace: 'space at the start or end of a name',
  lookalike: 'look-alike character',
  not_nfc: 'decomposed character (not NFC)',
};

/** A path field shown so that it cannot pass for another path: escaped when flagged. */
function pathValue(tool, field) {
  const flagged = (tool.path_flags ?? []).find((f) => f.field === field);
  if (!flagged) return code(tool[field]);
  return h('span', {}, code(flagged.escaped, 'path-escaped'), h('strong', { class: 'flag-outside', role: 'note' }, ' ⚠ Look-alike characters'));
}

/**
 * The look-alike block: every path of the call with invisible, bidirectional, control or
 * look-alike characters, or not in NFC — each character with its code point.
 */
function pathFlagsBlock(flags) {
  return h('section', { class: 'path-flags', role: 'note', 'aria-label': 'Paths with look-alike characters' },
    h('h3', {}, '⚠ These paths are not what they look like'),
    h('ul', {}, flags.map((f) => h('li', { dataset: { field: f.field } },
      code(f.field), ': ', code(f.escaped, 'path-escaped'),
      f.nfc ? h('span', {}, ' (NFC form ', code(f.nfc), ')') : null,
      h('ul', {}, f.flags.map((c) => h('li', { dataset: { codePoint: c.code_point, kind: c.kind } },
        code(c.code_point), ` ${FLAG_WORDS[c.kind] ?? c.kind} at character ${c.char_index}`,
        c.looks_like ? h('span', {}, ' — looks like ', code(c.looks_like)) : null)))))));
}

/** A size in words: "48 KB (49 152 bytes)". */
function sizeWords(n) {
  if (typeof n !== 'number') return '? bytes';
  return n < 1000 ? `${n} bytes` : `${fmtBytes(n)} (${n} bytes)`;
}

/** What a file or directory (move_path's `source`, delete_path's preview) holds, in words. */
function entryWords(e) {
  if (!e) return null;
  if (e.kind === 'directory' && e.tree) return treeWords(e.tree);
  if (e.kind === 'file') return `file · sha256 ${e.sha256 ?? '—'} · ${sizeWords(e.size)}`;
  return e.kind ?? '—';
}

/** A directory tree (files, folders, bytes, the first entries) in words. */
function treeWords(t) {
  return h('span', { class: 'tree' },
    `directory with ${t.files ?? '?'} file(s), ${t.dirs ?? '?'} folder(s)${t.others ? `, ${t.others} other entr${t.others > 1 ? 'ies' : 'y'}` : ''}, ${sizeWords(t.bytes)}`,
    t.truncated ? h('strong', { class: 'flag-outside', role: 'note' }, ' ⚠ More entries than counted (the walk stopped)') : null,
    t.sample?.length ? h('ul', { class: 'paths' }, t.sample.map((p) => h('li', {}, code(p)))) : null);
}

/** move_path and delete_path facts: what is moved or deleted, what is overwritten. */
function moveDeleteFacts(tool, input) {
  if (tool.action === 'move_path') {
    const over = tool.overwrites;
    return [
      tool.source ? ['Moves', entryWords(tool.source)] : null,
      ['Overwrite allowed', input?.overwrite ? 'yes' : 'no'],
      over ? ['Overwrites', h('strong', { class: 'flag-outside overwrites', role: 'note' }, '⚠ overwrites ', code(tool.to), ` (${sizeWords(over.size)}, sha256 ${over.sha256 ?? '—'})`)]
        : ['Overwrites', 'nothing (the destination does not exist)'],
    ];
  }
  if (tool.action === 'delete_path') {
    const recursive = tool.kind === 'directory' || input?.recursive;
    return [
      ['Deletes', tool.kind === 'directory' ? treeWords(tool.tree ?? {}) : entryWords(tool)],
      recursive ? ['Recursive', h('strong', { class: 'flag-outside recursive', role: 'note' }, '⚠ Recursive: the folder and everything in it is deleted')] : null,
    ];
  }
  return [];
}

function editFacts(tool, input) {
  const facts = [
    tool.action ? ['Edit', code(tool.action)] : null,
    tool.path ? ['Path', pathValue(tool, 'path')] : null,
    tool.resolved_path ? ['Resolved path', code(tool.resolved_path)] : null,
    tool.from ? ['From', pathValue(tool, 'from')] : null,
    tool.to ? ['To', pathValue(tool, 'to')] : null,
    tool.creates !== undefined ? ['Creates the file', tool.creates ? 'yes' : 'no (overwrites)'] : null,
    tool.create_dirs?.length ? ['Creates folders', shown(tool.create_dirs.join(', '))] : null,
    tool.before ? ['Before', `sha256 ${tool.before.sha256 ?? '—'} · ${tool.before.size ?? '?'} bytes`] : null,
    tool.after ? ['After', `sha256 ${tool.after.sha256 ?? '—'} · ${tool.after.size ?? '?'} bytes`] : null,
    tool.diff_summary ? ['Change', `+${tool.diff_summary.lines_added} −${tool.diff_summary.lines_removed} lines in ${tool.diff_summary.hunks} hunk(s)`] : null,
    ...moveDeleteFacts(tool, input),
    tool.note ? ['Note', shown(tool.note)] : null,
    tool.precondition ? ['Runs only if', h('span', { class: 'precondition' }, preconditionText(tool.precondition),
      h('span', { class: 'hint' }, ' (frozen in the input; otherwise nothing is written: stale_target)'))] : null,
  ].filter(Boolean);
  return facts;
}

/** The approval rule block: requester, rule and whether another person is needed. */
function fourEyesBlock(a) {
  if (a.rule !== 'four_eyes') return null;
  const pending = a.status === 'pending';
  // A pending four-eyes approval the viewer cannot grant is the viewer's own (nobody else sees it).
  const mine = pending && !a.may_grant;
  const who = a.requested_by ?? {};
  const note = !pending ? null
    : mine ? h('p', { class: 'needs-other', role: 'note', id: `needs-other-${a.id}` },
      h('strong', {}, 'Needs another person: '), 'an admin or approver other than you must approve this call. You may still deny it (withdraw the call).')
      : h('p', { class: 'second-person', role: 'note' }, h('strong', {}, 'You are the second person: '), shown(who.name ?? 'another user'), ' asked for this call; approving it runs it once.');
  return h('section', { class: 'what-runs four-eyes', dataset: { rule: a.rule, requester: who.user_id ?? '' } },
    h('h3', {}, 'Four-eyes approval'),
    dl([
      ['Requested by', h('span', { class: 'requester' }, shown(who.name ?? '?'), mine ? ' (you)' : '', ' ', h('span', { class: 'hint' }, who.user_id ?? ''))],
      ['Rule', h('span', { class: 'rule' }, a.rule_domain ? `four-eyes for ${a.rule_domain} calls: granted by a person other than the requester (an admin or approver)` : 'four-eyes: granted by a person other than the requester (an admin or approver)')],
    ]),
    note);
}

// --- Computer use (issue 19): browser_click_at, _scroll_at, _type_at, _drag (and their
// attached_browser_* forms) are bound to a screenshot. The card draws that screenshot (fetched
// from GET /v1/approvals/{id}/screenshot, its SHA-256 checked against the frozen one when the
// page can hash) with the point(s) of the call marked, and says the same in words. ---

/** The point(s) of a computer-use call in words (the canvas's text alternative). */
function gestureWords(tool) {
  const p = tool.points?.[0] ?? tool.point ?? {};
  const onEl = (el) => (el?.role ? ` on ${el.role}${el.name ? ` “${el.name}”` : ''}` : '');
  const on = onEl(tool.element_at_point);
  switch (tool.gesture) {
    case 'scroll': return `Scroll by (${tool.delta?.x ?? 0}, ${tool.delta?.y ?? 0}) px at (${p.x}, ${p.y})${on}`;
    case 'type': return `Click at (${p.x}, ${p.y})${on}, then type ${JSON.stringify(tool.text ?? '')}`;
    case 'drag': {
      const to = tool.points?.[1] ?? tool.to ?? {};
      return `Drag from (${p.x}, ${p.y})${on} to (${to.x}, ${to.y})${onEl(tool.element_at_target)}`;
    }
    default: return `Click at (${p.x}, ${p.y})${on}`;
  }
}

/** An arrow from (x1, y1) to (x2, y2). */
function arrow(ctx, x1, y1, x2, y2) {
  const angle = Math.atan2(y2 - y1, x2 - x1);
  ctx.beginPath(); ctx.moveTo(x1, y1); ctx.lineTo(x2, y2); ctx.stroke();
  ctx.beginPath(); ctx.moveTo(x2, y2);
  ctx.lineTo(x2 - 12 * Math.cos(angle - 0.45), y2 - 12 * Math.sin(angle - 0.45));
  ctx.lineTo(x2 - 12 * Math.cos(angle + 0.45), y2 - 12 * Math.sin(angle + 0.45));
  ctx.closePath(); ctx.fill();
}

/** Marks the call's points on the drawn screenshot: a ring and cross-hair at each point, the drag's path, the scroll's direction. */
function drawMarks(ctx, tool) {
  const points = tool.points ?? (tool.point ? [tool.point] : []);
  ctx.lineWidth = 3;
  ctx.strokeStyle = '#d00';
  ctx.fillStyle = '#d00';
  if (tool.gesture === 'drag' && points.length === 2) arrow(ctx, points[0].x, points[0].y, points[1].x, points[1].y);
  if (tool.gesture === 'scroll' && tool.delta) {
    const len = Math.hypot(tool.delta.x, tool.delta.y) || 1;
    const k = Math.min(60, len) / len;
    arrow(ctx, points[0].x, points[0].y, points[0].x + tool.delta.x * k, points[0].y + tool.delta.y * k);
  }
  points.forEach((p, i) => {
    // White under red: the mark stays visible on any background.
    for (const [style, width] of [['#fff', 6], ['#d00', 3]]) {
      ctx.strokeStyle = style; ctx.lineWidth = width;
      ctx.beginPath(); ctx.arc(p.x, p.y, 14, 0, 2 * Math.PI); ctx.stroke();
      ctx.beginPath(); ctx.moveTo(p.x - 22, p.y); ctx.lineTo(p.x - 6, p.y); ctx.moveTo(p.x + 6, p.y); ctx.lineTo(p.x + 22, p.y);
      ctx.moveTo(p.x, p.y - 22); ctx.lineTo(p.x, p.y - 6); ctx.moveTo(p.x, p.y + 6); ctx.lineTo(p.x, p.y + 22); ctx.stroke();
    }
    ctx.font = 'bold 14px sans-serif';
    const label = `${i + 1} ${p.action ?? ''}`.trim();
    ctx.lineWidth = 4; ctx.strokeStyle = '#fff'; ctx.strokeText(label, p.x + 18, p.y - 18);
    ctx.fillStyle = '#d00'; ctx.fillText(label, p.x + 18, p.y - 18);
  });
}

/** SHA-256 of bytes as hex, or null where the page cannot hash (not a secure context). */
async function sha256Hex(buf) {
  if (!globalThis.crypto?.subtle) return null;
  const d = new Uint8Array(await crypto.subtle.digest('SHA-256', buf));
  return Array.from(d, (b) => b.toString(16).padStart(2, '0')).join('');
}

function screenshotBlock(a, tool) {
  const shot = tool.screenshot;
  const words = gestureWords(tool);
  const canvas = h('canvas', { class: 'shot', width: shot.width, height: shot.height, role: 'img', 'aria-label': escapeInvisible(`Screenshot ${shot.screenshot_id} of ${tool.url ?? 'the page'}: ${words}`) });
  const state = h('p', { class: 'hint', 'aria-live': 'polite' }, 'Loading the screenshot…');
  const load = async () => {
    const path = `/v1/approvals/${seg(a.id)}/screenshot`;
    try {
      let resp;
      try {
        resp = await fetch(path, { headers: authHeaders({ Accept: 'image/png' }), cache: 'no-store' });
      } catch (err) {
        throw new ApiError({ status: 0, code: 'network_error', message: `the server could not be reached (${err.message})`, method: 'GET', path });
      }
      if (!resp.ok) throw await errorFrom(resp, 'GET', path);
      const bytes = await resp.arrayBuffer();
      const sha = await sha256Hex(bytes);
      if (sha !== null && sha !== shot.sha256) {
        fill(state, h('strong', { class: 'flag-outside', role: 'note' }, `⚠ The image served (sha256 ${sha}) is not the screenshot this call is bound to; it is not shown.`));
        return;
      }
      const bitmap = await createImageBitmap(new Blob([bytes], { type: 'image/png' }));
      const ctx = canvas.getContext('2d');
      ctx.drawImage(bitmap, 0, 0);
      drawMarks(ctx, tool);
      canvas.dataset.drawn = 'true';
      fill(state, sha ? `The screenshot the call is bound to (sha256 checked), point${(tool.points?.length ?? 1) > 1 ? 's' : ''} marked in red.` : 'The screenshot the call is bound to, point(s) marked in red.');
    } catch (err) {
      fill(state, errorBox(err, 'Could not load the screenshot'));
    }
  };
  load();
  return h('section', { class: 'what-runs computer-use', dataset: { gesture: tool.gesture ?? 'click' } },
    h('h3', {}, 'Computer use'),
    dl([
      ['Action', h('span', { class: 'gesture' }, shown(words))],
      tool.url ? ['Page', code(tool.url)] : null,
      ['Screenshot', h('span', {}, code(shot.screenshot_id), ` · ${shot.width} × ${shot.height} · sha256 `, code(shot.sha256, 'screenshot-sha256'))],
      shot.invocation_id ? ['Evidence', h('span', {}, `${shot.evidence_kind ?? 'browser_screenshot'} of invocation `, code(shot.invocation_id))] : null,
      tool.gesture === 'type' ? ['Text typed', h('pre', { class: 'json' }, shown(JSON.stringify(tool.text ?? '')))] : null,
    ].filter(Boolean)),
    canvas, state);
}

function approvalCard(a, onDecided) {
  const inv = a.invocation;
  // The triple is taken from the very object this card renders, so what is sent is what is shown.
  const triple = { tool_id: inv.tool_id, tool_call_id: inv.tool_call_id, input_hash: inv.input_hash };
  const tool = a.preview?.tool ?? null;
  const reasons = a.preview?.reasons ?? [];
  const headingId = `apr-${a.id}`;
  const result = h('div', { class: 'result', 'aria-live': 'polite' });
  const reason = h('input', { type: 'text', id: `deny-reason-${a.id}`, maxlength: '2000', placeholder: 'optional' });
  const ownFourEyes = a.rule === 'four_eyes' && a.status === 'pending' && !a.may_grant;
  const foreign = a.rule === 'four_eyes' && a.status === 'pending' && a.may_grant;
  const approveBtn = h('button', { type: 'button', class: 'approve', 'aria-describedby': ownFourEyes ? `needs-other-${a.id} sends-${a.id}` : `sends-${a.id}`, disabled: ownFourEyes || undefined }, 'Approve');
  const denyBtn = h('button', { type: 'button', class: 'deny danger' }, 'Deny');

  const sections = [];
  const fourEyes = fourEyesBlock(a);
  if (fourEyes) sections.push(fourEyes);
  const isTerminal = inv.tool_id === 'terminal_session' || (tool && ('cwd_outside_workspace' in tool || 'command_line' in tool || 'session' in tool));
  if (isTerminal) sections.push(h('section', { class: 'what-runs' }, h('h3', {}, 'Terminal'), dl(terminalFacts(inv, tool))));
  if (isTerminal && inv.input?.sandbox) sections.push(h('section', { class: 'what-runs sandbox' }, h('h3', {}, 'Sandbox'), dl(sandboxFacts(inv.input.sandbox))));
  if (tool && typeof tool.diff === 'string') {
    sections.push(h('section', { class: 'what-runs' }, h('h3', {}, 'Edit'), dl(editFacts(tool, inv.input)),
      tool.diff ? diffBlock(tool.diff, escapeInvisible(`Diff preview of ${tool.path ?? 'the edit'}`)) : h('p', {}, 'No change in content.'),
      tool.diff_truncated ? h('p', { class: 'hint' }, 'The diff was cut for the preview; the canonical input below is complete.') : null));
  } else if (tool && tool.action && !isTerminal) {
    sections.push(h('section', { class: 'what-runs' }, h('h3', {}, 'Edit'), dl(editFacts(tool, inv.input))));
  }
  if (tool && Array.isArray(tool.path_flags) && tool.path_flags.length) sections.push(pathFlagsBlock(tool.path_flags));
  if (tool && tool.screenshot && tool.screenshot.sha256) sections.push(screenshotBlock(a, tool));
  const isMcp = Boolean(tool && tool.mcp_server_id);
  if (isMcp) {
    sections.push(h('section', { class: 'what-runs' }, h('h3', {}, 'External MCP call'), dl([
      ['Server', h('span', {}, shown(tool.mcp_server ?? ''), ' ', h('a', { href: `#/mcp/${encodeURIComponent(tool.mcp_server_id)}` }, shown(tool.mcp_server_id)))],
      ['MCP tool', code(tool.mcp_tool)],
      tool.definition ? ['Definition the call is frozen against', h('span', { class: 'mcp-definition' }, shown(tool.definition.description ?? '—', '\n\t'), ' ', code(tool.definition_sha256 ?? ''))] : null,
      ['Server annotations', tool.annotations ? jsonBlock(tool.annotations, 'MCP annotations') : 'none'],
      tool.note ? ['Note', shown(tool.note)] : null,
    ].filter(Boolean))));
  }
  if (tool && !isTerminal && !isMcp && typeof tool.diff !== 'string' && !tool.action) {
    sections.push(h('section', {}, h('h3', {}, 'Tool preview'), jsonBlock(tool, 'Tool preview')));
  }

  const card = h('article', { class: 'card approval', 'aria-labelledby': headingId, dataset: { approvalId: a.id, tool: inv.tool_id } },
    h('h2', { id: headingId }, code(inv.tool_id, 'tool-id'), ' ', badge(a.status)),
    reasons.length ? h('ul', { class: 'reasons' }, reasons.map((r) => h('li', {}, shown(typeof r === 'string' ? r : JSON.stringify(r))))) : null,
    dl([
      ['Tool', code(inv.tool_id, 'tool-id')],
      ['Call id', code(inv.tool_call_id, 'call-id')],
      ['Input hash', code(inv.input_hash, 'input-hash')],
      ['Invocation', code(inv.invocation_id)],
      // Another user's run (a four-eyes approval seconded here) is not the viewer's to open.
      ['Run', foreign ? code(a.run_id) : h('a', { href: `#/runs/${encodeURIComponent(a.run_id)}` }, a.run_id)],
      ['Requested', fmtTime(a.created_at)],
      ['Expires', fmtTime(a.expires_at)],
    ]),
    sections,
    h('details', { open: true }, h('summary', {}, 'Canonical input (what is hashed and run)'), jsonBlock(inv.input, 'Canonical input')),
    h('p', { class: 'sends', id: `sends-${a.id}` }, 'Approve sends exactly: tool ', code(triple.tool_id), ', call ', code(triple.tool_call_id), ', hash ', code(triple.input_hash), '.'),
    h('div', { class: 'actions' }, approveBtn,
      h('span', { class: 'deny-group' }, h('label', { for: `deny-reason-${a.id}` }, 'Reason to deny'), reason, denyBtn)),
    result,
  );
  // Anything shown escaped (or flagged by the server): said at the top of the card, in words.
  const textFlags = Array.isArray(tool?.text_flags) ? tool.text_flags : [];
  if (card.querySelector('[data-escaped]') || textFlags.length) {
    card.querySelector('h2').after(h('p', { class: 'flag-outside escaped-warning', role: 'note' },
      '⚠ This call contains invisible or direction-changing characters, shown escaped as \\u{…}',
      textFlags.length ? ` (${textFlags.map((k) => FLAG_WORDS[k] ?? k).join(', ')})` : '', '.'));
  }

  const decide = async (kind) => {
    approveBtn.disabled = true; denyBtn.disabled = true;
    card.dataset.deciding = 'true';
    fill(result, kind === 'grant' ? 'Sending the approval…' : 'Sending the denial…');
    try {
      const path = `/v1/approvals/${seg(a.id)}/${kind}`;
      const body = kind === 'grant' ? triple : (reason.value.trim() ? { reason: reason.value.trim() } : {});
      const out = await post(path, body);
      card.dataset.decided = out.status;
      const words = escapeInvisible(out.status === 'granted' ? `Approved ${inv.tool_id} (${inv.tool_call_id}); it runs once.` : `Denied ${inv.tool_id} (${inv.tool_call_id}).`);
      const follow = foreign ? null : h('a', { href: `#/runs/${encodeURIComponent(a.run_id)}` }, 'Follow it in the run timeline.');
      fill(result, h('p', { class: 'ok' }, words, follow ? ' ' : null, follow));
      announce(words);
      onDecided(h('span', {}, badge(out.status), ' ', code(inv.tool_id), ' ', code(inv.tool_call_id),
        foreign ? [' · requested by ', shown(a.requested_by?.name ?? '?')] : [' · ', h('a', { href: `#/runs/${encodeURIComponent(a.run_id)}` }, 'timeline')]));
      setTimeout(() => {
        delete card.dataset.deciding;
        if (inbox.approvals?.some((x) => x.id === a.id)) return;
        if (card.contains(document.activeElement)) card.closest('.view')?.querySelector('h1')?.focus();
        card.remove();
      }, 4000);
    } catch (err) {
      delete card.dataset.deciding;
      const hint = {
        approval_mismatch: 'The frozen call differs from what this card shows; nothing was approved.',
        approval_decided: 'Someone already decided this approval.',
        approval_expired: 'The approval expired before the decision.',
        four_eyes_required: 'This call needs another person: an admin or approver other than its requester must approve it.',
      }[err.code];
      fill(result, errorBox(err, hint ?? 'The decision was not recorded'));
      const over = err.code === 'approval_decided' || err.code === 'approval_expired';
      approveBtn.disabled = over || ownFourEyes || err.code === 'four_eyes_required';
      denyBtn.disabled = over;
    }
  };
  approveBtn.addEventListener('click', () => decide('grant'));
  denyBtn.addEventListener('click', () => decide('deny'));
  return card;
}
