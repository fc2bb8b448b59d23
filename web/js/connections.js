// Connections: the accounts (GitHub, mail) that make the dynamic tools usable (docs/api.md,
// Connections). Each connection is a card with its state in words, who the credential is for,
// when it was last checked, the last problem found, the end of a rate limit, what each
// permission of its kind was found to be, and what each tool of its kind needs (usable, or the
// ladder reason). Adds a connection (a form per kind), checks one now, enables/disables it,
// replaces its credential and deletes it (after a confirmation).
// Reads GET /v1/connections (refreshed every few seconds while open). Every server string is
// set as text. A credential typed here is sent once in the request body, its field is cleared
// at once, and it is never shown again (the API never returns it).

import { api, get, post, seg } from './api.js';
import { h, fill, dl, code, badge, errorBox, notAvailable, title, announce, fmtTime } from './ui.js';

const REFRESH_MS = 5000;

const KINDS = { github: 'GitHub', mail: 'Mail' };

const STATE_WORDS = {
  disabled: 'Disabled: no tool uses it until it is enabled again.',
  unchecked: 'Not checked yet.',
  rate_limited: 'Rate limited: its tools wait until the limit ends.',
  reauth_required: 'The server refused the credential: replace it.',
  unreachable: 'The server cannot be reached.',
  degraded: 'Partly reachable: some of its parts cannot be reached.',
  limited: 'Reachable and accepted, but some permissions are missing or cannot be verified.',
  ready: 'Ready: every permission is granted.',
};

const ACCESS_BADGE = { granted: 'ok', missing: 'unavailable', unknown: 'unavailable', reauth_required: 'blocked', unreachable: 'blocked', card_changed: 'blocked', browser_gone: 'blocked' };

/** What a check found for one permission, in words. */
function accessWords(access) {
  if (!access) return [badge('not checked', 'unchecked')];
  const detail = access.state === 'missing' ? `the credential lacks the scope ${access.scope}` : access.message;
  return [badge(access.state, ACCESS_BADGE[access.state] ?? access.state), detail ? h('span', { class: 'access-detail' }, ` ${detail}`) : null];
}

/** A settings value (string, number, boolean, list or object) as text. */
function settingValue(v) {
  if (Array.isArray(v)) return v.length ? h('ul', { class: 'plain' }, v.map((x) => h('li', {}, code(typeof x === 'string' ? x : JSON.stringify(x))))) : 'none';
  if (v && typeof v === 'object') return dl(Object.entries(v).map(([k, x]) => [humanKey(k), settingValue(x)]), 'facts nested');
  if (typeof v === 'boolean') return v ? 'yes' : 'no';
  return code(String(v));
}

const humanKey = (k) => {
  const words = { base_url: 'Base URL', imap: 'IMAP', smtp: 'SMTP', tls: 'TLS', repositories: 'Repositories', address: 'Address', username: 'Username', host: 'Host', port: 'Port' };
  return words[k] ?? (k.charAt(0).toUpperCase() + k.slice(1)).replaceAll('_', ' ').replace(/\b(imap|smtp|tls|url)\b/gi, (m) => m.toUpperCase());
};

/** A field: label + control. */
function field(id, label, control, hint) {
  if (hint) control.setAttribute('aria-describedby', `${id}-hint`);
  return h('div', { class: 'field' }, h('label', { for: id }, label), control, hint ? h('p', { class: 'hint', id: `${id}-hint` }, hint) : null);
}
const input = (id, attrs = {}) => h('input', { id, name: id, type: 'text', autocomplete: 'off', spellcheck: 'false', autocapitalize: 'off', ...attrs });
const secretInput = (id) => input(id, { type: 'password', required: true, autocomplete: 'new-password' });
function tlsSelect(id, secure) {
  return h('select', { id, name: id },
    h('option', { value: secure, selected: true }, secure === 'tls' ? 'TLS from the start (implicit)' : 'TLS'),
    h('option', { value: 'starttls' }, 'STARTTLS'),
    h('option', { value: 'none' }, 'None (plain text: test servers only)'));
}

/**
 * The credential fields of a kind, with ids under `prefix`: GitHub a token or a GitHub App
 * (app id, installation id, private key), Mail a password or an OAuth token (XOAUTH2).
 * `read()` answers the credential object and empties every field at once; `clear()` empties
 * them; `first` is the field to focus.
 */
