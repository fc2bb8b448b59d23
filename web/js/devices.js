// Devices: the machines where `mira runner` runs the Read and Edit work of the user's runs
// (docs/runner.md). Lists each device with its status (connected / offline / revoked /
// not enrolled), when its runner was last seen, and what the runner advertised (workspace
// folders, capabilities, the sandbox of its terminal sessions, version); registers a device
// and shows its one-time enrollment code once, with the `mira-runner enroll` command to copy;
// issues a new code, renames and revokes.
// Reads GET /v1/devices (refreshed every few seconds while open). Every server string is set
// as text (device names are user input).

import { api, get, post, seg } from './api.js';
import { h, fill, dl, code, badge, errorBox, notAvailable, title, announce, fmtTime } from './ui.js';

const REFRESH_MS = 4000;
const STATUS_WORDS = {
  connected: 'its runner is connected',
  offline: 'enrolled; its runner is not connected',
  revoked: 'revoked: its runner can never connect again',
  not_enrolled: 'no runner has enrolled with its code yet',
};

/** The shell command that enrolls a runner with `code` against this server. */
function enrollCommand(enrollmentCode) {
  return `mira-runner enroll --server ${location.origin} --code ${enrollmentCode}`;
}

export async function mount(root) {
  root.append(title('Devices', 'Machines where mira runner does the Read and Edit work of your runs, connected outbound to this server.'));
  const msg = h('div', { 'aria-live': 'polite' });
  const enrollment = h('section', { id: 'enrollment', 'aria-labelledby': 'enrollment-title', hidden: true });
  const list = h('div', { class: 'cards', id: 'devices' });
  const nameIn = h('input', { id: 'device-name', name: 'name', type: 'text', required: true, maxlength: '128', autocomplete: 'off', spellcheck: 'false' });
  const register = h('button', { type: 'submit' }, 'Register');
  const form = h('form', { id: 'register-device', class: 'filters', 'aria-labelledby': 'register-title' },
    h('div', { class: 'field' }, h('label', { for: 'device-name' }, 'Device name'), nameIn),
    register);
  root.append(
    h('section', { class: 'exposure', 'aria-labelledby': 'register-title' },
      h('h2', { id: 'register-title' }, 'Register a device'),
      h('p', { class: 'hint' }, 'Registering answers a one-time enrollment code (valid for a few minutes, shown once). Run the command it shows on the device; the device makes its own key, which never leaves it.'),
      form),
    msg, enrollment,
    h('h2', {}, 'Your devices'),
    list);

  let last = '';
  let timer = null;
  let closed = false;
  let unavailable = false;

  /** Shows a one-time code once (for `device`), with the command to copy. */
  const showCode = (device, e) => {
    const command = enrollCommand(e.code);
    const copy = h('button', { type: 'button', class: 'secondary', id: 'copy-enroll' }, 'Copy the command');
    const copied = h('span', { class: 'hint', 'aria-live': 'polite' });
    copy.addEventListener('click', async () => {
      try {
        await navigator.clipboard.writeText(command);
        copied.textContent = ' Copied.';
      } catch {
        // No clipboard permission: select the command so that it can be copied by hand.
        const sel = window.getSelection();
        sel.selectAllChildren(cmdEl);
        copied.textContent = ' Selected: copy it with your keyboard.';
      }
    });
    const done = h('button', { type: 'button', class: 'secondary' }, 'Done: hide the code');
    done.addEventListener('click', () => { fill(enrollment); enrollment.hidden = true; nameIn.focus(); });
    const cmdEl = h('code', { class: 'mono enroll-command' }, command);
    fill(enrollment, h('div', { class: 'card enrollment', dataset: { device: device.id } },
      h('h2', { id: 'enrollment-title', tabindex: '-1' }, 'Enrollment code for ', h('span', { class: 'device-name' }, device.name)),
      h('p', {}, 'Shown only now: the server keeps only a hash of it. It works once, until ',
        h('strong', { class: 'expires' }, fmtTime(e.expires_at)), ` (${e.expires_at}).`),
      dl([['Code', code(e.code, 'enrollment-code')], ['Expires', fmtTime(e.expires_at)]]),
      h('p', {}, 'On the device, run:'),
      h('pre', { class: 'command', tabindex: '0', 'aria-label': 'Enrollment command' }, cmdEl),
      h('p', { class: 'hint' }, 'Then start it with the folders it may work in: ',
        code('mira-runner --server … --workspace DIR'), ' (add ', code('--confirm'), ' to confirm each approved job on the device).'),
      h('div', { class: 'actions' }, copy, copied, done)));
    enrollment.hidden = false;
    enrollment.querySelector('h2').focus();
  };

  const act = async (btn, what, fn) => {
    btn.disabled = true;
    fill(msg);
    try {
      await fn();
      announce(`${what}: done`);
      await render(true);
    } catch (err) {
      btn.disabled = false;
      fill(msg, errorBox(err, `${what} failed`));
    }
  };

  // The sandbox of the runner's terminal sessions (docs/runner.md, Isolation).
  const sandboxWords = (sb) => {
    const sessions = { sandboxed: 'sessions sandboxed', refused: 'sessions refused', unsandboxed_allowed: 'sessions run unsandboxed (allowed by the runner)' };
    const head = sb.state === 'enforced' ? `enforced (${sb.filesystem ?? '?'})` : sb.state;
    return h('span', { class: 'sandbox', dataset: { sandbox: sb.state } },
      head, ': ', sessions[sb.sessions] ?? sb.sessions, sb.reason ? ` — ${sb.reason}` : '');
  };

  const card = (d) => {
    const adv = d.advertised ?? null;
    const workspaces = adv?.workspaces ?? [];
    const caps = d.capabilities ?? [];
    const actions = h('div', { class: 'actions' });
    const revoked = d.status === 'revoked';
    if (!revoked) {
      const newCode = h('button', { type: 'button', class: 'secondary', dataset: { action: 'new-code' }, 'aria-label': `New enrollment code for ${d.name}` }, 'New enrollment code');
      newCode.addEventListener('click', () => act(newCode, 'New enrollment code', async () => {
        showCode(d, await post(`/v1/devices/${seg(d.id)}/enrollment-code`));
      }));
      const rename = h('button', { type: 'button', class: 'secondary', dataset: { action: 'rename' }, 'aria-label': `Rename ${d.name}` }, 'Rename');
      rename.addEventListener('click', () => renameForm(d, actions));
      const revoke = h('button', { type: 'button', class: 'danger', dataset: { action: 'revoke' }, 'aria-label': `Revoke ${d.name}` }, 'Revoke');
      revoke.addEventListener('click', () => {
        if (!window.confirm(`Revoke the device “${d.name}”?\n\nIts runner is disconnected at once and can never connect again; runs bound to it cannot use their tools. This cannot be undone.`)) return;
        act(revoke, `Revoke ${d.name}`, async () => {
          await post(`/v1/devices/${seg(d.id)}/revoke`);
          // A code of a revoked device enrolls nothing: stop showing it.
          if (enrollment.querySelector('.enrollment')?.dataset.device === d.id) { fill(enrollment); enrollment.hidden = true; }
        });
      });
      actions.append(newCode, rename, revoke);
    }
    return h('article', { class: 'card device', dataset: { device: d.id, status: d.status } },
      h('h3', { class: 'device-title' }, h('span', { class: 'device-name' }, d.name), ' ', badge(d.status)),
      h('p', { class: 'hint status-words' }, STATUS_WORDS[d.status] ?? d.status),
      dl([
        ['Id', code(d.id)],
        ['Last seen', d.last_seen_at ? fmtTime(d.last_seen_at) : 'never'],
        ['Enrolled', d.enrolled_at ? fmtTime(d.enrolled_at) : 'not yet'],
        ['Revoked', d.revoked_at ? fmtTime(d.revoked_at) : undefined],
        ['Pending code expires', !revoked && d.enrollment_expires_at ? fmtTime(d.enrollment_expires_at) : undefined],
        ['Workspaces', workspaces.length
          ? h('ul', { class: 'plain workspaces' }, workspaces.map((w) => h('li', {}, code(w.path))))
          : (adv ? 'none advertised' : 'not known until its runner connects')],
        ['Capabilities', caps.length ? h('span', { class: 'capabilities' }, caps.map((c, i) => [i ? ', ' : '', code(c)])) : 'none'],
        ['Terminal sandbox', adv?.sandbox ? sandboxWords(adv.sandbox) : undefined],
        ['Version', adv?.version ? code(adv.version) : undefined],
        ['Registered', fmtTime(d.created_at)],
      ]),
      actions);
  };

  const renameForm = (d, actions) => {
    const id = `rename-${d.id}`;
    const input = h('input', { id, type: 'text', required: true, maxlength: '128', value: d.name, autocomplete: 'off' });
    const save = h('button', { type: 'submit' }, 'Save name');
    const cancel = h('button', { type: 'button', class: 'secondary' }, 'Cancel');
    const f = h('form', { class: 'inline rename', dataset: { rename: d.id } },
      h('label', { for: id }, 'New name'), input, save, cancel);
    cancel.addEventListener('click', () => render(true));
    f.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const name = input.value.trim();
      if (!name) return;
      act(save, `Rename ${d.name}`, async () => {
        const renamed = await api('PATCH', `/v1/devices/${seg(d.id)}`, { name });
        const shown = enrollment.querySelector('.enrollment');
        if (shown?.dataset.device === d.id) shown.querySelector('.device-name').textContent = renamed.name;
      });
    });
    fill(actions, f);
    input.focus();
    input.select();
  };

  const render = async (force) => {
    let body;
    try { body = await get('/v1/devices'); } catch (err) {
      if (err.missingRoute) {
        unavailable = true;
        form.hidden = true;
        fill(list, notAvailable('Devices', 'GET /v1/devices'));
      } else {
        fill(list, errorBox(err, 'Could not list devices'));
      }
      last = '';
      return;
    }
    const text = JSON.stringify(body);
    // Leave the list alone while the person is using a control in it (or renaming).
    const busy = list.querySelector('form.rename')
      || (list.contains(document.activeElement) && document.activeElement.matches('button, input, a'));
    if (!force && (text === last || busy)) return;
    last = text;
    const devices = body.devices ?? [];
    if (!devices.length) fill(list, h('p', { class: 'empty' }, 'No device is registered yet.'));
    else fill(list, devices.map(card));
  };

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = nameIn.value.trim();
    if (!name) { nameIn.focus(); return; }
    register.disabled = true;
    fill(msg);
    try {
      const d = await post('/v1/devices', { name });
      nameIn.value = '';
      if (d.enrollment) showCode(d, d.enrollment);
      announce(`Registered ${d.name}`);
      await render(true);
    } catch (err) {
      fill(msg, errorBox(err, 'Registering the device failed'));
    } finally {
      register.disabled = false;
    }
  });

  await render(true);
  if (unavailable) return null;
  const tick = async () => { if (closed) return; await render(false); if (!closed) timer = setTimeout(tick, REFRESH_MS); };
  timer = setTimeout(tick, REFRESH_MS);
  return () => { closed = true; clearTimeout(timer); };
}
