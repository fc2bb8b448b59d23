//! A short, bounded property-based run of schemathesis (PyPI, pinned by
//! `scripts/setup-schemathesis.sh`, which exports `MIRA_SCHEMATHESIS`) against a real server on
//! each back-end, driven by the served `/openapi.json` with the admin's token.
//!
//! Checks: `not_a_server_error` (no 5xx), `status_code_conformance` (every status answered is
//! documented for its operation), `content_type_conformance` and `response_schema_conformance`
//! (bodies match the documented schemas). Not checked: `negative_data_rejection` and
//! `positive_data_acceptance` — the document states shapes, not every rule a handler applies
//! (a workspace must exist on disk, a URL must be public), so "schema-valid ⇒ 2xx" cannot hold.
//! The event streams (`…/events`, `…/stream`) never end and are left to their own tests.
//! The path parameters of runs, turns, invocations, approvals and evidence are set (in a
//! `schemathesis.toml`) to real objects made first, so those operations run past 404.
//! Fixed seed, 25 examples per operation, phases examples + coverage + fuzzing, one worker
//! (see [`WORKERS`]); the whole run must finish within 4 minutes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::json;

use crate::common::{Backend, spawn};

/// Why one worker: CPython 3.11 (the machine's Python) keeps the `ast` module's recursion
/// counter in interpreter-wide state, so two threads parsing at once (Hypothesis parses the
/// source of the lambdas in its strategies to describe them) clobber it and one of them gets
/// "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905, fixed in later
/// releases): a generator failure, not a server answer. schemathesis' workers are threads; with
/// two, it failed a CI run on `POST /v1/connections`, and one test run in eight here. With one
/// worker it has not been seen, and `POST /v1/mcp/servers` (left out while this was thought a
/// deep-recursion bug of its schema) is tested again.
const WORKERS: &str = "1";

async fn schemathesis_finds_nothing(backend: Backend) {
    let st = std::env::var("MIRA_SCHEMATHESIS")
        .expect("MIRA_SCHEMATHESIS is not set: run `eval \"$(scripts/setup-schemathesis.sh)\"` (scripts/test.sh does)");
    let t = spawn(backend).await;
    // Real objects for the path parameters, so the operations on them run past 404: a run, a
    // turn, a completed read (with its evidence) and a write awaiting approval.
    let token = t.admin_token.clone();
    std::fs::write(t.workspace.join("a.txt"), "hello\n").unwrap();
    let run = t.run(&token).await;
    let (turn, _) = t.turn(&token, &run, "read and write files").await;
    let read = t.call(&token, &run, &turn, "read_open", "st-read", json!({"path": "a.txt"})).await;
    let invocation = read.body["invocation_id"].as_str().unwrap().to_owned();
    t.wait_final(&token, &invocation).await;
    let write = t.call(&token, &run, &turn, "write_file", "st-write", json!({"path": "b.txt", "content": "x"})).await;
    let approval = write.body["approval_id"].as_str().unwrap().to_owned();
    let evidence =
        t.get(&format!("/v1/runs/{run}/evidence"), &token).await.body["evidence"][0]["id"].as_str().unwrap().to_owned();
    let report = tempfile::tempdir().unwrap();
    let config = report.path().join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            "[parameters]\n\"path.run_id\" = \"{run}\"\n\"path.turn_id\" = \"{turn}\"\n\"path.invocation_id\" = \"{invocation}\"\n\"path.approval_id\" = \"{approval}\"\n\"path.evidence_id\" = \"{evidence}\"\n"
        ),
    )
    .unwrap();
    let command = |seed: u64| {
        let mut cmd = tokio::process::Command::new(&st);
        cmd.arg("--config-file")
            .arg(&config)
            .arg("run")
            .arg(format!("{}/openapi.json", t.base))
            .args(["-H", &format!("Authorization: Bearer {}", t.admin_token)])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
            ])
            .args(["--exclude-path-regex", "/(events|stream)$"])
            .args(["--phases", "examples,coverage,fuzzing"])
            .args(["--seed", &seed.to_string(), "--max-examples", "25", "--workers", WORKERS, "--no-shrink"])
            .args(["--request-timeout", "20", "--output-truncate", "true"])
            .arg("--report-dir")
            .arg(report.path())
            // Its cache (`.schemathesis/`) goes into the temporary directory, not the work tree.
            .current_dir(report.path())
            .env("NO_COLOR", "1")
            .env("SCHEMATHESIS_TELEMETRY", "false")
            .kill_on_drop(true);
        cmd
    };
    // Should the CPython 3.11 `ast` crash (see WORKERS) still happen, no server answer was
    // wrong, the generator failed. The whole run is repeated, with the next
    // seed (the same seed met the same crash twice in a row once), at most three runs in all;
    // any other failure ends the test at once.
    let mut seed = 20261201;
    let out = loop {
        let out = tokio::time::timeout(Duration::from_secs(240), command(seed).output())
            .await
            .expect("schemathesis ran longer than its 4-minute budget")
            .expect("schemathesis starts");
        if out.status.success() || seed == 20261203 || !only_generator_crashes(&String::from_utf8_lossy(&out.stdout)) {
            break out;
        }
        eprintln!(
            "schemathesis: generator crash only (seed {seed}), run again:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        seed += 1;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "schemathesis found problems ({backend:?}):\n{stdout}\n{stderr}");
    // Every operation but the streams was tested.
    let selected = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Selected: "))
        .and_then(|v| v.split_once('/'))
        .and_then(|(a, b)| Some((a.trim().parse::<usize>().ok()?, b.trim().parse::<usize>().ok()?)));
    let (selected, total) = selected.unwrap_or_else(|| panic!("no operation count in:\n{stdout}"));
    let streams = 3;
    assert_eq!(selected, total - streams, "operations left out beyond the streams:\n{stdout}");
    assert!(stdout.contains(&format!("Tested: {selected}")), "not every selected operation was tested:\n{stdout}");
}

/// True when schemathesis reported no failure (no server answer broke a check) and every
/// error it reported is the CPython 3.11 `ast` crash inside its generator.
fn only_generator_crashes(stdout: &str) -> bool {
    let lines: Vec<&str> = stdout.lines().collect();
    let errors: Vec<usize> =
        lines.iter().enumerate().filter(|(_, l)| l.trim() == "Runtime Error").map(|(i, _)| i).collect();
    !stdout.contains("= FAILURES =")
        && !errors.is_empty()
        && errors
            .iter()
            .all(|i| lines[i + 1..].iter().take(3).any(|l| l.contains("AST constructor recursion depth mismatch")))
}

both_backends!(schemathesis_finds_nothing);
