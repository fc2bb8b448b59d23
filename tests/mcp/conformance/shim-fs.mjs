// `node:fs` plus `globSync` for Node < 22 (see register.mjs): `*`, `?` and `**` patterns only.
export * from 'node:fs';
import fs from 'node:fs';
import path from 'node:path';
export default fs;
// Node 20 has no fs.globSync (added in 22): a minimal one for the patterns the suite uses.
export function globSync(pattern, options = {}) {
  const cwd = options.cwd ?? process.cwd();
  const parts = pattern.split('/');
  const re = (p) => new RegExp('^' + p.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*').replace(/\?/g, '.') + '$');
  let current = [''];
  for (const part of parts) {
    const next = [];
    for (const base of current) {
      const dir = path.join(cwd, base);
      if (part === '**') {
        const walk = (rel) => { next.push(rel); let ents = []; try { ents = fs.readdirSync(path.join(cwd, rel), { withFileTypes: true }); } catch {} for (const e of ents) if (e.isDirectory()) walk(path.join(rel, e.name)); };
        walk(base);
        continue;
      }
      if (!/[*?]/.test(part)) { if (fs.existsSync(path.join(dir, part))) next.push(path.join(base, part)); continue; }
      let ents = []; try { ents = fs.readdirSync(dir); } catch {}
      for (const e of ents) if (re(part).test(e)) next.push(path.join(base, e));
    }
    current = next;
  }
  return [...new Set(current)];
}
