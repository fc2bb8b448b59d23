// External MCP servers: for each server the six stages — Install → Connect → Discover →
// Agent Access → Tool Exposure → Approval (with "enabled" and "disclaimer accepted" along the
// way) — each ok | blocked | pending with its reason; the first stage that blocks is
// highlighted, and every blocked stage offers the action that unblocks it. Reads
// GET /v1/mcp/servers and GET /v1/mcp/servers/{id} (refreshed every few seconds while open);
// on a server without those routes it says so.

import { api, get, seg } from './api.js';
import { h, fill, dl, code, shown, badge, errorBox, notAvailable, reasonText, title, announce, jsonBlock } from './ui.js';

const LABEL = {
  install: 'Install', enabled: 'Enabled', connect: 'Connect', disclaimer: 'Disclaimer accepted',
  discover: 'Discover', agent_access: 'Agent Access', tool_exposure: 'Tool Exposure', approval: 'Approval',
};
const REFRESH_MS = 3000;

/** Stages as [{name, status, reason, code, action}], from an array (or an object keyed by stage). */
export function stagesOf(server) {
  const raw = server.stages ?? [];
  const list = Array.isArray(raw)
    ? raw.map((s) => ({ ...s, name: s.stage ?? s.name }))
    : Object.entries(raw).map(([name, s]) => (typeof s === 'string' ? { name, status: s } : { ...s, name }));
  return list.map((s) => ({ name: String(s.name ?? '?'), status: String(s.status ?? 'pending'), reason: s.reason ?? null, code: s.code ?? null, action: s.action ?? null }));
}

const label = (n) => LABEL[n] ?? n.replaceAll('_', ' ');
const why = (st) => [reasonText(st.reason), st.code ? `(${st.code})` : ''].filter(Boolean).join(' ');

/**
 * What an action {method, path, body?} means in words, and whether the page can send it as is
 * (paths with a {placeholder} stand for a choice the person makes elsewhere).
 */
function describeAction(action) {
  if (!action) return null;
  if (typeof action === 'string') return { words: action };
  const { method = '', path = '', body } = action;
  const sendable = !/[{}]/.test(path);
  const req = { method: method.toUpperCase(), path, body };
  if (req.method === 'PATCH' && body?.enabled === true) return { words: 'Enable the server', req, sendable };
  if (path.endsWith('/disclaimer/accept')) return { words: 'Accept the disclaimer', req, sendable, confirm: true };
  if (path.endsWith('/connect')) return { words: 'Connect', req, sendable };
  if (path.endsWith('/discover')) return { words: 'Discover tools', req, sendable };
  if (path.includes('/agent-access') && body?.definition_sha256) return { words: 'Review the changed definition (below) before turning agent access on again', req, sendable: false };
  if (path.includes('/agent-access')) return { words: sendable ? 'Turn on agent access' : 'Turn on agent access for a tool (in the list of tools below)', req, sendable };
  if (path.includes('/approvals/')) return { words: 'Approve each call in the Approvals inbox', link: '#/approvals' };
  return { words: `${req.method} ${path}`, req, sendable };
}

export async function mount(root, route) {
  root.append(title(route.id ? 'MCP server' : 'MCP servers', 'Where each External MCP capability stands, stage by stage, and what unblocks it.'));
  const body = h('div');
  root.append(body);
  if (route.id) return server(body, route.id);
  try {
    const list = await get('/v1/mcp/servers');
    const servers = list.servers ?? [];
    if (!servers.length) body.append(h('p', { class: 'empty' }, 'No External MCP server is installed.'));
    for (const s of servers) {
      const stages = stagesOf(s);
      const blocked = stages.find((x) => x.status === 'blocked');
      body.append(h('article', { class: 'card', dataset: { server: s.id } },
        h('h2', {}, h('a', { href: `#/mcp/${encodeURIComponent(s.id)}` }, s.name ?? s.id)),
        dl([['Id', code(s.id)], ['Enabled', s.enabled ? 'yes' : 'no'], ['Connection', s.connection?.state],
          ['Tools', `${(s.tools ?? []).length} listed`],
          ['Blocked at', blocked ? h('strong', {}, `${label(blocked.name)}: ${why(blocked)}`) : 'nothing blocks']])));
    }
  } catch (err) {
    if (err.missingRoute) body.append(notAvailable('External MCP servers', 'GET /v1/mcp/servers'));
    else body.append(errorBox(err, 'Could not list MCP servers'));
  }
  return null;
}

