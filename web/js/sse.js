// Server-Sent Events over fetch(), so that the bearer token goes in a header (EventSource
// cannot send one, and the token must never be put in a URL). Parses the text/event-stream
// format (WHATWG HTML §9.2), reconnects with exponential backoff, and resumes with
// `Last-Event-ID` set to the last id received, as EventSource would.

import { authHeaders, errorFrom, ApiError } from './api.js';

/**
 * Follows `path`. Calls onEvent({id, event, data}) for every dispatched event and
 * onState({state: 'connecting'|'open'|'reconnecting'|'closed'|'failed', error, reconnects, resumedAfter}).
 * A 4xx answer (other than 408/429) stops the stream with state 'failed'.
 * Returns {close(), lastEventId()}.
 */
export function follow(path, { onEvent, onState = () => {}, lastEventId = null, minRetryMs = 500, maxRetryMs = 10000 } = {}) {
  let closed = false;
  let controller = null;
  let last = lastEventId;
  let reconnects = 0;

  const close = () => {
    closed = true;
    if (controller) controller.abort();
    onState({ state: 'closed', reconnects });
  };

  (async () => {
    let retry = minRetryMs;
    let first = true;
    while (!closed) {
      controller = new AbortController();
      const resumedAfter = last;
      onState({ state: first ? 'connecting' : 'reconnecting', reconnects, resumedAfter });
      let error = null;
      try {
        const headers = authHeaders({ Accept: 'text/event-stream' });
        if (last !== null && last !== undefined && last !== '') headers['Last-Event-ID'] = String(last);
        const resp = await fetch(path, { headers, signal: controller.signal, cache: 'no-store' });
        if (!resp.ok) {
          const err = await errorFrom(resp, 'GET', path);
          if (resp.status >= 400 && resp.status < 500 && resp.status !== 408 && resp.status !== 429) {
            if (resp.status === 401) window.dispatchEvent(new CustomEvent('mira:unauthorized', { detail: err }));
            closed = true;
            onState({ state: 'failed', error: err, reconnects });
            return;
          }
          throw err;
        }
        onState({ state: 'open', reconnects, resumedAfter: first ? null : resumedAfter });
        first = false;
        let got = false;
        await read(resp.body, (ev) => {
          got = true;
          if (ev.id !== null) last = ev.id;
          if (!closed) onEvent(ev);
        });
        if (got) retry = minRetryMs;
      } catch (err) {
        if (closed) return;
        error = err instanceof ApiError ? err
          : new ApiError({ status: 0, code: 'stream_interrupted', message: `the live stream was interrupted (${err.message})`, method: 'GET', path });
      }
      if (closed) return;
      reconnects += 1;
      onState({ state: 'reconnecting', error, reconnects, resumedAfter: last, retryInMs: retry });
      await new Promise((r) => setTimeout(r, retry));
      retry = Math.min(retry * 2, maxRetryMs);
    }
  })();

  return { close, lastEventId: () => last };
}

/** Reads an event stream body, calling dispatch({id, event, data}) per event. */
async function read(body, dispatch) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  let data = [];
  let event = '';
  let id = null;
  let sawId = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let nl;
    while ((nl = buf.search(/\r\n|\r|\n/)) !== -1) {
      if (buf[nl] === '\r' && nl === buf.length - 1) break; // a CR at the end may be half of CRLF
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + (buf.startsWith('\r\n', nl) ? 2 : 1));
      if (line === '') {
        if (data.length) dispatch({ id: sawId ? id : null, event: event || 'message', data: data.join('\n') });
        data = []; event = ''; sawId = false;
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon === -1 ? line : line.slice(0, colon);
      let v = colon === -1 ? '' : line.slice(colon + 1);
      if (v.startsWith(' ')) v = v.slice(1);
      if (field === 'data') data.push(v);
      else if (field === 'event') event = v;
      else if (field === 'id' && !v.includes('\0')) { id = v; sawId = true; }
    }
  }
}

/** JSON of an event's data, or null. */
export function json(ev) {
  try { return JSON.parse(ev.data); } catch { return null; }
}
