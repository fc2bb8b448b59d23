//! The runner's checks of signed jobs (crates/mira-runner, docs/runner.md), on the runner
//! library the process runs, with a real journal and workspace folders: forged, tampered,
//! expired, replayed and misaddressed jobs run nothing; an execution runs at most once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use mira_core::error_code::ErrorCode;
use mira_core::remote::{JobEnvelope, JobOutcome, JobPhase, PROTOCOL_VERSION, SignedJob};
use serde_json::{Value, json};

#[tokio::test]
async fn the_runner_refuses_forged_tampered_expired_and_replayed_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let ws = std::fs::canonicalize(&ws).unwrap();
    let outside = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    let server = mira_core::remote::signing_key(&[3; 32]);
    let journal = mira_runner::journal::Journal::open(&dir.path().join("journal")).unwrap();
    let runner =
        mira_runner::runner::Runner::new("dev_a", server.verifying_key(), std::slice::from_ref(&ws), journal.clone())
            .unwrap();
    let mut n = 0;
    let mut envelope = |phase: JobPhase, inv: &str, tool: &str, input: Value| {
        n += 1;
        JobEnvelope {
            version: PROTOCOL_VERSION,
            device_id: "dev_a".into(),
            phase,
            invocation_id: inv.into(),
            run_id: "run_1".into(),
            owner_id: "usr_1".into(),
            input_hash: mira_core::canonical::input_hash(tool, &input),
            tool_id: tool.into(),
            input,
            approval_id: None,
            workspace: ws.to_string_lossy().into_owned(),
            expires_at: mira_core::ids::now_plus_ms(60_000),
            nonce: format!("nonce{n}"),
        }
    };
    let code = |o: &JobOutcome| match o {
        JobOutcome::Error { error } => Some(error.code),
        _ => None,
    };

    // Prepare on the device, then execute the prepared input: written once.
    let prepare = envelope(JobPhase::Prepare, "", "write_file", json!({"path": "b.txt", "content": "beta\n"}));
    let prepared = runner.handle(&SignedJob::seal(&prepare, &server)).await;
    let JobOutcome::Prepared { input, .. } = prepared.outcome.clone() else { panic!("{prepared:?}") };
    let exec = envelope(JobPhase::Execute, "inv_w", "write_file", input.clone());
    let job = SignedJob::seal(&exec, &server);
    let first = runner.handle(&job).await;
    assert!(matches!(first.outcome, JobOutcome::Output { .. }), "{first:?}");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "beta\n");
    // The same envelope again is a replay; a fresh envelope for the same invocation too.
    assert_eq!(code(&runner.handle(&job).await.outcome), Some(ErrorCode::JobReplayed));
    std::fs::write(ws.join("b.txt"), "changed by hand\n").unwrap();
    let again = envelope(JobPhase::Execute, "inv_w", "write_file", input);
    assert_eq!(code(&runner.handle(&SignedJob::seal(&again, &server)).await.outcome), Some(ErrorCode::JobReplayed));
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "changed by hand\n");
    // Its result waits in the journal until the control plane takes it.
    let pending = journal.undelivered().unwrap();
    assert!(pending.iter().any(|r| r.invocation_id == "inv_w" && r.nonce == exec.nonce), "{pending:?}");
    journal.delivered("inv_w").unwrap();
    assert!(journal.undelivered().unwrap().iter().all(|r| r.invocation_id != "inv_w"));

    // Forged: signed by another key.
    let read = envelope(JobPhase::Execute, "inv_r1", "read_open", json!({"path": "a.txt", "max_bytes": 1000}));
    let forged = SignedJob::seal(&read, &mira_core::remote::signing_key(&[4; 32]));
    assert_eq!(code(&runner.handle(&forged).await.outcome), Some(ErrorCode::JobSignatureInvalid));
    // Tampered: the input changed after signing.
    let good = SignedJob::seal(&read, &server);
    let tampered = SignedJob { envelope: good.envelope.replace("a.txt", "b.txt"), signature: good.signature.clone() };
    assert_eq!(code(&runner.handle(&tampered).await.outcome), Some(ErrorCode::JobSignatureInvalid));
    // Signed, but the input is not the one its hash names.
    let mut mismatch = envelope(JobPhase::Execute, "inv_r2", "read_open", json!({"path": "a.txt", "max_bytes": 1000}));
    mismatch.input = json!({"path": "b.txt", "max_bytes": 1000});
    assert_eq!(
        code(&runner.handle(&SignedJob::seal(&mismatch, &server)).await.outcome),
        Some(ErrorCode::JobInputMismatch)
    );
    // Expired.
    let mut expired = envelope(JobPhase::Execute, "inv_r3", "read_open", json!({"path": "a.txt", "max_bytes": 1000}));
    expired.expires_at = mira_core::ids::now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(code(&runner.handle(&SignedJob::seal(&expired, &server)).await.outcome), Some(ErrorCode::JobExpired));
    // For another device.
    let mut other = envelope(JobPhase::Execute, "inv_r4", "read_open", json!({"path": "a.txt", "max_bytes": 1000}));
    other.device_id = "dev_b".into();
    assert_eq!(code(&runner.handle(&SignedJob::seal(&other, &server)).await.outcome), Some(ErrorCode::JobWrongDevice));
    // A folder the runner was not given.
    let mut elsewhere =
        envelope(JobPhase::Execute, "inv_r5", "read_open", json!({"path": "ws/a.txt", "max_bytes": 1000}));
    elsewhere.workspace = outside.to_string_lossy().into_owned();
    assert_eq!(
        code(&runner.handle(&SignedJob::seal(&elsewhere, &server)).await.outcome),
        Some(ErrorCode::DeviceWorkspaceRefused)
    );
    // None of the refused reads ran; the good one does.
    let ok = runner.handle(&good).await;
    let JobOutcome::Output { output } = ok.outcome.clone() else { panic!("{ok:?}") };
    assert_eq!(output.output["content"], "alpha\n");

    // A runner that died during an execution reports it as outcome_unknown, never re-runs it.
    std::fs::write(dir.path().join("journal/inv-inv_crash.started"), "nonce_crash").unwrap();
    let pending = journal.undelivered().unwrap();
    let crash = pending.iter().find(|r| r.invocation_id == "inv_crash").unwrap();
    assert_eq!((code(&crash.outcome), crash.nonce.as_str()), (Some(ErrorCode::OutcomeUnknown), "nonce_crash"));
    let retry = envelope(JobPhase::Execute, "inv_crash", "read_open", json!({"path": "a.txt", "max_bytes": 1000}));
    assert_eq!(code(&runner.handle(&SignedJob::seal(&retry, &server)).await.outcome), Some(ErrorCode::JobReplayed));
}