async function server(body, id) {
  const msg = h('div', { 'aria-live': 'polite' });
  const content = h('div');
  body.append(msg, content);
  let last = '';
  let timer = null;
  let closed = false;

  const render = async (force) => {
    let s;
    try { s = await get(`/v1/mcp/servers/${seg(id)}`); } catch (err) {
      fill(content, err.missingRoute ? notAvailable('External MCP servers', 'GET /v1/mcp/servers/{id}') : errorBox(err, `Could not load MCP server ${id}`));
      last = '';
      return;
    }
    const text = JSON.stringify(s);
    // Leave the page alone while the person is using a control in it; show changes otherwise.
    const busy = content.contains(document.activeElement) && document.activeElement.matches('button, input, select, textarea, a, summary');
    if (!force && (text === last || busy)) return;
    last = text;
    draw(s);
  };

  const send = async (a, btn) => {
    if (a.confirm && !window.confirm(`Accept this server's disclaimer?\n\n${a.disclaimer ?? ''}`)) return;
    btn.disabled = true;
    fill(msg);
    try {
      await api(a.req.method, a.req.path, a.req.body ?? (a.req.method === 'GET' ? undefined : {}));
      announce(`${a.words}: done`);
      await render(true);
      content.querySelector('h2')?.focus();
    } catch (err) {
      btn.disabled = false;
      fill(msg, errorBox(err, `${a.words} failed`));
    }
  };

  const draw = (s) => {
    const stages = stagesOf(s);
    const blockedAt = stages.findIndex((x) => x.status === 'blocked');
    const cfg = s.config?.stdio ?? s.config?.http ?? s.config ?? {};
    const target = cfg.url ?? [cfg.command, ...(cfg.args ?? [])].filter(Boolean).join(' ');
    const stageList = h('ol', { class: 'stages', id: 'mcp-stages', 'aria-label': 'Lifecycle stages in order' }, stages.map((st, i) => {
      const blocking = i === blockedAt;
      const a = st.status === 'ok' ? null : describeAction(st.action);
      let control = null;
      if (a?.link) control = h('a', { href: a.link }, a.words);
      else if (a && st.status === 'blocked' && a.sendable) {
        control = h('button', { type: 'button', class: 'approve', dataset: { action: st.name } }, a.words);
        control.addEventListener('click', () => send({ ...a, disclaimer: s.disclaimer }, control));
      }
      return h('li', { class: `stage stage-${st.status}${blocking ? ' blocking' : ''}`, dataset: { stage: st.name, status: st.status }, 'aria-current': blocking ? 'step' : null },
        h('span', { class: 'stage-name' }, label(st.name)), ' ', badge(st.status),
        blocking ? h('strong', { class: 'blocking-flag' }, ' Blocked here') : null,
        st.reason ? h('p', { class: 'reason' }, why(st)) : null,
        a ? h('p', { class: 'action' }, st.status === 'blocked' ? 'To unblock: ' : 'Next: ', control ?? a.words) : null);
    }));
    fill(content,
      h('h2', { tabindex: '-1' }, s.name ?? id),
      blockedAt >= 0
        ? h('p', { class: 'blocked-summary', id: 'mcp-blocked' }, 'Blocked at ', h('strong', {}, label(stages[blockedAt].name)), `: ${why(stages[blockedAt])}`)
        : h('p', { id: 'mcp-blocked' }, stages.length ? 'No stage blocks.' : 'The server reported no stages.'),
      dl([
        ['Id', code(s.id ?? id)], ['Scope', s.deployment_wide ? 'deployment-wide' : 'yours'], ['Enabled', s.enabled ? 'yes' : 'no'],
        ['Transport', h('span', {}, `${s.transport ?? '?'} `, code(target || '—'))],
        ['Connection', s.connection?.state], ['Protocol version', s.connection?.protocol_version ?? undefined],
        ['Last error', s.connection?.last_error ?? undefined], ['Request timeout', s.request_timeout_ms ? `${s.request_timeout_ms} ms` : undefined],
      ]),
      stageList,
      s.disclaimer ? h('details', {}, h('summary', {}, s.disclaimer_accepted_at ? 'Disclaimer (accepted)' : 'Disclaimer (not accepted)'), h('p', {}, shown(s.disclaimer, '\n\t'))) : null,
      s.connection?.stderr_tail ? h('details', {}, h('summary', {}, 'Server stderr (tail)'), h('pre', { class: 'excerpt' }, s.connection.stderr_tail)) : null,
      toolTable(s, msg, () => render(true)));
  };

  await render(true);
  const tick = async () => { if (closed) return; await render(false); if (!closed) timer = setTimeout(tick, REFRESH_MS); };
  timer = setTimeout(tick, REFRESH_MS);
  return () => { closed = true; clearTimeout(timer); };
}

