// External MCP servers: for each server the six stages — Install → Connect → Discover →
// Agent Access → Tool Exposure → Approval (with "enabled" and "disclaimer accepted" along the
// way) — each ok | blocked | pending with its reason; the stage that blocks is highlighted
// with the action that unblocks it. Reads GET /v1/mcp/servers and GET /v1/mcp/servers/{id};
// on a server without those routes it says so.

import { api, get, seg } from './api.js';
import { h, fill, dl, code, badge, errorBox, notAvailable, reasonText, title, announce } from './ui.js';

const ORDER = ['install', 'enabled', 'connect', 'disclaimer', 'discover', 'agent_access', 'tool_exposure', 'exposure', 'approval'];
const LABEL = {
  install: 'Install', enabled: 'Enabled', enable: 'Enabled', connect: 'Connect', disclaimer: 'Disclaimer accepted',
  discover: 'Discover', agent_access: 'Agent Access', tool_exposure: 'Tool Exposure', exposure: 'Tool Exposure', approval: 'Approval',
};

/** Stages as [{name, status, reason, action}] from an array or an object keyed by stage. */
export function stagesOf(server) {
  const raw = server.stages ?? server.lifecycle ?? [];
  const list = Array.isArray(raw)
    ? raw.map((s) => ({ ...s, name: s.stage ?? s.name ?? s.id }))
    : Object.entries(raw).map(([name, s]) => (typeof s === 'string' ? { name, status: s } : { ...s, name }));
  return list.map((s) => ({ name: String(s.name ?? '?'), status: String(s.status ?? s.state ?? 'pending'), reason: s.reason ?? s.message ?? null, action: s.action ?? null, detail: s }))
    .sort((a, b) => (Array.isArray(raw) ? 0 : rank(a.name) - rank(b.name)));
}

const rank = (n) => { const i = ORDER.indexOf(n.toLowerCase()); return i === -1 ? ORDER.length : i; };
const label = (n) => LABEL[n.toLowerCase()] ?? n.replaceAll('_', ' ');

/** The request an action stands for, when it is one the page can send. */
function actionRequest(action, serverId) {
  if (!action) return null;
  if (typeof action === 'object' && action.method && action.path) return { method: action.method.toUpperCase(), path: action.path, body: action.body, label: action.label ?? action.title ?? action.kind ?? `${action.method} ${action.path}` };
  const words = (typeof action === 'string' ? action : (action.kind ?? action.id ?? action.name ?? '')).toLowerCase();
  const text = typeof action === 'string' ? action : (action.label ?? action.title ?? action.message ?? words);
  const base = `/v1/mcp/servers/${seg(serverId)}`;
  if (/disclaimer/.test(words)) return { method: 'POST', path: `${base}/disclaimer/accept`, label: text, confirm: true };
  if (/discover/.test(words)) return { method: 'POST', path: `${base}/discover`, label: text };
  if (/connect/.test(words)) return { method: 'POST', path: `${base}/connect`, label: text };
  if (/enable/.test(words)) return { method: 'PATCH', path: base, body: { enabled: true }, label: text };
  return null;
}

const actionText = (action) => (typeof action === 'string' ? action : action?.label ?? action?.title ?? action?.message ?? action?.kind ?? (action ? JSON.stringify(action) : ''));

export async function mount(root, route) {
  root.append(title('MCP servers', 'Where each External MCP capability stands, stage by stage, and what unblocks it.'));
  const body = h('div');
  root.append(body);
  if (route.id) return server(body, route.id);
  try {
    const list = await get('/v1/mcp/servers');
    const servers = list.servers ?? list.items ?? (Array.isArray(list) ? list : []);
    if (!servers.length) { body.append(h('p', { class: 'empty' }, 'No External MCP server is installed.')); }
    for (const s of servers) {
      const stages = stagesOf(s);
      const blocked = stages.find((x) => x.status === 'blocked');
      body.append(h('article', { class: 'card' }, h('h2', {}, h('a', { href: `#/mcp/${encodeURIComponent(s.id)}` }, s.name ?? s.id)),
        dl([['Id', code(s.id)], ['Enabled', s.enabled === undefined ? undefined : s.enabled ? 'yes' : 'no'],
          ['Connection', s.connection?.state ?? s.connection_state ?? s.state],
          ['Blocked at', blocked ? h('strong', {}, label(blocked.name)) : stages.length ? 'nothing blocks' : undefined]])));
    }
  } catch (err) {
    if (err.missingRoute) body.append(notAvailable('External MCP servers', 'GET /v1/mcp/servers'), openById(body));
    else body.append(errorBox(err, 'Could not list MCP servers'));
  }
  return null;
}

function openById() {
  const input = h('input', { id: 'mcp-id', type: 'text', spellcheck: 'false' });
  return h('form', { class: 'inline', onsubmit: (e) => { e.preventDefault(); if (input.value.trim()) location.hash = `#/mcp/${encodeURIComponent(input.value.trim())}`; } },
    h('label', { for: 'mcp-id' }, 'Open a server by id'), input, h('button', { type: 'submit' }, 'Open'));
}

