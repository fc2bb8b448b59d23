// Writes a copy of GitHub's OpenAPI description (@octokit/openapi) with only the operations the
// GitHub tools call and the components they reference, so Prism starts in about a second instead
// of ~15 s (and ~300 MB) on the full 13 MB description.
// Usage: node scripts/github-trim-openapi.mjs <api.github.com.json> <out.json>
import { readFileSync, writeFileSync } from "node:fs";

const [input, output] = process.argv.slice(2);
if (!input || !output) {
  console.error("usage: github-trim-openapi.mjs <in.json> <out.json>");
  process.exit(2);
}
const PATHS = [
  "/user",
  "/installation/repositories",
  "/app/installations/{installation_id}",
  "/rate_limit",
  "/search/code",
  "/search/issues",
  "/repos/{owner}/{repo}",
  "/repos/{owner}/{repo}/contents/{path}",
  "/repos/{owner}/{repo}/git/trees/{tree_sha}",
  "/repos/{owner}/{repo}/git/ref/{ref}",
  "/repos/{owner}/{repo}/git/refs",
  "/repos/{owner}/{repo}/git/refs/{ref}",
  "/repos/{owner}/{repo}/git/commits",
  "/repos/{owner}/{repo}/git/commits/{commit_sha}",
  "/repos/{owner}/{repo}/git/trees",
  "/repos/{owner}/{repo}/issues",
  "/repos/{owner}/{repo}/issues/{issue_number}",
  "/repos/{owner}/{repo}/issues/{issue_number}/comments",
  "/repos/{owner}/{repo}/issues/{issue_number}/labels",
  "/repos/{owner}/{repo}/pulls",
  "/repos/{owner}/{repo}/pulls/{pull_number}",
  "/repos/{owner}/{repo}/pulls/{pull_number}/reviews",
  "/repos/{owner}/{repo}/pulls/{pull_number}/merge",
  "/repos/{owner}/{repo}/commits/{ref}/check-runs",
  "/repos/{owner}/{repo}/commits/{ref}/status",
  "/repos/{owner}/{repo}/actions/runs",
  "/repos/{owner}/{repo}/actions/runs/{run_id}",
  "/repos/{owner}/{repo}/actions/runs/{run_id}/jobs",
  "/repos/{owner}/{repo}/actions/runs/{run_id}/rerun",
  "/repos/{owner}/{repo}/actions/jobs/{job_id}/logs",
];
const spec = JSON.parse(readFileSync(input, "utf8"));
const paths = {};
for (const p of PATHS) {
  if (!spec.paths[p]) {
    console.error(`github-trim-openapi: ${p} is not in ${input}`);
    process.exit(1);
  }
  paths[p] = spec.paths[p];
}
// GitHub serves its vendor media types (`Accept: application/vnd.github.v3+json`, `.raw`,
// `.diff`), which the description does not list; Prism answers 406 to a media type it does not
// know. Every JSON answer is also declared as application/vnd.github.v3+json, a file's content
// as .v3.raw and a pull request as .v3.diff (examples below).
const RAW_EXAMPLE = "# Hello World\n\nThis file came from the mock.\n";
const DIFF_EXAMPLE =
  "diff --git a/README.md b/README.md\nindex 1111111..2222222 100644\n--- a/README.md\n+++ b/README.md\n@@ -1 +1,2 @@\n # Hello World\n+A new line.\n";
const resolve = (node) => {
  if (node && node.$ref && node.$ref.startsWith("#/components/responses/")) {
    return spec.components.responses[node.$ref.split("/").pop()];
  }
  return node;
};
for (const [p, item] of Object.entries(paths)) {
  for (const [method, op] of Object.entries(item)) {
    if (!op || typeof op !== "object" || !op.responses) continue;
    for (const [status, raw] of Object.entries(op.responses)) {
      const resp = resolve(raw);
      const content = resp?.content;
      if (content?.["application/json"] && !content["application/vnd.github.v3+json"]) {
        content["application/vnd.github.v3+json"] = content["application/json"];
      }
      if (method === "get" && status === "200" && content) {
        if (p === "/repos/{owner}/{repo}/contents/{path}") {
          content["application/vnd.github.v3.raw"] = { schema: { type: "string" }, example: RAW_EXAMPLE };
        }
        if (p === "/repos/{owner}/{repo}/pulls/{pull_number}") {
          content["application/vnd.github.v3.diff"] = { schema: { type: "string" }, example: DIFF_EXAMPLE };
        }
      }
    }
  }
}
// Keep the components reachable from the kept operations.
const keep = new Set();
const walk = (node) => {
  if (Array.isArray(node)) return node.forEach(walk);
  if (!node || typeof node !== "object") return;
  for (const [k, v] of Object.entries(node)) {
    if (k === "$ref" && typeof v === "string" && v.startsWith("#/components/")) {
      if (!keep.has(v)) {
        keep.add(v);
        const [, , kind, name] = v.split("/");
        walk(spec.components?.[kind]?.[name]);
      }
    } else {
      walk(v);
    }
  }
};
walk(paths);
const components = {};
for (const ref of keep) {
  const [, , kind, name] = ref.split("/");
  components[kind] ??= {};
  components[kind][name] = spec.components[kind][name];
}
const out = { openapi: spec.openapi, info: spec.info, servers: spec.servers, paths, components };
writeFileSync(output, JSON.stringify(out));
console.error(`github-trim-openapi: ${PATHS.length} paths, ${keep.size} components -> ${output}`);
