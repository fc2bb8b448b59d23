// The HTTP API of /v1 with the signed-in token. The token lives in sessionStorage only and
// travels only in the Authorization header (never in a URL). Every failure becomes an
// ApiError whose message is a sentence a person can act on.

const KEY = 'mira.token';

export const session = {
  token: () => sessionStorage.getItem(KEY),
  set: (token) => sessionStorage.setItem(KEY, token),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor({ status, code, message, details, method, path }) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.details = details ?? null;
    this.method = method;
    this.path = path;
  }

  /** The server has no such route: the feature is not in this build. */
  get missingRoute() {
    return this.status === 404 && this.details?.resource === 'route';
  }

  /** One line for a person: what failed, why, and the status and code. */
  describe() {
    const what = this.status ? `HTTP ${this.status}, ${this.code}` : this.code;
    return `${this.method} ${this.path} failed: ${this.message} (${what})`;
  }
}

/** Builds an ApiError from a non-2xx response's body (the API's `{"error": {...}}`). */
export async function errorFrom(resp, method, path) {
  let body = null;
  const text = await resp.text().catch(() => '');
  try { body = JSON.parse(text); } catch { /* not JSON */ }
  const e = body?.error;
  if (e && typeof e.message === 'string') {
    return new ApiError({ status: resp.status, code: e.code ?? 'error', message: e.message, details: e.details, method, path });
  }
  const message = text && text.length < 300 ? text.trim() : `the server answered ${resp.status} ${resp.statusText}`;
  return new ApiError({ status: resp.status, code: `http_${resp.status}`, message, method, path });
}

export function authHeaders(extra = {}) {
  const headers = { ...extra };
  const token = session.token();
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

/** Calls the API; resolves to the parsed JSON body, or throws ApiError. */
export async function api(method, path, body) {
  const headers = authHeaders({ Accept: 'application/json' });
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (err) {
    throw new ApiError({ status: 0, code: 'network_error', message: `the server could not be reached (${err.message})`, method, path });
  }
  if (!resp.ok) {
    const err = await errorFrom(resp, method, path);
    if (resp.status === 401) window.dispatchEvent(new CustomEvent('mira:unauthorized', { detail: err }));
    throw err;
  }
  if (resp.status === 204) return null;
  const text = await resp.text();
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    throw new ApiError({ status: resp.status, code: 'invalid_response', message: 'the server answered with something that is not JSON', method, path });
  }
}

export const get = (path) => api('GET', path);
export const post = (path, body = {}) => api('POST', path, body);

/** URL-encodes one path segment. */
export const seg = (s) => encodeURIComponent(s);
