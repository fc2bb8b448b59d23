// Runs and the run timeline: every event of the run — exposures, invocations with their live
// status, approvals, results, evidence with accept / reject — in order, arriving over
// GET /v1/runs/{id}/events and resuming after a reconnect with Last-Event-ID (nothing lost,
// nothing shown twice).

import { get, post, seg } from './api.js';
import { follow, json } from './sse.js';
import { h, put, fill, dl, jsonBlock, code, badge, announce, errorBox, streamState, fmtTime, title } from './ui.js';

export async function mount(root, route) {
  return route.id ? timeline(root, route.id) : runList(root);
}

async function runList(root) {
  const table = h('tbody');
  const more = h('button', { type: 'button', class: 'secondary', hidden: true }, 'Load more');
  const msg = h('div');
  root.append(title('Runs', 'Newest first. Open one to follow its timeline live.'), msg,
    h('div', { class: 'table-wrap' }, h('table', { class: 'list' },
      h('caption', { class: 'visually-hidden' }, 'Runs'),
      h('thead', {}, h('tr', {}, ['Run', 'Title', 'Events', 'Created'].map((c) => h('th', { scope: 'col' }, c)))),
      table)), more);
  let cursor = null;
  const load = async () => {
    try {
      const page = await get(`/v1/runs?limit=50${cursor ? `&cursor=${seg(cursor)}` : ''}`);
      for (const r of page.runs) {
        table.appendChild(h('tr', {}, h('td', {}, h('a', { href: `#/runs/${encodeURIComponent(r.id)}` }, r.id)),
          h('td', {}, r.title ?? '—'), h('td', {}, String(r.last_event_id)), h('td', {}, fmtTime(r.created_at))));
      }
      if (!table.children.length) fill(msg, h('p', { class: 'empty' }, 'No runs yet. A Planner opens one with POST /v1/runs.'));
      cursor = page.next_cursor;
      more.hidden = !cursor;
    } catch (err) { fill(msg, errorBox(err, 'Could not list runs')); }
  };
  more.addEventListener('click', load);
  await load();
}

const STATUS_OF = {
  'invocation.frozen': (d) => d.status,
  'approval.requested': () => 'awaiting_approval',
  'approval.granted': () => 'queued',
  'approval.denied': () => 'denied',
  'approval.expired': () => 'expired',
  'invocation.cancelled': () => 'cancelled',
  'execution.started': () => 'running',
  'execution.completed': (d) => d.status ?? 'completed',
  'execution.failed': (d) => d.status ?? 'failed',
};

