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
    // A forged job naming that invocation leaves its journaled result as it is.
    let forged_w = envelope(JobPhase::Execute, "inv_w", "read_open", json!({"path": "a.txt", "max_bytes": 1000}));
    let forged_w = SignedJob::seal(&forged_w, &mira_core::remote::signing_key(&[4; 32]));
    assert_eq!(code(&runner.handle(&forged_w).await.outcome), Some(ErrorCode::JobSignatureInvalid));
    let pending = journal.undelivered().unwrap();
    let kept = pending.iter().find(|r| r.invocation_id == "inv_w").unwrap();
    assert!(matches!(kept.outcome, JobOutcome::Output { .. }) && kept.nonce == exec.nonce, "{kept:?}");
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

/// Pruning: entries of delivered executions and nonces whose envelopes expired go; an
/// undelivered result, a call that never finished and unexpired entries stay; an expired
/// job is still refused after its entries are gone.
#[tokio::test]
async fn the_journal_prunes_delivered_and_expired_entries_only() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let ws = std::fs::canonicalize(&ws).unwrap();
    let server = mira_core::remote::signing_key(&[5; 32]);
    let journal = mira_runner::journal::Journal::open(&dir.path().join("journal")).unwrap();
    let runner =
        mira_runner::runner::Runner::new("dev_a", server.verifying_key(), std::slice::from_ref(&ws), journal.clone())
            .unwrap();
    let envelope = |inv: &str, path: &str, ttl_ms: u64| JobEnvelope {
        version: PROTOCOL_VERSION,
        device_id: "dev_a".into(),
        phase: JobPhase::Execute,
        invocation_id: inv.into(),
        run_id: "run_1".into(),
        owner_id: "usr_1".into(),
        input_hash: mira_core::canonical::input_hash("read_open", &json!({"path": path, "max_bytes": 100})),
        tool_id: "read_open".into(),
        input: json!({"path": path, "max_bytes": 100}),
        approval_id: None,
        workspace: ws.to_string_lossy().into_owned(),
        expires_at: mira_core::ids::now_plus_ms(ttl_ms),
        nonce: format!("n_{inv}"),
    };
    std::fs::write(ws.join("a.txt"), "a\n").unwrap();
    let names = || {
        let mut v: Vec<String> = std::fs::read_dir(dir.path().join("journal"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    // Three executions whose envelopes expire in 1.5 s: one delivered, one not yet
    // delivered; and one whose envelope lives for a minute, delivered.
    let delivered = SignedJob::seal(&envelope("inv_d", "a.txt", 1500), &server);
    let undelivered = SignedJob::seal(&envelope("inv_u", "a.txt", 1500), &server);
    let fresh = SignedJob::seal(&envelope("inv_f", "a.txt", 60_000), &server);
    for job in [&delivered, &undelivered, &fresh] {
        assert!(matches!(runner.handle(job).await.outcome, JobOutcome::Output { .. }));
    }
    journal.delivered("inv_d").unwrap();
    journal.delivered("inv_f").unwrap();
    // A call the runner died in (started, never finished), expired long ago.
    std::fs::write(dir.path().join("journal/inv-inv_crash.started"), "n_crash\n2020-01-01T00:00:00.000Z\n").unwrap();
    let before = names();
    assert_eq!(before.len(), 10, "{before:?}");

    // Nothing has expired yet: nothing goes.
    let none = journal.prune(&mira_core::ids::now()).unwrap();
    assert_eq!((none.nonces, none.executions), (0, 0));
    assert_eq!(names(), before);

    tokio::time::sleep(Duration::from_millis(1600)).await;
    let pruned = journal.prune(&mira_core::ids::now()).unwrap();
    assert_eq!((pruned.nonces, pruned.executions), (2, 1), "{:?}", names());
    assert_eq!(
        names(),
        [
            "inv-inv_crash.started",
            "inv-inv_f.delivered",
            "inv-inv_f.started",
            "inv-inv_u.result",
            "inv-inv_u.started",
            "nonce-n_inv_f",
        ]
    );
    // The undelivered result is still sent, and the crashed call still reads as unknown.
    let pending = journal.undelivered().unwrap();
    assert!(pending.iter().any(|r| r.invocation_id == "inv_u"), "{pending:?}");
    let crash = pending.iter().find(|r| r.invocation_id == "inv_crash").unwrap();
    assert_eq!(crash.nonce, "n_crash");
    // Replaying the pruned job is refused all the same (its envelope expired).
    let again = runner.handle(&delivered).await;
    assert!(matches!(&again.outcome, JobOutcome::Error { error } if error.code == ErrorCode::JobExpired), "{again:?}");
    // An entry written by an older runner (no expiry recorded) is kept while it is recent.
    std::fs::write(dir.path().join("journal/nonce-old"), "").unwrap();
    journal.prune(&mira_core::ids::now()).unwrap();
    assert!(names().contains(&"nonce-old".to_owned()));
}

/// `--confirm` on the library: no answer within the timeout, or the end of the input,
/// declines an approved execution (`job_declined`, nothing written); a job without an
/// approval is not asked about.
#[tokio::test]
async fn an_unanswered_confirmation_declines_the_job() {
    use mira_runner::confirm::Confirmer;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let ws = std::fs::canonicalize(&ws).unwrap();
    let server = mira_core::remote::signing_key(&[6; 32]);
    let envelope = |phase: JobPhase, inv: &str, input: Value, approval: Option<&str>| JobEnvelope {
        version: PROTOCOL_VERSION,
        device_id: "dev_a".into(),
        phase,
        invocation_id: inv.into(),
        run_id: "run_1".into(),
        owner_id: "usr_1".into(),
        input_hash: mira_core::canonical::input_hash("write_file", &input),
        tool_id: "write_file".into(),
        input,
        approval_id: approval.map(str::to_owned),
        workspace: ws.to_string_lossy().into_owned(),
        expires_at: mira_core::ids::now_plus_ms(60_000),
        nonce: format!("n_{inv}_{phase:?}"),
    };
    // The frozen input of a write of `<inv>.txt` (prepared on a runner without a prompt).
    let plain = mira_runner::runner::Runner::new(
        "dev_a",
        server.verifying_key(),
        std::slice::from_ref(&ws),
        mira_runner::journal::Journal::open(&dir.path().join("j0")).unwrap(),
    )
    .unwrap();
    let mut frozen = std::collections::HashMap::new();
    for inv in ["inv_t", "inv_plain", "inv_e"] {
        let input = json!({"path": format!("{inv}.txt"), "content": "x\n"});
        let p = plain.handle(&SignedJob::seal(&envelope(JobPhase::Prepare, inv, input, None), &server)).await;
        let JobOutcome::Prepared { input, .. } = p.outcome else { panic!("{p:?}") };
        frozen.insert(inv, input);
    }
    let write = |inv: &str, approval: Option<&str>| {
        let input = frozen[inv].clone();
        JobEnvelope {
            version: PROTOCOL_VERSION,
            device_id: "dev_a".into(),
            phase: JobPhase::Execute,
            invocation_id: inv.into(),
            run_id: "run_1".into(),
            owner_id: "usr_1".into(),
            input_hash: mira_core::canonical::input_hash("write_file", &input),
            tool_id: "write_file".into(),
            input,
            approval_id: approval.map(str::to_owned),
            workspace: ws.to_string_lossy().into_owned(),
            expires_at: mira_core::ids::now_plus_ms(60_000),
            nonce: format!("n_{inv}"),
        }
    };
    let declined = |o: &JobOutcome| match o {
        JobOutcome::Error { error } if error.code == ErrorCode::JobDeclined => Some(error.details.clone()),
        _ => None,
    };

    // A terminal nobody types at.
    let (quiet, _keep) = std::os::unix::net::UnixStream::pair().unwrap();
    let confirm = Confirmer::from_parts(
        Box::new(std::io::BufReader::new(quiet)),
        Box::new(std::io::sink()),
        Duration::from_millis(300),
    );
    let journal = mira_runner::journal::Journal::open(&dir.path().join("j1")).unwrap();
    let runner = mira_runner::runner::Runner::new("dev_a", server.verifying_key(), std::slice::from_ref(&ws), journal)
        .unwrap()
        .with_confirmation(confirm);
    let r = runner.handle(&SignedJob::seal(&write("inv_t", Some("apr_1")), &server)).await;
    let details = declined(&r.outcome).unwrap_or_else(|| panic!("{r:?}"));
    assert_eq!((details["declined"].as_str(), details["approval_id"].as_str()), (Some("timeout"), Some("apr_1")));
    assert!(!ws.join("inv_t.txt").exists());
    // Declined is final: the same invocation is not run later.
    let mut again = write("inv_t", Some("apr_1"));
    again.nonce = "n_other".into();
    let r = runner.handle(&SignedJob::seal(&again, &server)).await;
    assert!(matches!(&r.outcome, JobOutcome::Error { error } if error.code == ErrorCode::JobReplayed), "{r:?}");
    // Without an approval there is no question.
    let r = runner.handle(&SignedJob::seal(&write("inv_plain", None), &server)).await;
    assert!(matches!(r.outcome, JobOutcome::Output { .. }), "{r:?}");
    assert!(ws.join("inv_plain.txt").exists());

    // An input that ended.
    let confirm = Confirmer::from_parts(
        Box::new(std::io::BufReader::new(std::io::empty())),
        Box::new(std::io::sink()),
        Duration::from_secs(30),
    );
    let journal = mira_runner::journal::Journal::open(&dir.path().join("j2")).unwrap();
    let runner = mira_runner::runner::Runner::new("dev_a", server.verifying_key(), std::slice::from_ref(&ws), journal)
        .unwrap()
        .with_confirmation(confirm);
    let r = runner.handle(&SignedJob::seal(&write("inv_e", Some("apr_2")), &server)).await;
    let details = declined(&r.outcome).unwrap_or_else(|| panic!("{r:?}"));
    assert_eq!(details["declined"], "end_of_input");
    assert!(!ws.join("inv_e.txt").exists());
}