async function server(body, id) {
  const render = async () => {
    let s;
    try { s = await get(`/v1/mcp/servers/${seg(id)}`); } catch (err) {
      fill(body, err.missingRoute ? notAvailable('External MCP servers', 'GET /v1/mcp/servers/{id}') : errorBox(err, `Could not load MCP server ${id}`));
      return;
    }
    const stages = stagesOf(s);
    const blockedAt = stages.findIndex((x) => x.status === 'blocked');
    const msg = h('div', { 'aria-live': 'polite' });
    const facts = dl([
      ['Id', code(s.id ?? id)], ['Name', s.name], ['Enabled', s.enabled === undefined ? undefined : s.enabled ? 'yes' : 'no'],
      ['Transport', s.transport ? code(s.transport.stdio ? [s.transport.stdio.command, ...(s.transport.stdio.args ?? [])].join(' ') : s.transport.http?.url ?? JSON.stringify(s.transport)) : undefined],
      ['Connection', s.connection?.state ?? s.connection_state],
      ['Protocol version', s.connection?.protocol_version ?? s.protocol_version],
      ['Last error', s.connection?.last_error ?? s.last_error],
    ]);
    const stageList = h('ol', { class: 'stages', id: 'mcp-stages', 'aria-label': 'Lifecycle stages in order' }, stages.map((st, i) => {
      const blocking = i === blockedAt;
      const req = blocking ? actionRequest(st.action, s.id ?? id) : null;
      const btn = req ? h('button', { type: 'button', class: 'approve' }, req.label) : null;
      if (btn) btn.addEventListener('click', async () => {
        if (req.confirm && !window.confirm(`Accept the server's disclaimer?\n\n${s.disclaimer ?? ''}`)) return;
        btn.disabled = true;
        try { await api(req.method, req.path, req.body ?? {}); announce(`${req.label}: done`); await render(); }
        catch (err) { btn.disabled = false; fill(msg, errorBox(err, `${req.label} failed`)); }
      });
      return h('li', { class: `stage stage-${st.status}${blocking ? ' blocking' : ''}`, dataset: { stage: st.name, status: st.status }, 'aria-current': blocking ? 'step' : null },
        h('span', { class: 'stage-name' }, label(st.name)), ' ', badge(st.status),
        blocking ? h('strong', { class: 'blocking-flag' }, ' Blocked here') : null,
        st.reason ? h('p', { class: 'reason' }, reasonText(st.reason)) : null,
        st.action && st.status !== 'ok' ? h('p', { class: 'action' }, 'To unblock: ', actionText(st.action), btn ? ' ' : null, btn) : null);
    }));
    const tools = s.tools ?? [];
    fill(body,
      h('h2', {}, s.name ?? id),
      blockedAt >= 0 ? h('p', { class: 'blocked-summary', id: 'mcp-blocked' }, 'Blocked at ', h('strong', {}, label(stages[blockedAt].name)), stages[blockedAt].reason ? `: ${reasonText(stages[blockedAt].reason)}` : '')
        : h('p', { id: 'mcp-blocked' }, stages.length ? 'No stage blocks.' : 'The server reported no stages.'),
      facts, msg, stageList,
      s.disclaimer ? h('details', {}, h('summary', {}, 'Disclaimer'), h('p', {}, s.disclaimer)) : null,
      s.stderr_tail ?? s.connection?.stderr_tail ? h('details', {}, h('summary', {}, 'Server stderr (tail)'), h('pre', { class: 'excerpt' }, s.stderr_tail ?? s.connection.stderr_tail)) : null,
      tools.length ? toolTable(s, tools, msg, render) : null);
  };
  await render();
  return null;
}

function toolTable(s, tools, msg, rerender) {
  return h('section', { 'aria-labelledby': 'mcp-tools-title' }, h('h3', { id: 'mcp-tools-title' }, 'Discovered tools'),
    h('div', { class: 'table-wrap' }, h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Tool', 'Projected id', 'Agent access', 'State'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, tools.map((t) => {
        const name = t.name ?? t.tool_name;
        const on = t.agent_access ?? t.agent_access_enabled ?? t.enabled;
        const btn = h('button', { type: 'button', class: 'secondary', 'aria-label': `${on ? 'Turn off' : 'Turn on'} agent access for ${name}` }, on ? 'Turn off' : 'Turn on');
        btn.addEventListener('click', async () => {
          btn.disabled = true;
          try { await api('PUT', `/v1/mcp/servers/${seg(s.id)}/tools/${seg(name)}/agent-access`, { enabled: !on }); await rerender(); }
          catch (err) { btn.disabled = false; fill(msg, errorBox(err, 'Changing agent access failed')); }
        });
        return h('tr', {}, h('th', { scope: 'row' }, code(name)), h('td', {}, code(t.tool_id ?? t.projected_id ?? `mcp:${s.id}:tool:${name}`)),
          h('td', {}, on === undefined ? '—' : on ? 'on ' : 'off ', on === undefined ? null : btn),
          h('td', {}, t.rejected ? h('span', { class: 'error' }, `rejected: ${reasonText(t.rejected_reason ?? t.reason)}`) : (t.state ?? t.status ?? '—')));
      })))));
}