function toolTable(s, msg, rerender) {
  const tools = s.tools ?? [];
  if (!tools.length) return h('p', { class: 'empty' }, 'No tool discovered yet.');
  const setAccess = async (t, body, btn, words) => {
    btn.disabled = true;
    try { await api('PUT', `/v1/mcp/servers/${seg(s.id)}/tools/${seg(t.name)}/agent-access`, body); announce(words); await rerender(); }
    catch (err) { btn.disabled = false; fill(msg, errorBox(err, 'Changing agent access failed')); }
  };
  const reviews = tools.filter((t) => t.definition_review);
  return h('section', { 'aria-labelledby': 'mcp-tools-title' },
    reviews.map((t) => review(t, setAccess)),
    h('h3', { id: 'mcp-tools-title' }, 'Discovered tools'),
    h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'mcp-tools' },
      h('thead', {}, h('tr', {}, ['Tool', 'Projected id', 'Listing', 'Input schema', 'Agent access', 'Stuck at'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, tools.map((t) => {
        const on = Boolean(t.agent_access);
        const changed = Boolean(t.definition_review);
        const btn = h('button', { type: 'button', class: 'secondary', 'aria-label': `${on ? 'Turn off' : 'Turn on'} agent access for ${t.name}` }, on ? 'Turn off' : 'Turn on');
        // Turning on accepts the definition this row shows, by its fingerprint: if the server
        // lists another one by now, the API refuses (409 definition_changed) instead.
        const body = !on && t.definition_sha256 ? { enabled: true, definition_sha256: t.definition_sha256 } : { enabled: !on };
        btn.addEventListener('click', () => setAccess(t, body, btn, `Agent access ${on ? 'off' : 'on'} for ${t.name}`));
        const stuck = stagesOf(t).find((x) => x.status !== 'ok');
        const dialect = t.input_schema_dialect;
        return h('tr', { dataset: { tool: t.name } },
          h('th', { scope: 'row' }, code(t.name), t.title ? h('div', { class: 'hint' }, t.title) : null),
          h('td', {}, code(t.tool_id ?? `mcp:${s.id}:tool:${t.name}`), t.projected ? h('div', { class: 'hint' }, 'projected') : null),
          h('td', {}, badge(t.status ?? '—'), t.rejection ? h('p', { class: 'error' }, t.rejection) : null),
          h('td', { class: 'schema' }, t.schema_problem
            ? [badge('unusable', 'blocked'), h('p', { class: 'error' }, t.schema_problem)]
            : dialect ? [code(dialect.dialect), h('span', { class: 'hint' }, dialect.declared ? ' declared' : ' inferred')] : '—'),
          h('td', {}, on ? 'on ' : 'off ',
            changed ? h('span', { class: 'hint' }, '(definition changed: review above) ')
              : t.agent_access_source === 'server_default' ? h('span', { class: 'hint' }, '(server default) ') : null,
            t.status === 'ok' && !changed ? btn : null),
          h('td', {}, stuck ? [h('strong', {}, label(stuck.name)), ' ', badge(stuck.status), ` ${why(stuck)}`] : 'nothing'));
      })))));
}

/** One definition under review: the one that had agent access beside the one listed now. */
function review(t, setAccess) {
  const r = t.definition_review;
  const side = (heading, d, sha) => h('div', { class: 'definition' },
    h('h4', {}, heading),
    dl([['Description', h('p', { class: 'description' }, shown(d?.description ?? '—', '\n\t'))], ['Title', shown(d?.title ?? '—')], ['Fingerprint', code(sha)]]),
    h('details', { open: true }, h('summary', {}, 'Input schema'), jsonBlock(d?.input_schema ?? null, `${heading} input schema`)),
    d?.annotations ? h('details', {}, h('summary', {}, 'Annotations'), jsonBlock(d.annotations, `${heading} annotations`)) : null,
    d?.output_schema ? h('details', {}, h('summary', {}, 'Output schema'), jsonBlock(d.output_schema, `${heading} output schema`)) : null);
  const accept = h('button', { type: 'button', class: 'approve' }, `Accept the new definition of ${t.name} and turn agent access on`);
  accept.addEventListener('click', () => setAccess(t, { enabled: true, definition_sha256: r.current_sha256 }, accept, `Accepted the new definition of ${t.name}`));
  return h('article', { class: 'card review', dataset: { review: t.name }, 'aria-labelledby': `review-${t.name}` },
    h('h3', { id: `review-${t.name}` }, 'Definition changed: ', code(t.name)),
    h('p', {}, `The server changed this tool's definition${r.since ? ` at ${r.since}` : ''} while it had agent access. `,
      'Agent access is off and calls frozen against the old definition will not run (stale_definition). ',
      'Compare the two; turning agent access on again accepts exactly the definition on the right.'),
    h('div', { class: 'compare' }, side('Before (had agent access)', r.previous, r.previous_sha256), side('Now listed', r.current, r.current_sha256)),
    h('p', { class: 'action' }, accept));
}
