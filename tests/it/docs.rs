//! The documents in the repository stay true to the code:
//! - every operation of the OpenAPI document has its section in `docs/api.md`, and every
//!   section is an operation;
//! - every `METHOD /path` the documents name is served by the server (no route-404, no 405);
//! - every error code the source can emit is listed in `docs/api.md`, and its table of error
//!   codes is the `ErrorCode` catalogue (code and status), as is the table of codes any
//!   operation can answer;
//! - the README and the documents link only to files that exist in the repository;
//! - the README's shell example runs as written against a fresh server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;
use reqwest::StatusCode;
use serde_json::Value;

use mira::error::ErrorCode;

use crate::common::{self, Backend, Options};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every file under `dir` (relative to the repository) whose name ends with `ext`.
fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries {
            let p = e.unwrap().path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if p.is_dir() {
                if !matches!(name, "target" | "node_modules" | ".git" | ".cache") {
                    walk(&p, ext, out);
                }
            } else if name.ends_with(ext) {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(ROOT).join(dir), ext, &mut out);
    out.sort();
    out
}

/// The Markdown documents of the repository: the README, `docs/`, and the READMEs of `bench/`.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![Path::new(ROOT).join("README.md")];
    docs.extend(files("docs", ".md"));
    docs.extend(files("bench", ".md"));
    docs
}

/// `(METHOD, path)` of every operation in the OpenAPI document generated from the code.
fn openapi_operations() -> BTreeSet<(String, String)> {
    let doc = serde_json::to_value(mira::http::openapi()).unwrap();
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.insert((method.to_ascii_uppercase(), path.clone()));
        }
    }
    ops
}

/// The operation sections of `docs/api.md`: headings ``### `METHOD /path` ``.
fn api_md_sections() -> BTreeSet<(String, String)> {
    let heading = Regex::new(r"(?m)^### `(GET|POST|PUT|PATCH|DELETE) (/\S*)`$").unwrap();
    heading.captures_iter(&read("docs/api.md")).map(|c| (c[1].to_owned(), c[2].to_owned())).collect()
}

#[test]
fn every_operation_has_its_section_in_api_md() {
    let ops = openapi_operations();
    let sections = api_md_sections();
    let missing: Vec<_> = ops.difference(&sections).collect();
    let extra: Vec<_> = sections.difference(&ops).collect();
    assert!(missing.is_empty(), "operations of the OpenAPI document without a section in docs/api.md: {missing:?}");
    assert!(extra.is_empty(), "docs/api.md has sections for operations the OpenAPI document lacks: {extra:?}");
    assert!(ops.len() >= 50, "only {} operations found: is the OpenAPI document empty?", ops.len());
}

/// Every `METHOD /path` named in the documents, with the documents naming it.
fn named_routes() -> BTreeMap<(String, String), BTreeSet<String>> {
    let route = Regex::new(r"\b(GET|POST|PUT|PATCH|DELETE) (/[A-Za-z0-9_./{}:-]*)").unwrap();
    let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(ROOT).unwrap().display().to_string();
        for c in route.captures_iter(&text) {
            let path = c[2].trim_end_matches(['.', ':']).to_owned();
            out.entry((c[1].to_owned(), path)).or_default().insert(name.clone());
        }
    }
    out
}

/// Each named route, asked without a token and with `{params}` filled with well-formed ids,
/// must reach a handler: the router's own answers (404 with `details.resource = "route"`
/// for an unknown path, 405 for a known path with another method) mean the documents name
/// something the server does not serve.
async fn documented_routes_are_served(backend: Backend) {
    let t = common::spawn(backend).await;
    let param = Regex::new(r"\{[^}/]*\}").unwrap();
    let routes = named_routes();
    assert!(routes.len() >= 50, "only {} routes named in the documents", routes.len());
    let mut unserved = Vec::new();
    for ((method, path), docs) in &routes {
        let concrete = param.replace_all(path, "x_0190a4c3e7b27f0e9a3c5d1e2f304152");
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = t.client.request(method.clone(), format!("{}{concrete}", t.base));
        if method != reqwest::Method::GET {
            req = req.header("content-type", "application/json").body("{}");
        }
        let resp = req.send().await.unwrap();
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let route_missing = status == StatusCode::NOT_FOUND && body["error"]["details"]["resource"] == "route";
        if route_missing || status == StatusCode::METHOD_NOT_ALLOWED {
            unserved.push(format!("{method} {path} ({status}, named in {docs:?})"));
        }
    }
    assert!(unserved.is_empty(), "routes the documents name but the server does not serve:\n{}", unserved.join("\n"));
}

