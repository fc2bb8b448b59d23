// Tools: every tool with its state on the ladder (not_registered · not_public · unavailable ·
// available · exposed) and the reason when it stops, filterable by domain and state.
// Choosing a run's turn shows what that turn exposed: the strategy, the candidate count and,
// when ranked, the scores.

import { get, seg } from './api.js';
import { follow, json } from './sse.js';
import { h, fill, code, badge, errorBox, reasonText, title } from './ui.js';

const STATES = ['not_registered', 'not_public', 'unavailable', 'available', 'exposed'];
const MAX_SHARE = 12; // src/exposure/shares.rs
const INCLUSION = {
  share_fill: 'beyond its source’s share: no other source had candidates left',
  core_prior: 'core tool first: the task matched no tool’s words',
};

// How exposures beyond 20 tools are ranked right now (/readyz), with the fetch's progress.
function rankingLine(e) {
  const mb = (b) => (b / 1048576).toFixed(1);
  const p = e.progress;
  const progress = p ? ` · wheel ${Math.min(p.wheels_done + 1, p.wheels_total)} of ${p.wheels_total}`
    + (p.bytes ? ` · ${mb(p.bytes)}${p.bytes_total ? ` of ${mb(p.bytes_total)}` : ''} MB` : '') : '';
  return h('p', { class: 'hint', id: 'ranking-state', dataset: { state: e.state } },
    'Ranking beyond 20 tools: ', h('strong', {}, e.ranking), ` · embedding model ${e.state.replaceAll('_', ' ')}`, progress,
    e.reason ? ` · ${e.reason}` : '');
}

