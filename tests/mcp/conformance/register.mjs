// Preloaded (`node --import`) into the official MCP conformance suite by tests/it/mcp_server.rs:
// - its client has no way to send a bearer token, and every request to Mira's /mcp needs one:
//   the token of MIRA_TOKEN is added to each fetch to MIRA_ORIGIN (and nowhere else);
// - the suite imports `globSync` from `fs`, which Node added in 22: on an older Node, `fs` is
//   resolved to shim-fs.mjs, which adds a minimal one.
import fs from 'node:fs';
import { register } from 'node:module';

if (!('globSync' in fs)) register('./loader.mjs', import.meta.url);

const token = process.env.MIRA_TOKEN;
const origin = process.env.MIRA_ORIGIN;
const original = globalThis.fetch;
globalThis.fetch = (input, init = {}) => {
  const url = typeof input === 'string' ? input : (input.url ?? String(input));
  if (token && origin && url.startsWith(origin)) {
    const headers = new Headers(init.headers ?? (typeof input === 'object' ? input.headers : undefined) ?? {});
    headers.set('authorization', `Bearer ${token}`);
    init = { ...init, headers };
  }
  return original(input, init);
};