/// The error codes the source can emit: every code of the `ErrorCode` catalogue, and the
/// string literals in the positions where the code gives a reason, a stage or a fetch error
/// its code. Comment lines and the benchmarks (any path with `bench` in a component) are left
/// out.
fn source_codes() -> BTreeMap<String, BTreeSet<String>> {
    let code = r#""([a-z][a-z0-9_]*)""#;
    let patterns: Vec<Regex> = [
        format!(r"\bcode:\s*{code}"),
        format!(r#""code":\s*{code}"#),
        format!(r#"\bstage\(\s*"[a-z_]+",\s*"[a-z_]+",\s*{code}"#),
        format!(r#"(?:=>|\{{)\s*\(\s*{code},\s*(?:format!\(|")"#),
    ]
    .iter()
    .map(|p| Regex::new(p).unwrap())
    .collect();
    // `const STALE_DEFINITION: &str = "stale_definition";`: a constant named after its code.
    let constant = Regex::new(r#"const ([A-Z][A-Z0-9_]*): &str = "([a-z][a-z0-9_]*)";"#).unwrap();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for code in ErrorCode::ALL {
        out.entry(code.as_str().to_owned()).or_default().insert("ErrorCode".to_owned());
    }
    let mut sources = files("src", ".rs");
    sources.extend(files("crates", ".rs"));
    for file in sources {
        let rel = file.strip_prefix(ROOT).unwrap().display().to_string();
        if rel.split('/').any(|part| part.contains("bench")) {
            continue;
        }
        let text: String = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for p in &patterns {
            for c in p.captures_iter(&text) {
                out.entry(c[1].to_owned()).or_default().insert(rel.clone());
            }
        }
        for c in constant.captures_iter(&text) {
            if c[1] == c[2].to_ascii_uppercase() {
                out.entry(c[2].to_owned()).or_default().insert(rel.clone());
            }
        }
    }
    out
}

#[test]
fn every_error_code_of_the_source_is_in_api_md() {
    let codes = source_codes();
    // Fewer means the way codes are written changed (a code catalogue type, say): teach
    // `source_codes` the new form rather than letting this check go quiet.
    assert!(codes.len() >= 150, "only {} codes found in the source; update source_codes()", codes.len());
    let api = read("docs/api.md");
    let missing: Vec<String> = codes
        .iter()
        .filter(|(code, _)| !api.contains(&format!("`{code}`")))
        .map(|(code, files)| format!("{code} ({files:?})"))
        .collect();
    assert!(missing.is_empty(), "error codes the source emits that docs/api.md does not list:\n{}", missing.join("\n"));
}

/// The rows `| status | `code` | … |` of the table under `heading` in `docs/api.md`.
fn api_md_code_table(heading: &str) -> Vec<(u16, String)> {
    let api = read("docs/api.md");
    let start = api.find(heading).unwrap_or_else(|| panic!("docs/api.md has no {heading:?}"));
    let row = Regex::new(r"^\| (\d{3}) \| `([a-z0-9_]+)` \|").unwrap();
    api[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| row.captures(l).map(|c| (c[1].parse().unwrap(), c[2].to_owned())))
        .collect()
}

#[test]
fn api_md_error_code_table_is_the_catalogue() {
    let table = api_md_code_table("### Error codes");
    let catalogue: Vec<(u16, String)> = ErrorCode::ALL.iter().map(|c| (c.status(), c.as_str().to_owned())).collect();
    let missing: Vec<_> = catalogue.iter().filter(|c| !table.contains(c)).collect();
    let extra: Vec<_> = table.iter().filter(|c| !catalogue.contains(c)).collect();
    assert!(
        missing.is_empty(),
        "codes of the catalogue (status, code) not in docs/api.md's Error codes table: {missing:?}"
    );
    assert!(extra.is_empty(), "rows of docs/api.md's Error codes table that are not the catalogue's: {extra:?}");
    assert_eq!(table, catalogue, "the Error codes table is in the catalogue's order (status, then code)");
}

#[test]
fn api_md_table_of_codes_any_operation_answers_agrees_with_the_catalogue() {
    let table = api_md_code_table("### Errors");
    assert!(table.len() >= 10, "only {} rows in docs/api.md's Errors table", table.len());
    for (status, code) in &table {
        let known = ErrorCode::parse(code).unwrap_or_else(|| panic!("{code} (docs/api.md, Errors) is no ErrorCode"));
        assert_eq!(known.status(), *status, "{code}: docs/api.md says {status}, the catalogue {}", known.status());
    }
}

#[test]
fn documents_link_only_to_files_of_the_repository() {
    let link = Regex::new(r"\]\(([^)\s]+)\)").unwrap();
    let outside = concat!("..", "/shared");
    let mut broken = Vec::new();
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(ROOT).unwrap().display().to_string();
        if text.contains(outside) {
            broken.push(format!("{name} refers to {outside}, which a clone does not have"));
        }
        for c in link.captures_iter(&text) {
            let target = &c[1];
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with('#') {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            let resolved = doc.parent().unwrap().join(file);
            let inside = std::fs::canonicalize(&resolved).is_ok_and(|p| p.starts_with(ROOT));
            if !inside {
                broken.push(format!("{name} links to {target}, which is not a file of the repository"));
            }
        }
    }
    for dir in ["src", "crates", "examples", "scripts", "tests/mcp", "web"] {
        for file in files(dir, "") {
            if std::fs::read_to_string(&file).is_ok_and(|t| t.contains(outside)) {
                broken.push(format!("{} refers to {outside}", file.strip_prefix(ROOT).unwrap().display()));
            }
        }
    }
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// The shell block of the README between `<!-- readme-example: start -->` and `… end -->`.
fn readme_example() -> String {
    let readme = read("README.md");
    let start = readme.find("<!-- readme-example: start -->").expect("README example start marker");
    let end = readme.find("<!-- readme-example: end -->").expect("README example end marker");
    let block = &readme[start..end];
    let body = block.split_once("```sh\n").expect("a ```sh block").1;
    body.rsplit_once("```").expect("the block's closing fence").0.to_owned()
}

/// Runs the README's example as written — `bash` with `set -euo pipefail`, from the folder
/// the server was started in (so `data/admin.token` is the real token file) — against a
/// fresh server, only the URL changed to the server's port.
async fn readme_example_runs_as_written(backend: Backend) {
    for tool in ["bash", "curl", "jq"] {
        let found = std::process::Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().unwrap();
        assert!(found.status.success(), "{tool} is needed (scripts/setup-docs.sh installs it)");
    }
    let t = common::spawn_with(backend, Options { data_in_workspace: true, ..Options::default() }).await;
    assert!(t.workspace.join("data/admin.token").is_file());
    let script = readme_example();
    assert!(script.contains("http://127.0.0.1:8080"), "the example names the default address");
    let script = script.replace("http://127.0.0.1:8080", &t.base);
    // `mktemp -d` (the scratch workspace) inside the test's temporary folder.
    let tmp = t.workspace.parent().unwrap().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&t.workspace)
        .env("TMPDIR", &tmp)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the README example failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stderr.trim().is_empty(), "the README example wrote to stderr:\n{stderr}");
    for expected in [
        r#""status": "awaiting_approval""#,
        "+hello, world",
        r#""granted""#,
        r#""status": "completed""#,
        r#""read_back_matches": true"#,
        r#""kind": "grep_match""#,
        r#""accepted": true"#,
        "event: approval.granted",
        "event: execution.completed",
        "event: evidence.accepted",
    ] {
        assert!(stdout.contains(expected), "the README example's output lacks {expected:?}:\n{stdout}");
    }
    // The edit landed in the scratch workspace, not in the server's own folder.
    let written: Vec<PathBuf> =
        std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().path().join("hello.txt")).filter(|p| p.is_file()).collect();
    assert_eq!(written.len(), 1, "one scratch workspace with hello.txt under {}", tmp.display());
    assert_eq!(std::fs::read_to_string(&written[0]).unwrap(), "hello, world\n");
    assert!(!t.workspace.join("hello.txt").exists());
}

both_backends!(documented_routes_are_served, readme_example_runs_as_written);
