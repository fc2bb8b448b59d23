// Terminal: the caller's terminal sessions (GET /v1/terminal-sessions) and a live view of one
// with xterm.js on GET /v1/terminal-sessions/{id}/stream (SSE of output bytes: `output`,
// `gap`, `exit` events whose id is the byte offset, so a reconnect resumes where it stopped).
// The view follows the window's size; its columns match the session's PTY by default so
// that output wraps as the program meant it. The view only watches: input, signals and PTY
// resizes are governed `terminal_session` calls that need an approval each.

import { get, seg } from './api.js';
import { follow, json } from './sse.js';
import { h, fill, dl, code, badge, errorBox, notAvailable, streamState, fmtTime, fmtMs, title } from './ui.js';

export async function mount(root, route) {
  root.append(title(route.id ? `Terminal ${route.id}` : 'Terminal', 'Live output of the agent’s terminal sessions (read-only).'));
  const body = h('div');
  root.append(body);
  return route.id ? session(body, route.id) : list(body);
}

async function list(body) {
  try {
    const page = await get('/v1/terminal-sessions?limit=100');
    const sessions = page.sessions ?? [];
    if (!sessions.length) { body.append(h('p', { class: 'empty' }, 'No terminal session yet. They start through approved terminal_session calls.')); return null; }
    body.append(h('div', { class: 'table-wrap' }, h('table', { class: 'list', id: 'sessions' },
      h('caption', { class: 'visually-hidden' }, 'Terminal sessions'),
      h('thead', {}, h('tr', {}, ['Session', 'State', 'Command', 'Working directory', 'PID', 'Started', 'Output'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, sessions.map((s) => h('tr', { dataset: { session: s.id } },
        h('th', { scope: 'row' }, h('a', { href: `#/terminal/${encodeURIComponent(s.id)}` }, s.id)),
        h('td', {}, badge(s.state)), h('td', {}, code([s.command, ...(s.args ?? [])].join(' '))), h('td', {}, code(s.cwd)),
        h('td', {}, s.pid ?? '—'), h('td', {}, fmtTime(s.started_at)), h('td', {}, `${s.bytes_out ?? 0} bytes`)))))));
  } catch (err) {
    body.append(err.missingRoute ? notAvailable('Terminal sessions', 'GET /v1/terminal-sessions') : errorBox(err, 'Could not list terminal sessions'));
  }
  return null;
}

async function session(body, id) {
  let s;
  try { s = await get(`/v1/terminal-sessions/${seg(id)}`); } catch (err) {
    body.append(err.missingRoute ? notAvailable('Terminal sessions', 'GET /v1/terminal-sessions/{id}') : errorBox(err, `Could not open terminal session ${id}`));
    return null;
  }
  const info = h('div');
  const state = h('p', { class: 'stream-state', id: 'terminal-state' });
  const sizeLine = h('p', { class: 'hint', id: 'terminal-size', 'aria-live': 'off' });
  const colsMode = h('select', { id: 'cols-mode' }, h('option', { value: 'session' }, 'Match the session’s columns'), h('option', { value: 'fit' }, 'Fit the window'));
  const sr = h('input', { type: 'checkbox', id: 'sr-mode' });
  const screen = h('div', { class: 'terminal-screen', id: 'terminal-screen', role: 'region', 'aria-label': `Output of terminal session ${id}` });
  const exitLine = h('p', { id: 'terminal-exit', 'aria-live': 'polite' });
  const showInfo = (x) => fill(info, dl([
    ['State', badge(x.state)], ['Command', code([x.command, ...(x.args ?? [])].join(' '))], ['Working directory', code(x.cwd)],
    ['PID', x.pid ?? '—'], ['Started', fmtTime(x.started_at)], ['Life limit', fmtMs(x.timeout_ms)],
    ['PTY size', `${x.cols} × ${x.rows}`], ['Output so far', `${x.bytes_out} bytes`],
    ['Reported to the agent', `up to byte ${x.reported_to ?? 0}`], ['Kept in the store', `from byte ${x.retained_from ?? 0}`],
  ]));
  showInfo(s);
  body.append(info,
    h('div', { class: 'filters' }, h('div', { class: 'field' }, h('label', { for: 'cols-mode' }, 'Columns'), colsMode),
      h('div', { class: 'field check' }, sr, h('label', { for: 'sr-mode' }, 'Screen reader mode'))),
    state, sizeLine, screen, exitLine);

  const link = document.createElement('link');
  link.rel = 'stylesheet';
  link.href = '/vendor/xterm/xterm.css';
  document.head.appendChild(link);
  const [{ Terminal }, { FitAddon }] = await Promise.all([import('/vendor/xterm/xterm.mjs'), import('/vendor/xterm/addon-fit.mjs')]);
  const term = new Terminal({
    disableStdin: true, convertEol: false, cursorBlink: false, scrollback: 10000,
    fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace', fontSize: 14,
    theme: { background: '#111418', foreground: '#e8eaed' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);

  const resize = () => {
    const dims = fit.proposeDimensions();
    if (!dims || !Number.isFinite(dims.cols) || !Number.isFinite(dims.rows)) return;
    const cols = colsMode.value === 'session' && s.cols ? s.cols : dims.cols;
    const rows = Math.max(dims.rows, 5);
    if (cols !== term.cols || rows !== term.rows) term.resize(cols, rows);
    sizeLine.textContent = `View ${term.cols} × ${term.rows} · session PTY ${s.cols} × ${s.rows}`;
    screen.dataset.cols = String(term.cols);
    screen.dataset.rows = String(term.rows);
  };
  const observer = new ResizeObserver(() => resize());
  observer.observe(screen);
  colsMode.addEventListener('change', resize);
  sr.addEventListener('change', () => { term.options.screenReaderMode = sr.checked; });
  resize();

  let bytes = 0;
  let ended = false;
  let infoQueued = false;
  const stream = follow(`/v1/terminal-sessions/${seg(id)}/stream?offset=0`, {
    onEvent: (ev) => {
      const d = json(ev) ?? {};
      if (ev.event === 'output') {
        term.write(d.data ?? '');
        bytes = d.end ?? bytes;
        screen.dataset.bytes = String(bytes);
        if (bytes > s.bytes_out && !infoQueued) {
          infoQueued = true;
          requestAnimationFrame(() => { infoQueued = false; s = { ...s, bytes_out: Math.max(s.bytes_out, bytes) }; showInfo(s); });
        }
      } else if (ev.event === 'gap') {
        term.write(`\r\n\x1b[2m[… ${d.to - d.from} bytes no longer retained …]\x1b[0m\r\n`);
      } else if (ev.event === 'exit') {
        const how = d.exit_code !== null && d.exit_code !== undefined ? `exit code ${d.exit_code}` : d.signal ? `signal ${d.signal}` : (d.end_reason ?? d.state);
        ended = true;
        state.dataset.state = 'closed';
        state.textContent = 'Ended: all of the session’s output is shown';
        exitLine.textContent = `The session ended (${d.state}${d.end_reason ? `, ${d.end_reason}` : ''}): ${how}; ${d.bytes_out} bytes of output.`;
        stream.close();
        get(`/v1/terminal-sessions/${seg(id)}`).then((x) => { s = x; showInfo(x); }).catch(() => {});
      } else if (ev.event === 'error') {
        exitLine.textContent = `Stream error: ${d.message ?? ''} (${d.code ?? 'error'})`;
      }
    },
    onState: (st) => {
      if (ended) return;
      streamState(state, st);
      if (st.state === 'failed') body.append(errorBox(st.error, 'The output stream stopped'));
    },
  });
  // The PTY may be resized by the agent (a governed resize action): refresh its size now and then.
  const refresh = setInterval(async () => {
    try { const x = await get(`/v1/terminal-sessions/${seg(id)}`); const changed = x.cols !== s.cols || x.rows !== s.rows; s = x; showInfo(x); if (changed) resize(); } catch { /* shown by the stream state */ }
  }, 5000);
  return () => { stream.close(); observer.disconnect(); clearInterval(refresh); term.dispose(); link.remove(); };
}
