// Resolves `fs` to shim-fs.mjs for modules other than the shim itself (see register.mjs).
const shim = new URL('./shim-fs.mjs', import.meta.url).href;
export async function resolve(specifier, context, next) {
  if ((specifier === 'fs' || specifier === 'node:fs') && context.parentURL && !context.parentURL.endsWith('shim-fs.mjs')) {
    return { url: shim, shortCircuit: true };
  }
  return next(specifier, context);
}