async function timeline(root, runId) {
  const state = h('p', { class: 'stream-state', id: 'timeline-state' });
  const log = h('ol', { class: 'timeline', id: 'timeline', 'aria-label': 'Run events, oldest first' });
  const head = h('div');
  root.append(title(`Run ${runId}`, 'Events in order, live. Evidence can be accepted or rejected here.'), head, state, log);
  try {
    const run = await get(`/v1/runs/${seg(runId)}`);
    head.append(dl([['Title', run.title ?? '—'], ['Workspace', code(run.workspace_id)], ['Device', run.device_id ?? 'server host'], ['Created', fmtTime(run.created_at)]]));
  } catch (err) {
    head.append(errorBox(err, 'Could not open the run'));
    return null;
  }

  const invocations = new Map(); // invocation id → {badge, entry}
  const evidence = new Map(); // evidence id → element for its acceptance
  let lastSeq = 0;
  let duplicates = 0;
  log.dataset.duplicates = '0';

  const setStatus = (invId, status) => {
    const inv = invocations.get(invId);
    if (!inv || !status) return;
    inv.badge.replaceWith(inv.badge = badge(status));
    inv.entry.dataset.status = status;
  };

  const onEvent = (ev) => {
    const seq = Number(ev.id);
    if (Number.isFinite(seq) && seq <= lastSeq) { duplicates += 1; log.dataset.duplicates = String(duplicates); return; }
    if (Number.isFinite(seq)) lastSeq = seq;
    log.dataset.last = String(lastSeq);
    const d = json(ev) ?? {};
    const entry = h('li', { class: `ev ev-${ev.event.replace('.', '-')}`, dataset: { seq: String(seq), type: ev.event } },
      h('span', { class: 'seq', 'aria-label': `event ${seq}` }, `#${seq}`), ' ', h('span', { class: 'etype' }, ev.event), ' ');
    const body = h('div', { class: 'ev-body' });
    entry.appendChild(body);
    switch (ev.event) {
      case 'exposure.created':
        put(body, `Turn ${d.turn_id}: ${d.tool_ids?.length ?? 0} tools exposed of ${d.candidate_count} candidates, strategy `, code(d.strategy), '. ',
          h('a', { href: `#/tools?run=${encodeURIComponent(runId)}&turn=${encodeURIComponent(d.turn_id)}` }, 'See the exposure'));
        break;
      case 'invocation.frozen': {
        const b = badge(d.status);
        put(body, code(d.tool_id, 'tool-id'), ' call ', code(d.tool_call_id), ' ', b,
          h('details', {}, h('summary', {}, `Input hash ${String(d.input_hash).slice(0, 12)}… and canonical input`), dl([['Input hash', code(d.input_hash)], ['Invocation', code(d.invocation_id)]]), jsonBlock(d.input, 'Canonical input')));
        invocations.set(d.invocation_id, { badge: b, entry });
        entry.dataset.invocation = d.invocation_id;
        entry.dataset.status = d.status;
        break;
      }
      case 'approval.requested':
        put(body, 'Approval requested for ', code(d.tool_id), ' call ', code(d.tool_call_id), ' (expires ', fmtTime(d.expires_at), '). ', h('a', { href: '#/approvals' }, 'Open the inbox'));
        break;
      case 'approval.granted':
        put(body, 'Approved ', code(d.tool_id), ' call ', code(d.tool_call_id), ' with hash ', code(String(d.input_hash).slice(0, 12) + '…'), ` by ${d.decided_by ?? '?'} at ${fmtTime(d.decided_at)}.`);
        break;
      case 'approval.denied':
        put(body, `Denied by ${d.decided_by ?? '?'}${d.reason ? `: “${d.reason}”` : ''}.`);
        break;
      case 'approval.expired':
        put(body, 'Nobody decided in time; the approval expired.');
        break;
      case 'execution.started':
        put(body, 'Started ', code(d.tool_id), ' call ', code(d.tool_call_id), '.');
        break;
      case 'execution.completed':
      case 'execution.failed': {
        put(body, badge(d.status ?? (ev.event === 'execution.completed' ? 'completed' : 'failed')), ' ', code(d.tool_id), ' call ', code(d.tool_call_id),
          d.error ? h('p', { class: 'error' }, `${d.error.message ?? ''} (${d.error.code ?? 'error'})`) : null);
        const out = h('div', { class: 'result' });
        put(body, out);
        get(`/v1/invocations/${seg(d.invocation_id)}`).then((inv) => {
          if (inv.result) put(out, h('details', {}, h('summary', {}, inv.result.ok ? 'Result (ok)' : 'Result (error)'), jsonBlock(inv.result.output ?? inv.result.error, 'Result')));
        }).catch((err) => out.append(errorBox(err, 'Could not load the result')));
        break;
      }
      case 'evidence.recorded': {
        put(body, code(d.kind), ' from ', code(d.tool_id), ' ');
        const slot = h('div', { class: 'evidence', dataset: { evidenceId: d.evidence_id } }, 'Loading the evidence…');
        put(body, slot);
        get(`/v1/evidence/${seg(d.evidence_id)}`).then((e) => fill(slot, evidenceView(e, evidence))).catch((err) => fill(slot, errorBox(err, 'Could not load the evidence')));
        break;
      }
      case 'evidence.accepted': {
        put(body, d.accepted ? 'Evidence accepted' : 'Evidence rejected', ' ', code(d.evidence_id), d.note ? ` — “${d.note}”` : '', '.');
        const slot = evidence.get(d.evidence_id);
        if (slot) slot.set({ accepted: d.accepted, note: d.note });
        break;
      }
      case 'invocation.cancelled':
        put(body, 'Cancelled ', code(d.tool_id), ' call ', code(d.tool_call_id), '.');
        break;
      case 'terminal.output':
        put(body, d.action ? [code(d.action), ' returned '] : 'Terminal output: ',
          d.bytes !== undefined ? `${d.bytes} bytes` : null, d.from_offset !== undefined ? ` (bytes ${d.from_offset}–${d.to_offset})` : null,
          d.state ? [' · session ', badge(d.state)] : null, d.exit_code !== undefined && d.exit_code !== null ? ` · exit code ${d.exit_code}` : null,
          d.session_id ? [' · ', h('a', { href: `#/terminal/${encodeURIComponent(d.session_id)}` }, `watch ${d.session_id}`)] : null);
        break;
      case 'error':
        put(body, h('span', { class: 'error' }, `${d.message ?? 'stream error'} (${d.code ?? 'error'})`));
        break;
      default:
        put(body, jsonBlock(d, ev.event));
    }
    const status = STATUS_OF[ev.event]?.(d);
    if (d.invocation_id && ev.event !== 'invocation.frozen') setStatus(d.invocation_id, status);
    log.appendChild(entry);
    if (ev.event === 'approval.requested' || ev.event === 'evidence.recorded' || ev.event.startsWith('execution.')) announce(`${ev.event.replace('.', ' ')}: ${d.tool_id ?? ''}`);
  };

  const stream = follow(`/v1/runs/${seg(runId)}/events`, {
    onEvent,
    onState: (s) => {
      streamState(state, s);
      state.dataset.reconnects = String(s.reconnects ?? 0);
      if (s.state === 'failed') state.after(errorBox(s.error, 'The live stream stopped'));
    },
  });
  return () => stream.close();
}

