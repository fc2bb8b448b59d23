// Used by scripts/build-mcp-tool-set.sh. Starts each MCP server over stdio, performs the MCP handshake and tools/list, prints
// the tools in the bench format: [{"id": "<server>__<tool>", "name", "title", "description", "input_schema"}].
import { spawn } from 'node:child_process';
const servers = process.argv.slice(2);
const out = [];
for (const spec of servers) {
  const [label, pkg, ...args] = spec.split(' ');
  const bin = `node_modules/${pkg}/dist/index.js`;
  const child = spawn('node', [bin, ...args], { stdio: ['pipe', 'pipe', 'ignore'], env: { ...process.env, GITHUB_PERSONAL_ACCESS_TOKEN: 'x', GITLAB_PERSONAL_ACCESS_TOKEN: 'x', SLACK_BOT_TOKEN: 'x', SLACK_TEAM_ID: 'x', GOOGLE_MAPS_API_KEY: 'x', BRAVE_API_KEY: 'x' } });
  let buf = '';
  const pending = new Map();
  child.stdout.on('data', (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i); buf = buf.slice(i + 1);
      try { const m = JSON.parse(line); if (m.id && pending.has(m.id)) { pending.get(m.id)(m); pending.delete(m.id); } } catch {}
    }
  });
  let next = 1;
  const call = (method, params) => new Promise((res, rej) => {
    const id = next++; pending.set(id, res);
    child.stdin.write(JSON.stringify({ jsonrpc: '2.0', id, method, params }) + '\n');
    setTimeout(() => rej(new Error(`${label}: ${method} timed out`)), 15000);
  });
  await call('initialize', { protocolVersion: '2024-11-05', capabilities: {}, clientInfo: { name: 'mira-bench', version: '0' } });
  child.stdin.write(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) + '\n');
  const r = await call('tools/list', {});
  for (const t of r.result.tools) {
    out.push({ id: `${label}__${t.name}`, name: `${label}__${t.name}`, title: t.title ?? t.annotations?.title ?? t.name, description: t.description ?? '', input_schema: t.inputSchema ?? { type: 'object' } });
  }
  child.kill();
}
process.stdout.write(JSON.stringify(out, null, 1) + '\n');
