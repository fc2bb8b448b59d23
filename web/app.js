// The control-plane page: sign-in, then seven views routed by the URL fragment
// (#/approvals, #/runs[/ID], #/tools, #/mcp[/ID], #/devices, #/connections, #/terminal[/ID]).
// The fragment carries only view names and object ids, never the token.

import { session, get, ApiError } from './js/api.js';
import { h, fill, alertError, announce } from './js/ui.js';
import { inbox } from './js/approvals.js';

const views = {
  approvals: () => import('./js/approvals.js'),
  runs: () => import('./js/runs.js'),
  tools: () => import('./js/tools.js'),
  mcp: () => import('./js/mcp.js'),
  devices: () => import('./js/devices.js'),
  connections: () => import('./js/connections.js'),
  terminal: () => import('./js/terminal.js'),
};

const $ = (id) => document.getElementById(id);
let unmount = null;
let routeSeq = 0;

function parseRoute() {
  const raw = location.hash.replace(/^#\/?/, '');
  const [pathPart, query = ''] = raw.split('?');
  const parts = pathPart.split('/').filter(Boolean).map(decodeURIComponent);
  return { view: parts[0] || 'approvals', id: parts[1] ?? null, params: new URLSearchParams(query) };
}

async function route() {
  const seq = ++routeSeq;
  if (unmount) { try { unmount(); } catch (e) { alertError(e, 'Leaving the view'); } unmount = null; }
  const r = parseRoute();
  const load = views[r.view];
  const container = $('view');
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.view === r.view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  if (!load) {
    fill(container, h('h1', { tabindex: '-1' }, 'No such view'), h('p', {}, `There is no view called “${r.view}”. `, h('a', { href: '#/approvals' }, 'Go to the approvals inbox.')));
    return;
  }
  fill(container, h('p', { class: 'loading' }, 'Loading…'));
  try {
    const mod = await load();
    if (seq !== routeSeq) return;
    const root = h('div', { class: `view view-${r.view}` });
    fill(container, root);
    const mounted = mod.mount(root, r);
    // The heading is in place before the view's first request: focus it now so that screen
    // readers announce the new view at once.
    const heading = root.querySelector('h1');
    if (heading) heading.focus({ preventScroll: true });
    unmount = (await mounted) ?? null;
    if (seq !== routeSeq && unmount) { unmount(); unmount = null; return; }
    ready();
  } catch (err) {
    if (seq === routeSeq) fill(container, h('div', { class: 'error-box', role: 'alert' }, `This view failed to open: ${err.describe?.() ?? err.message}`));
  }
}

/** Marks the first moment the page is usable (read by the browser test's load check). */
function ready() {
  if (!performance.getEntriesByName('mira:ready').length) performance.mark('mira:ready');
}

function showSignIn(message) {
  if (unmount) { unmount(); unmount = null; }
  inbox.stop();
  $('nav').hidden = true;
  $('who').hidden = true;
  fill($('view'));
  $('sign-in').hidden = false;
  $('sign-in-error').textContent = message ?? '';
  $('token').value = '';
  $('token').focus();
  ready();
}

async function signedIn(me) {
  $('sign-in').hidden = true;
  $('nav').hidden = false;
  $('who').hidden = false;
  $('who-name').textContent = `Signed in as ${me.name}${me.is_admin ? ' (admin)' : me.is_approver ? ' (approver)' : ''}`;
  inbox.start((count) => {
    const c = $('approval-count');
    c.hidden = count === 0;
    c.textContent = String(count);
    c.setAttribute('aria-label', `${count} pending`);
  });
  await route();
}

async function start() {
  $('sign-in-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const token = $('token').value.trim();
    if (!token) return;
    session.set(token);
    try {
      const me = await get('/v1/me');
      announce(`Signed in as ${me.name}`);
      await signedIn(me);
    } catch (err) {
      session.clear();
      const msg = err instanceof ApiError && err.status === 401
        ? 'The server refused this token (401: a valid bearer token is required). Check it and try again.'
        : `Could not sign in: ${err.describe?.() ?? err.message}`;
      $('sign-in-error').textContent = msg;
      $('token').focus();
    }
  });
  $('sign-out').addEventListener('click', () => {
    session.clear();
    showSignIn('Signed out. The token was removed from this tab.');
  });
  window.addEventListener('mira:unauthorized', () => {
    if (!session.token()) return;
    session.clear();
    showSignIn('The server no longer accepts the token (401). Sign in again.');
  });
  window.addEventListener('hashchange', () => { if (session.token()) route(); });
  // Forget any token that ever ended up in the address bar (it must not be there).
  if (/token=/i.test(location.href)) history.replaceState(null, '', location.pathname + location.hash.replace(/[?&]token=[^&]*/i, ''));

  if (!session.token()) return showSignIn();
  try {
    await signedIn(await get('/v1/me'));
  } catch (err) {
    if (err.status === 401) showSignIn('The saved token is no longer valid. Sign in again.');
    else {
      showSignIn();
      $('sign-in-error').textContent = `Could not reach the API: ${err.describe?.() ?? err.message}`;
    }
  }
}

start();