/** One piece of evidence with its acceptance and the accept / reject controls. */
function evidenceView(e, registry) {
  const verdict = h('p', { class: 'verdict', 'aria-live': 'polite' });
  const note = h('input', { type: 'text', id: `note-${e.id}`, maxlength: '2000', placeholder: 'optional' });
  const accept = h('button', { type: 'button', class: 'approve' }, 'Accept');
  const reject = h('button', { type: 'button', class: 'danger' }, 'Reject');
  const msg = h('div');
  const set = (a) => {
    if (!a) { fill(verdict, 'Not judged yet.'); return; }
    fill(verdict, badge(a.accepted ? 'accepted' : 'rejected'), a.note ? ` “${a.note}”` : '', a.by ? ` by ${a.by}` : '', a.at ? ` at ${fmtTime(a.at)}` : '');
    verdict.dataset.accepted = String(a.accepted);
  };
  set(e.acceptance);
  registry.set(e.id, { set });
  const judge = async (accepted) => {
    accept.disabled = true; reject.disabled = true;
    fill(msg);
    try {
      const out = await post(`/v1/evidence/${seg(e.id)}/acceptance`, note.value.trim() ? { accepted, note: note.value.trim() } : { accepted });
      set(out.acceptance);
      announce(accepted ? 'Evidence accepted' : 'Evidence rejected');
    } catch (err) {
      msg.append(errorBox(err, 'The judgement was not recorded'));
    } finally {
      accept.disabled = false; reject.disabled = false;
    }
  };
  accept.addEventListener('click', () => judge(true));
  reject.addEventListener('click', () => judge(false));
  return h('article', { class: 'card evidence-card', 'aria-label': `Evidence ${e.id}` },
    dl([['Evidence', code(e.id)], ['Kind', code(e.kind)], ['Content SHA-256', code(e.content_sha256)], ['Recorded', fmtTime(e.created_at)]]),
    h('pre', { class: 'excerpt', tabindex: '0', 'aria-label': 'Excerpt' }, e.excerpt),
    h('details', {}, h('summary', {}, 'Provenance'), jsonBlock(e.provenance, 'Provenance')),
    verdict,
    h('div', { class: 'actions' }, h('label', { for: `note-${e.id}` }, 'Note'), note, accept, reject),
    msg);
}