function credentialFields(kind, prefix) {
  const once = 'Sent once, stored sealed, never shown again.';
  if (kind !== 'github') {
    const type = h('select', { id: `${prefix}-credential-type`, name: `${prefix}-credential-type` },
      h('option', { value: 'password' }, 'Password'), h('option', { value: 'oauth_token' }, 'OAuth access token (XOAUTH2)'));
    const secret = secretInput(`${prefix}-password`);
    const label = h('label', { for: `${prefix}-password` }, 'Password or app password');
    type.addEventListener('change', () => {
      label.textContent = type.value === 'password' ? 'Password or app password' : 'OAuth access token';
    });
    secret.setAttribute('aria-describedby', `${prefix}-password-hint`);
    return {
      el: h('div', { class: 'credential-fields' }, field(`${prefix}-credential-type`, 'Credential', type),
        h('div', { class: 'field' }, label, secret, h('p', { class: 'hint', id: `${prefix}-password-hint` }, `IMAP LOGIN and SMTP AUTH with a password, or SASL XOAUTH2 with a token. ${once}`))),
      first: type,
      clear: () => { secret.value = ''; },
      read: () => { const value = secret.value; secret.value = ''; return { [type.value]: value }; },
    };
  }
  const type = h('select', { id: `${prefix}-credential-type`, name: `${prefix}-credential-type` },
    h('option', { value: 'token' }, 'Token'), h('option', { value: 'app' }, 'GitHub App'));
  const token = secretInput(`${prefix}-token`);
  const appId = input(`${prefix}-app-id`, { inputmode: 'numeric', pattern: '[0-9]+' });
  const installationId = input(`${prefix}-installation-id`, { inputmode: 'numeric', pattern: '[0-9]+' });
  const key = h('textarea', { id: `${prefix}-private-key`, name: `${prefix}-private-key`, rows: '4', spellcheck: 'false', autocapitalize: 'off', autocomplete: 'off', placeholder: '-----BEGIN RSA PRIVATE KEY-----' });
  const tokenPart = h('div', { class: 'credential-part' }, field(`${prefix}-token`, 'Token', token,
    `A personal access token (classic or fine-grained) or an App installation token. ${once}`));
  const appPart = h('div', { class: 'credential-part row', hidden: true },
    field(`${prefix}-app-id`, 'App id', appId),
    field(`${prefix}-installation-id`, 'Installation id', installationId),
    field(`${prefix}-private-key`, 'Private key (PEM)', key, `The server makes installation tokens with it. ${once}`));
  const show = () => {
    const app = type.value === 'app';
    tokenPart.hidden = app;
    appPart.hidden = !app;
    token.required = !app;
    for (const el of [appId, installationId, key]) el.required = app;
  };
  type.addEventListener('change', show);
  show();
  const clear = () => { for (const el of [token, appId, installationId, key]) el.value = ''; };
  return {
    el: h('div', { class: 'credential-fields' }, field(`${prefix}-credential-type`, 'Credential', type), tokenPart, appPart),
    first: type,
    clear,
    read: () => {
      const credential = type.value === 'app'
        ? { app_id: Number(appId.value.trim()), installation_id: Number(installationId.value.trim()), private_key: key.value }
        : { token: token.value };
      clear();
      return credential;
    },
  };
}

/** The body of POST /v1/connections for the form's kind (the credential read and cleared). */
function readForm(kind, els, credentials) {
  const val = (id) => els[id].value.trim();
  const body = { kind, name: val('connection-name') || undefined, shared: els['connection-shared'].checked || undefined };
  if (kind === 'github') {
    const repositories = els['github-repositories'].value.split('\n').map((l) => l.trim()).filter(Boolean);
    body.settings = { base_url: val('github-base-url') || 'https://api.github.com' };
    if (repositories.length) body.settings.repositories = repositories;
  } else {
    body.settings = {
      imap: { host: val('mail-imap-host'), port: Number(val('mail-imap-port')), tls: els['mail-imap-tls'].value },
      smtp: { host: val('mail-smtp-host'), port: Number(val('mail-smtp-port')), tls: els['mail-smtp-tls'].value },
      username: val('mail-username'),
      address: val('mail-address'),
    };
  }
  body.credential = credentials[kind].read();
  return body;
}