export async function mount(root, route) {
  const params = route.params;
  const domainSel = h('select', { id: 'filter-domain' }, h('option', { value: '' }, 'All domains'));
  const stateSel = h('select', { id: 'filter-state' }, h('option', { value: '' }, 'All states'), STATES.map((s) => h('option', { value: s }, s.replaceAll('_', ' '))));
  const textIn = h('input', { id: 'filter-text', type: 'search', placeholder: 'id or description' });
  const runSel = h('select', { id: 'pick-run' }, h('option', { value: '' }, 'No run (ladder without a turn)'));
  const turnSel = h('select', { id: 'pick-turn', disabled: true }, h('option', { value: '' }, 'Pick a run first'));
  const count = h('p', { class: 'count-line', 'aria-live': 'polite' });
  const exposureBox = h('section', { class: 'exposure', 'aria-labelledby': 'exposure-title', hidden: true });
  const msg = h('div');
  const rankingBox = h('div', { 'aria-live': 'polite' });
  const tbody = h('tbody');
  const table = h('div', { class: 'table-wrap' }, h('table', { class: 'list tools', id: 'tools-table' },
    h('caption', { class: 'visually-hidden' }, 'Tools and their ladder state'),
    h('thead', {}, h('tr', {}, ['Tool', 'Domain', 'Kind', 'State', 'Reason or detail', 'Approval'].map((c) => h('th', { scope: 'col' }, c)))),
    tbody));

  root.append(
    title('Tools', 'Every tool and the first stage of the ladder it fails, or the last it reaches.'),
    h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter and turn', onsubmit: (e) => e.preventDefault() },
      h('div', { class: 'field' }, h('label', { for: 'filter-domain' }, 'Domain'), domainSel),
      h('div', { class: 'field' }, h('label', { for: 'filter-state' }, 'State'), stateSel),
      h('div', { class: 'field' }, h('label', { for: 'filter-text' }, 'Search'), textIn),
      h('div', { class: 'field' }, h('label', { for: 'pick-run' }, 'Run'), runSel),
      h('div', { class: 'field' }, h('label', { for: 'pick-turn' }, 'Turn'), turnSel)),
    msg, rankingBox, exposureBox, count, table);

  // While the model is fetched or loaded, follow its progress; stop once it settled.
  let rankingTimer = null;
  const loadRanking = async () => {
    try {
      const r = await get('/readyz');
      fill(rankingBox, rankingLine(r.embedding));
      if (['fetching', 'loading'].includes(r.embedding.state)) rankingTimer = setTimeout(loadRanking, 2000);
    } catch { /* the ladder below says what matters; readiness is informative here */ }
  };
  loadRanking();

  let tools = [];
  let turnStream = null;

  const render = () => {
    const dom = domainSel.value, st = stateSel.value, q = textIn.value.trim().toLowerCase();
    const shown = tools.filter((t) => (!dom || (t.domain ?? '—') === dom) && (!st || t.state === st)
      && (!q || t.id.toLowerCase().includes(q) || (t.description ?? '').toLowerCase().includes(q)));
    fill(tbody, shown.map((t) => h('tr', { dataset: { tool: t.id, state: t.state } },
      h('th', { scope: 'row' }, code(t.id, 'tool-id'), t.title && t.title !== t.id ? h('div', { class: 'hint' }, t.title) : null),
      h('td', {}, t.domain ?? '—'),
      h('td', {}, t.kind ?? '—'),
      h('td', {}, badge(t.state)),
      h('td', {}, t.reason ? h('span', { class: 'reason' }, reasonText(t.reason)) : null,
        t.state === 'exposed' ? h('span', {}, 'as ', code(t.function_name ?? t.id), t.score !== undefined && t.score !== null ? ` · score ${Number(t.score).toFixed(4)}` : '') : null,
        t.replacement ? h('div', { class: 'hint' }, 'replaced by ', code(t.replacement)) : null,
        !t.reason && t.state !== 'exposed' && t.description ? h('span', { class: 'hint' }, t.description) : null),
      h('td', {}, t.requires_approval === undefined ? '—' : t.requires_approval ? 'every call' : 'no'))));
    count.textContent = `${shown.length} of ${tools.length} tools shown` + (turnSel.value ? ` · states for turn ${turnSel.value}` : '');
  };

  // Loads overlap (the turn picked from the address arrives on the stream while the first load
  // without a turn is still out): only the newest load may touch the page.
  let generation = 0;
  const loadTools = async () => {
    const mine = ++generation;
    fill(msg);
    const turn = turnSel.value;
    try {
      const list = await get(`/v1/tools${turn ? `?turn=${seg(turn)}` : ''}`);
      if (mine !== generation) return;
      tools = list.tools;
      const domains = [...new Set(tools.map((t) => t.domain ?? '—'))].sort();
      const keep = domainSel.value;
      fill(domainSel, h('option', { value: '' }, 'All domains'), domains.map((d) => h('option', { value: d }, d)));
      domainSel.value = domains.includes(keep) ? keep : '';
      render();
    } catch (err) { if (mine === generation) fill(msg, errorBox(err, 'Could not load the tools')); }
    if (mine !== generation) return;
    if (turn) {
      try {
        const t = await get(`/v1/turns/${seg(turn)}`);
        if (mine === generation) showExposure(t);
      } catch (err) {
        if (mine === generation) { fill(exposureBox, errorBox(err, 'Could not load the turn')); exposureBox.hidden = false; }
      }
    } else exposureBox.hidden = true;
  };

  const showExposure = (t) => {
    const e = t.exposure;
    const ranked = e.strategy !== 'all';
    fill(exposureBox,
      h('h2', { id: 'exposure-title' }, `Exposure of turn ${t.turn_id}`),
      h('p', { id: 'exposure-strategy' }, 'Strategy ', h('strong', {}, e.strategy), e.ranker ? ` (ranker ${e.ranker})` : '',
        ` · ${e.candidate_count} public and available candidates · ${e.tools.length} exposed`,
        ranked ? '' : ' · no ranking ran (20 or fewer candidates)',
        e.past_uses !== undefined && e.past_uses !== null ? ` · ${e.past_uses} past uses weighed` : ''),
      h('p', { class: 'hint' }, `Task: ${t.task}`),
      h('ol', { class: 'exposed-list' }, e.tools.map((x) => h('li', { dataset: { source: x.source ?? '', inclusion: x.inclusion ?? '' } },
        code(x.id), x.function_name && x.function_name !== x.id ? [' as ', code(x.function_name)] : '',
        x.score !== undefined && x.score !== null ? h('span', { class: 'score' }, ` score ${Number(x.score).toFixed(4)}`) : '',
        x.inclusion && x.inclusion !== 'ranked' && x.inclusion !== 'all' ? h('span', { class: 'hint' }, ` · ${INCLUSION[x.inclusion] ?? x.inclusion}`) : '',
        // Learning from use: how similar past turns whose result was accepted raised it.
        x.learned ? h('span', { class: 'hint learned' }, ` · +${Number(x.learned.boost).toFixed(4)} from ${x.learned.uses} accepted past use${x.learned.uses === 1 ? '' : 's'} (similarity ${Number(x.learned.similarity).toFixed(2)})`) : ''))),
      // Fair shares: per source, what it offered, what was exposed and what the share held back.
      e.shares?.length > 1 ? h('div', { class: 'table-wrap' }, h('table', { class: 'list shares', id: 'exposure-shares' },
        h('caption', {}, `Sources (at most ${MAX_SHARE} places each while others have candidates)`),
        h('thead', {}, h('tr', {}, ['Source', 'Candidates', 'Exposed', 'Held back'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, e.shares.map((s) => h('tr', { dataset: { source: s.source } },
          h('th', { scope: 'row' }, code(s.source)), h('td', {}, String(s.candidates)), h('td', {}, String(s.exposed)), h('td', {}, String(s.held_back))))))) : null);
    exposureBox.hidden = false;
  };

  const loadTurns = (runId, wanted) => {
    if (turnStream) { turnStream.close(); turnStream = null; }
    fill(turnSel, h('option', { value: '' }, runId ? 'No turn (ladder without exposure)' : 'Pick a run first'));
    turnSel.disabled = !runId;
    if (!runId) return;
    // Turns are the run's exposure.created events; the stream keeps adding new turns live.
    turnStream = follow(`/v1/runs/${seg(runId)}/events`, {
      onEvent: (ev) => {
        if (ev.event !== 'exposure.created') return;
        const d = json(ev);
        if (!d?.turn_id || [...turnSel.options].some((o) => o.value === d.turn_id)) return;
        turnSel.appendChild(h('option', { value: d.turn_id }, `${d.turn_id} · ${d.strategy} · ${d.tool_ids?.length ?? 0} tools`));
        if (d.turn_id === wanted) { turnSel.value = wanted; loadTools(); }
      },
      onState: (s) => { if (s.state === 'failed') fill(msg, errorBox(s.error, 'Could not read the run’s turns')); },
    });
  };

  try {
    const runs = await get('/v1/runs?limit=100');
    for (const r of runs.runs) runSel.appendChild(h('option', { value: r.id }, `${r.title ?? 'untitled'} · ${r.id}`));
  } catch (err) { msg.append(errorBox(err, 'Could not list runs')); }

  domainSel.addEventListener('change', render);
  stateSel.addEventListener('change', render);
  textIn.addEventListener('input', render);
  runSel.addEventListener('change', () => { loadTurns(runSel.value, null); loadTools(); syncHash(); });
  turnSel.addEventListener('change', () => { loadTools(); syncHash(); });
  const syncHash = () => {
    const q = new URLSearchParams();
    if (runSel.value) q.set('run', runSel.value);
    if (turnSel.value) q.set('turn', turnSel.value);
    history.replaceState(null, '', `#/tools${q.toString() ? `?${q}` : ''}`);
  };

  const run = params.get('run');
  if (run) {
    if (![...runSel.options].some((o) => o.value === run)) runSel.appendChild(h('option', { value: run }, run));
    runSel.value = run;
    loadTurns(run, params.get('turn'));
  }
  await loadTools();
  return () => { if (turnStream) turnStream.close(); clearTimeout(rankingTimer); };
}