export async function mount(root) {
  root.append(title('Connections', 'The accounts that make the GitHub and Mail tools usable: what each check found, and what each tool needs.'));
  const msg = h('div', { id: 'connections-msg', 'aria-live': 'polite' });
  const list = h('div', { class: 'cards', id: 'connections' });
  let me = null;
  try { me = await get('/v1/me'); } catch { /* the list below reports the problem */ }

  // ---- the add form: one fieldset per kind, only the chosen one enabled ----
  const els = {};
  const credentials = { github: credentialFields('github', 'github'), mail: credentialFields('mail', 'mail') };
  const mk = (id, el) => { els[id] = el; return el; };
  const kindSel = mk('connection-kind', h('select', { id: 'connection-kind', name: 'kind' },
    Object.entries(KINDS).map(([k, label]) => h('option', { value: k }, label))));
  const github = h('fieldset', { class: 'kind-fields', dataset: { kind: 'github' } },
    h('legend', {}, 'GitHub'),
    field('github-base-url', 'API base URL', mk('github-base-url', input('github-base-url', { type: 'url', value: 'https://api.github.com', required: true })),
      'https://api.github.com, or your GitHub Enterprise API (https://HOST/api/v3).'),
    field('github-repositories', 'Repositories (optional)', mk('github-repositories', h('textarea', { id: 'github-repositories', name: 'github-repositories', rows: '3', spellcheck: 'false', autocapitalize: 'off', placeholder: 'owner/repo' })),
      'One owner/repo per line: the tools may use only these. Empty: every repository the token reaches.'),
    credentials.github.el);
  const mail = h('fieldset', { class: 'kind-fields', dataset: { kind: 'mail' }, hidden: true, disabled: true },
    h('legend', {}, 'Mail'),
    h('div', { class: 'row' },
      field('mail-imap-host', 'IMAP host', mk('mail-imap-host', input('mail-imap-host', { required: true }))),
      field('mail-imap-port', 'IMAP port', mk('mail-imap-port', input('mail-imap-port', { type: 'number', min: '1', max: '65535', value: '993', required: true }))),
      field('mail-imap-tls', 'IMAP security', mk('mail-imap-tls', tlsSelect('mail-imap-tls', 'tls')))),
    h('div', { class: 'row' },
      field('mail-smtp-host', 'SMTP host', mk('mail-smtp-host', input('mail-smtp-host', { required: true }))),
      field('mail-smtp-port', 'SMTP port', mk('mail-smtp-port', input('mail-smtp-port', { type: 'number', min: '1', max: '65535', value: '465', required: true }))),
      field('mail-smtp-tls', 'SMTP security', mk('mail-smtp-tls', tlsSelect('mail-smtp-tls', 'tls')))),
    h('div', { class: 'row' },
      field('mail-username', 'Username', mk('mail-username', input('mail-username', { required: true }))),
      field('mail-address', 'Address (From)', mk('mail-address', input('mail-address', { type: 'email', required: true, placeholder: 'you@example.com' })))),
    credentials.mail.el);
  const fieldsets = { github, mail };
  const shared = mk('connection-shared', h('input', { id: 'connection-shared', name: 'shared', type: 'checkbox' }));
  const add = h('button', { type: 'submit' }, 'Add and check');
  const form = h('form', { id: 'add-connection', 'aria-labelledby': 'add-connection-title' },
    h('div', { class: 'filters' },
      field('connection-kind', 'Kind', kindSel),
      field('connection-name', 'Name (optional)', mk('connection-name', input('connection-name', { maxlength: '128' })))),
    github, mail,
    h('div', { class: 'filters' },
      me?.is_admin ? h('div', { class: 'field check' }, shared, h('label', { for: 'connection-shared' }, 'Shared: every user may use it (admins only)')) : null,
      add));
  kindSel.addEventListener('change', () => {
    for (const [k, fs] of Object.entries(fieldsets)) { fs.hidden = k !== kindSel.value; fs.disabled = k !== kindSel.value; }
  });
  root.append(
    h('section', { class: 'exposure', 'aria-labelledby': 'add-connection-title' },
      h('h2', { id: 'add-connection-title' }, 'Add a connection'),
      h('p', { class: 'hint' }, 'Adding checks the connection at once (a live round trip of at most 20 s). The server checks every enabled connection again every 5 minutes.'),
      form),
    msg,
    h('h2', {}, 'Your connections and the shared ones'),
    list);

  let last = '';
  let timer = null;
  let closed = false;
  let unavailable = false;

  const act = async (btn, what, fn) => {
    btn.disabled = true;
    fill(msg, h('p', { class: 'hint' }, `${what}…`));
    try {
      await fn();
      fill(msg);
      announce(`${what}: done`);
      await render(true);
    } catch (err) {
      btn.disabled = false;
      fill(msg, errorBox(err, `${what} failed`));
    }
  };

  const credentialForm = (c, actions) => {
    const fields = credentialFields(c.kind, `credential-${c.id}`);
    const save = h('button', { type: 'submit' }, 'Save and check');
    const cancel = h('button', { type: 'button', class: 'secondary' }, 'Cancel');
    const headingId = `credential-title-${c.id}`;
    const f = h('form', { class: 'credential', dataset: { credential: c.id }, 'aria-labelledby': headingId },
      h('h4', { id: headingId }, 'Replace the credential of ', h('span', { class: 'connection-name' }, c.name)),
      fields.el, h('div', { class: 'actions' }, save, cancel));
    cancel.addEventListener('click', () => { fields.clear(); render(true); });
    f.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const credential = fields.read();
      act(save, `Replace the credential of ${c.name}`, () => api('PATCH', `/v1/connections/${seg(c.id)}`, { credential }));
    });
    fill(actions, f);
    fields.first.focus();
  };

  const card = (c) => {
    const actions = h('div', { class: 'actions' });
    const check = h('button', { type: 'button', class: 'secondary', dataset: { action: 'check' }, 'aria-label': `Check ${c.name} now` }, 'Check now');
    check.addEventListener('click', () => act(check, `Check ${c.name}`, () => post(`/v1/connections/${seg(c.id)}/check`)));
    actions.append(check);
    if (c.editable) {
      const toggle = h('button', { type: 'button', class: 'secondary', dataset: { action: c.enabled ? 'disable' : 'enable' }, 'aria-label': `${c.enabled ? 'Disable' : 'Enable'} ${c.name}` }, c.enabled ? 'Disable' : 'Enable');
      toggle.addEventListener('click', () => act(toggle, `${c.enabled ? 'Disable' : 'Enable'} ${c.name}`, () =>
        api('PATCH', `/v1/connections/${seg(c.id)}`, { enabled: !c.enabled })));
      const replace = h('button', { type: 'button', class: 'secondary', dataset: { action: 'credential' }, 'aria-label': `Replace the credential of ${c.name}` }, c.kind === 'github' ? 'Replace token' : 'Replace password');
      replace.addEventListener('click', () => credentialForm(c, actions));
      const del = h('button', { type: 'button', class: 'danger', dataset: { action: 'delete' }, 'aria-label': `Delete ${c.name}` }, 'Delete');
      del.addEventListener('click', () => {
        const who = c.shared ? ' Every user loses the tools it serves.' : '';
        if (!window.confirm(`Delete the connection “${c.name}”?\n\nIts sealed credential is deleted with it and its tools turn unavailable unless another connection serves them.${who} This cannot be undone.`)) return;
        act(del, `Delete ${c.name}`, () => api('DELETE', `/v1/connections/${seg(c.id)}`));
      });
      actions.append(toggle, replace, del);
    }
    const permissions = Object.entries(c.permissions ?? {});
    const tools = c.tools ?? [];
    // Tools blocked for the same reason say it once: later rows point at the first one.
    const firstWith = new Map();
    for (const t of tools) if (!t.usable && t.message && !firstWith.has(t.message)) firstWith.set(t.message, t.tool_id);
    const reasonOf = (t) => {
      if (!t.message) return null;
      const first = firstWith.get(t.message);
      return first === t.tool_id ? h('span', { class: 'tool-reason' }, ` ${t.message}`) : h('span', { class: 'tool-reason hint' }, ' (the reason given for ', code(first), ')');
    };
    const titleId = `connection-title-${c.id}`;
    return h('article', { class: 'card connection', dataset: { connection: c.id, state: c.state, kind: c.kind }, 'aria-labelledby': titleId },
      h('h3', { class: 'connection-title', id: titleId }, h('span', { class: 'connection-name' }, c.name), ' ', badge(KINDS[c.kind] ?? c.kind, 'kind'), ' ', badge(c.state)),
      h('p', { class: 'state-words' }, STATE_WORDS[c.state] ?? c.state,
        c.state === 'rate_limited' && c.rate_limited_until ? ` Until ${fmtTime(c.rate_limited_until)}.` : ''),
      dl([
        ['Id', code(c.id)],
        ['Kind', KINDS[c.kind] ?? c.kind],
        ['Owner', c.shared ? (c.editable ? 'shared: every user may use it (you may change it)' : 'shared: every user may use it (only an admin may change it)') : 'yours'],
        ['Enabled', h('span', { class: 'enabled' }, c.enabled ? 'yes' : 'no')],
        ['Account', c.account ? h('span', { class: 'account' }, c.account) : 'not known (no successful check)'],
        ['Last check', h('span', { class: 'checked-at' }, c.checked_at ? fmtTime(c.checked_at) : 'never')],
        ['Last error', c.last_error ? h('span', { class: 'last-error error' }, c.last_error) : 'none'],
        ['Rate limited until', c.rate_limited_until ? h('span', { class: 'rate-limit' }, fmtTime(c.rate_limited_until)) : undefined],
        ['Settings', settingValue(c.settings ?? {})],
        ['Added', fmtTime(c.created_at)],
      ]),
      h('div', { class: 'table-wrap' }, h('table', { class: 'permissions' },
        h('caption', {}, 'Permissions'),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Permission'), h('th', { scope: 'col' }, 'What it allows'), h('th', { scope: 'col' }, 'Found'))),
        h('tbody', {}, permissions.length ? permissions.map(([name, p]) => h('tr', { dataset: { permission: name, access: p.access?.state ?? 'unchecked' } },
          h('th', { scope: 'row' }, code(name)), h('td', { dataset: { label: 'What it allows' } }, p.description), h('td', { dataset: { label: 'Found' } }, accessWords(p.access))))
          : h('tr', {}, h('td', { colspan: '3', class: 'empty' }, 'This server has no driver for this kind.'))))),
      h('div', { class: 'table-wrap' }, h('table', { class: 'tool-needs' },
        h('caption', {}, 'What each tool needs'),
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Tool'), h('th', { scope: 'col' }, 'Permission'), h('th', { scope: 'col' }, 'Usable now'))),
        h('tbody', {}, tools.length ? tools.map((t) => h('tr', { dataset: { tool: t.tool_id, usable: String(t.usable), code: t.code ?? '' } },
          h('th', { scope: 'row' }, code(t.tool_id)), h('td', { dataset: { label: 'Permission' } }, code(t.permission)),
          h('td', { dataset: { label: 'Usable now' } }, t.usable ? badge('usable', 'ok')
            : [badge(t.code ?? 'unusable', 'blocked'), reasonOf(t)])))
          : h('tr', {}, h('td', { colspan: '3', class: 'empty' }, 'No tool of this kind is registered.'))))),
      actions);
  };

  const render = async (force) => {
    let body;
    try { body = await get('/v1/connections'); } catch (err) {
      if (err.missingRoute) {
        unavailable = true;
        form.hidden = true;
        fill(list, notAvailable('Connections', 'GET /v1/connections'));
      } else {
        fill(list, errorBox(err, 'Could not list connections'));
      }
      last = '';
      return;
    }
    const text = JSON.stringify(body);
    // Leave the list alone while the person is using a control in it (or typing a credential).
    const busy = list.querySelector('form.credential')
      || (list.contains(document.activeElement) && document.activeElement.matches('button:not(:disabled), input, a'));
    if (!force && (text === last || busy)) return;
    last = text;
    const connections = body.connections ?? [];
    if (!connections.length) fill(list, h('p', { class: 'empty' }, 'No connection yet: the GitHub and Mail tools stay unavailable (no_connection) until one is added.'));
    else fill(list, connections.map(card));
  };

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const kind = kindSel.value;
    // The credential leaves the form here: its field is empty from now on, whatever happens.
    const body = readForm(kind, els, credentials);
    add.disabled = true;
    fill(msg, h('p', { class: 'hint' }, `Adding and checking the ${KINDS[kind]} connection…`));
    try {
      const c = await post('/v1/connections', body);
      fill(msg, h('p', { class: 'ok' }, `Added ${c.name}: ${(STATE_WORDS[c.state] ?? c.state).toLowerCase()}`));
      announce(`Added ${c.name}, state ${c.state.replaceAll('_', ' ')}`);
      els['connection-name'].value = '';
      await render(true);
      list.querySelector(`article[data-connection="${CSS.escape(c.id)}"] h3`)?.setAttribute('tabindex', '-1');
      list.querySelector(`article[data-connection="${CSS.escape(c.id)}"] h3`)?.focus();
    } catch (err) {
      fill(msg, errorBox(err, `Adding the ${KINDS[kind]} connection failed (type the credential again)`));
    } finally {
      add.disabled = false;
    }
  });

  await render(true);
  if (unavailable) return null;
  const tick = async () => { if (closed) return; await render(false); if (!closed) timer = setTimeout(tick, REFRESH_MS); };
  timer = setTimeout(tick, REFRESH_MS);
  return () => { closed = true; clearTimeout(timer); };
}
