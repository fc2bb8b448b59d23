//! Storage conformance: the same assertions against SQLite and Postgres, calling the store
//! directly — concurrency properties (event ids, claims, decisions) included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{Backend, TestDb};
use mira::events::{EventBus, EventKind};
use mira::store::{ApprovalRequest, DecideOutcome, Decider, FreezeOutcome, GrantRequest, NewInvocation, Store};

/// An ordinary user deciding with token `tok`.
fn dec(user_id: &str) -> Decider<'_> {
    Decider { user_id, token_id: "tok", may_second: false }
}
use serde_json::json;

struct Fixture {
    store: Store,
    user: String,
    run: mira::store::RunRow,
    turn: String,
    _db: TestDb,
    _tmp: tempfile::TempDir,
}

async fn fixture(backend: Backend) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let db = TestDb::new(backend, tmp.path()).await;
    let store = mira::server::open_store(tmp.path(), &db.url).await.unwrap();
    let user = store.create_user("u", false, &mira::auth::hash_token("t")).await.unwrap();
    let ws = store.upsert_default_workspace(tmp.path().to_str().unwrap(), "1:1").await.unwrap();
    let run = store.create_run(&user.id, &ws.id, None, None, None).await.unwrap();
    let turn = store.create_turn(&run, "task", None, &json!({"strategy": "all", "tools": []})).await.unwrap();
    Fixture { store, user: user.id, run, turn: turn.id, _db: db, _tmp: tmp }
}

fn new_inv(f: &Fixture, call: &str, approval: bool) -> NewInvocation {
    let input = json!({"n": call});
    NewInvocation {
        run_id: f.run.id.clone(),
        turn_id: f.turn.clone(),
        owner_id: f.user.clone(),
        tool_id: "t".into(),
        tool_call_id: call.into(),
        input: input.to_string(),
        input_hash: mira::invocation::canonical::input_hash("t", &input),
        approval: approval.then(|| ApprovalRequest::new(json!({}), mira::ids::now_plus_ms(60_000))),
        queue_tag: 0,
    }
}

async fn freeze(f: &Fixture, call: &str, approval: bool) -> (mira::store::InvocationRow, Option<String>) {
    match f.store.freeze_invocation(&new_inv(f, call, approval)).await.unwrap() {
        FreezeOutcome::Created(row, apr) => (row, apr),
        FreezeOutcome::Existing(..) => panic!("expected a new invocation"),
    }
}

async fn users_tokens_and_isolation(backend: Backend) {
    let f = fixture(backend).await;
    let dup = f.store.create_user("u", false, &mira::auth::hash_token("other")).await;
    assert!(dup.unwrap_err().is_unique_violation());
    let id = f.store.identity_by_token(&mira::auth::hash_token("t")).await.unwrap().unwrap();
    assert_eq!(id.user_id, f.user);
    assert!(f.store.identity_by_token(&mira::auth::hash_token("nope")).await.unwrap().is_none());
    let other = f.store.create_user("v", false, &mira::auth::hash_token("v")).await.unwrap();
    assert!(f.store.run_for(&other.id, &f.run.id).await.unwrap().is_none());
    assert!(f.store.turn_for(&other.id, &f.turn).await.unwrap().is_none());
}

async fn runs_paginate_newest_first(backend: Backend) {
    let f = fixture(backend).await;
    for _ in 0..4 {
        f.store.create_run(&f.user, &f.run.workspace_id, None, None, None).await.unwrap();
    }
    let page1 = f.store.list_runs(&f.user, None, 3).await.unwrap();
    let page2 = f.store.list_runs(&f.user, Some(&page1[2].id), 3).await.unwrap();
    let ids: Vec<String> = page1.iter().chain(page2.iter()).map(|r| r.id.clone()).collect();
    assert_eq!(ids.len(), 5);
    assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
}

/// "No filter" is a NULL bind; an empty string still means no filter, a cursor still filters,
/// and an empty node prefix never sweeps live invocations.
async fn list_filters_none_empty_and_cursor(backend: Backend) {
    let f = fixture(backend).await;
    f.store.create_run(&f.user, &f.run.workspace_id, None, None, None).await.unwrap();
    let none = f.store.list_runs(&f.user, None, 10).await.unwrap();
    let empty = f.store.list_runs(&f.user, Some(""), 10).await.unwrap();
    assert_eq!(none.len(), 2);
    assert_eq!(none.iter().map(|r| &r.id).collect::<Vec<_>>(), empty.iter().map(|r| &r.id).collect::<Vec<_>>());
    assert_eq!(f.store.list_runs(&f.user, Some(&none[0].id), 10).await.unwrap().len(), 1);

    let (a, _) = freeze(&f, "a", false).await;
    freeze(&f, "b", false).await;
    assert_eq!(f.store.list_invocations(&f.run.id, None, 10).await.unwrap().rows.len(), 2);
    assert_eq!(f.store.list_invocations(&f.run.id, Some(""), 10).await.unwrap().rows.len(), 2);
    let after = f.store.list_invocations(&f.run.id, Some(&a.id), 10).await.unwrap().rows;
    assert_eq!(after.len(), 1);
    assert_ne!(after[0].id, a.id);
    assert!(f.store.list_evidence(&f.run.id, None, 10).await.unwrap().is_empty());
    assert!(f.store.list_evidence(&f.run.id, Some(""), 10).await.unwrap().is_empty());

    assert!(f.store.claim_next("node-live", 60_000).await.unwrap().is_some());
    assert_eq!(f.store.interrupt_orphans(None).await.unwrap(), 0);
    assert_eq!(f.store.interrupt_orphans(Some("")).await.unwrap(), 0, "an empty prefix matches no node");
    assert_eq!(f.store.interrupt_orphans(Some("node-other")).await.unwrap(), 0);
    assert_eq!(f.store.interrupt_orphans(Some("node-li")).await.unwrap(), 1);
}

async fn concurrent_event_appends_get_distinct_monotonic_ids(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    let mut tasks = Vec::new();
    for i in 0..40 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = f.store.begin_write().await.unwrap();
            let seq = tx.append_event(&f.run.id, EventKind::TerminalOutput, &json!({"i": i})).await.unwrap();
            tx.commit().await.unwrap();
            seq
        }));
    }
    let mut seqs: Vec<i64> = Vec::new();
    for t in tasks {
        seqs.push(t.await.unwrap());
    }
    seqs.sort();
    // Event 1 is the fixture's exposure.created.
    assert_eq!(seqs, (2..=41).collect::<Vec<_>>());
    let stored = f.store.events_after(&f.run.id, 0, 100).await.unwrap();
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=41).collect::<Vec<_>>());
    assert_eq!(f.store.last_event_seq(&f.run.id).await.unwrap(), 41);
}

async fn freezing_is_idempotent_per_call_id(backend: Backend) {
    let f = fixture(backend).await;
    let (row, _) = freeze(&f, "c1", false).await;
    match f.store.freeze_invocation(&new_inv(&f, "c1", false)).await.unwrap() {
        FreezeOutcome::Existing(existing, _) => assert_eq!(existing.id, row.id),
        FreezeOutcome::Created(..) => panic!("a call id names one invocation"),
    }
    // Racing freezes of one call id: exactly one row.
    let f = Arc::new(f);
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move { f.store.freeze_invocation(&new_inv(&f, "race", true)).await.unwrap() }));
    }
    let mut created = 0;
    let mut ids = HashSet::new();
    for t in tasks {
        match t.await.unwrap() {
            FreezeOutcome::Created(row, _) => {
                created += 1;
                ids.insert(row.id);
            }
            FreezeOutcome::Existing(row, _) => {
                ids.insert(row.id);
            }
        }
    }
    assert_eq!((created, ids.len()), (1, 1));
}

async fn claims_are_exclusive_and_gated(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    for i in 0..30 {
        freeze(&f, &format!("q{i}"), false).await;
    }
    let (gated, _) = freeze(&f, "needs-approval", true).await;
    let mut tasks = Vec::new();
    for worker in 0..6 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(inv) = f.store.claim_next(&format!("node-{worker}"), 60_000).await.unwrap() {
                got.push(inv.id);
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!((all.len(), unique.len()), (30, 30), "every queued invocation claimed exactly once");
    assert!(!unique.contains(&gated.id), "an approval-gated invocation is never claimed without a grant");
}

async fn racing_grants_have_one_winner(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    let (inv, apr) = freeze(&f, "g", true).await;
    let apr = apr.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (f, inv, apr) = (f.clone(), inv.clone(), apr.clone());
        tasks.push(tokio::spawn(async move {
            let triple =
                GrantRequest { tool_id: &inv.tool_id, tool_call_id: &inv.tool_call_id, input_hash: &inv.input_hash };
            f.store.grant_approval(&dec(&f.user), &apr, &triple).await.unwrap()
        }));
    }
    let mut won = 0;
    for t in tasks {
        match t.await.unwrap() {
            DecideOutcome::Decided(_) => won += 1,
            DecideOutcome::AlreadyDecided(row) => assert_eq!(row.status.as_str(), "granted"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(won, 1);
    let claimed = f.store.claim_next("n", 60_000).await.unwrap().unwrap();
    assert_eq!(claimed.id, inv.id);
    assert!(f.store.claim_next("n", 60_000).await.unwrap().is_none(), "a grant runs its invocation once");
}

/// A grant that claims for a harness: of racing grants one wins and claims, in the grant's
/// transaction (`approval.granted` then `execution.started`), so no claimer gets it again.
async fn a_grant_claims_for_the_granting_harness(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    let (inv, apr) = freeze(&f, "gc", true).await;
    let apr = apr.unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (f, inv, apr) = (f.clone(), inv.clone(), apr.clone());
        tasks.push(tokio::spawn(async move {
            let triple =
                GrantRequest { tool_id: &inv.tool_id, tool_call_id: &inv.tool_call_id, input_hash: &inv.input_hash };
            let node = format!("node{i}");
            let claim = mira::store::HarnessClaim { node_id: &node, lease_ms: 60_000 };
            f.store.grant_and_claim(&dec(&f.user), &apr, &triple, Some(claim), None, 0).await.unwrap()
        }));
    }
    let mut claimed = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (DecideOutcome::Decided(_), Some(row)) => claimed.push(row),
            (DecideOutcome::AlreadyDecided(_), None) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(claimed.len(), 1, "one grant, one claim");
    let row = &claimed[0];
    assert_eq!((row.id.as_str(), row.status.as_str()), (inv.id.as_str(), "running"));
    assert!(row.claimed_by.as_deref().is_some_and(|n| n.starts_with("node")), "{row:?}");
    assert!(f.store.claim_next("other", 60_000).await.unwrap().is_none(), "the grant's claim is the only one");
    let events = f.store.events_after(&inv.run_id, 0, 100).await.unwrap();
    let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
    let granted = kinds.iter().position(|k| *k == "approval.granted").expect("granted");
    assert_eq!(kinds.get(granted + 1), Some(&"execution.started"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "execution.started").count(), 1, "{kinds:?}");
}

/// A freeze that claims for a harness: an approval-free call is created `running` under the
/// claim (`invocation.frozen` then `execution.started`) and no claimer gets it again; a call
/// that needs approval, or a call id frozen before, is not claimed.
async fn a_freeze_claims_approval_free_calls_only(backend: Backend) {
    let f = fixture(backend).await;
    let claim = || Some(mira::store::HarnessClaim { node_id: "node-f", lease_ms: 60_000 });
    let FreezeOutcome::Created(row, None) = f.store.freeze_and_claim(&new_inv(&f, "fc", false), claim()).await.unwrap()
    else {
        panic!("expected a new approval-free invocation");
    };
    assert_eq!((row.status.as_str(), row.claimed_by.as_deref()), ("running", Some("node-f")));
    assert!(row.lease_until.is_some() && row.started_at.is_some(), "{row:?}");
    let stored = f.store.invocation_by_id(&row.id).await.unwrap().unwrap();
    assert_eq!((stored.status.as_str(), stored.claimed_by.as_deref()), ("running", Some("node-f")));
    assert!(f.store.claim_next("other", 60_000).await.unwrap().is_none(), "the freeze's claim is the only one");
    let kinds: Vec<String> =
        f.store.events_after(&row.run_id, 0, 100).await.unwrap().into_iter().map(|e| e.kind).collect();
    let frozen = kinds.iter().position(|k| k == "invocation.frozen").expect("frozen");
    assert_eq!(&kinds[frozen..], ["invocation.frozen", "execution.started"], "{kinds:?}");
    // The same call id again: the existing invocation, untouched.
    let again = f.store.freeze_and_claim(&new_inv(&f, "fc", false), claim()).await.unwrap();
    assert!(matches!(again, FreezeOutcome::Existing(ref r, _) if r.id == row.id), "{again:?}");
    // A call that needs approval waits for its grant, claim or not.
    let FreezeOutcome::Created(gated, Some(_)) =
        f.store.freeze_and_claim(&new_inv(&f, "fc-gated", true), claim()).await.unwrap()
    else {
        panic!("expected a new gated invocation");
    };
    assert_eq!((gated.status.as_str(), gated.claimed_by.as_deref()), ("awaiting_approval", None));
    assert!(f.store.claim_next("other", 60_000).await.unwrap().is_none(), "nothing else is claimable");
}

async fn grant_and_deny_race_one_wins(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    for round in 0..5 {
        let (inv, apr) = freeze(&f, &format!("r{round}"), true).await;
        let apr = apr.unwrap();
        let (fg, fd) = (f.clone(), f.clone());
        let (ag, ad, ig) = (apr.clone(), apr.clone(), inv.clone());
        let g = tokio::spawn(async move {
            let triple =
                GrantRequest { tool_id: &ig.tool_id, tool_call_id: &ig.tool_call_id, input_hash: &ig.input_hash };
            fg.store.grant_approval(&dec(&fg.user), &ag, &triple).await.unwrap()
        });
        let d = tokio::spawn(async move { fd.store.deny_approval(&dec(&fd.user), &ad, Some("no")).await.unwrap() });
        let (g, d) = (g.await.unwrap(), d.await.unwrap());
        let winners = [&g, &d].iter().filter(|o| matches!(o, DecideOutcome::Decided(_))).count();
        assert_eq!(winners, 1, "{g:?} {d:?}");
        let row = f.store.invocation_by_id(&inv.id).await.unwrap().unwrap();
        let approval = f.store.approval_for(&f.user, &apr).await.unwrap().unwrap();
        match approval.status.as_str() {
            "granted" => assert_eq!(row.status.as_str(), "queued"),
            "denied" => assert_eq!(row.status.as_str(), "denied"),
            s => panic!("status {s}"),
        }
    }
}

async fn mismatch_changes_nothing_and_expiry_ends_the_wait(backend: Backend) {
    let f = fixture(backend).await;
    let (inv, apr) = freeze(&f, "m", true).await;
    let apr = apr.unwrap();
    let (other, _) = freeze(&f, "m2", true).await;
    // The other call's triple (same tool, other call id and hash) does not grant this one.
    let wrong =
        GrantRequest { tool_id: &other.tool_id, tool_call_id: &other.tool_call_id, input_hash: &other.input_hash };
    assert!(matches!(f.store.grant_approval(&dec(&f.user), &apr, &wrong).await.unwrap(), DecideOutcome::Mismatch(_)));
    let same_input_other_call = GrantRequest { tool_id: &inv.tool_id, tool_call_id: "m2", input_hash: &inv.input_hash };
    assert!(matches!(
        f.store.grant_approval(&dec(&f.user), &apr, &same_input_other_call).await.unwrap(),
        DecideOutcome::Mismatch(_)
    ));
    assert_eq!(f.store.invocation_by_id(&inv.id).await.unwrap().unwrap().status.as_str(), "awaiting_approval");
    // Another user cannot see or decide it.
    let right = GrantRequest { tool_id: &inv.tool_id, tool_call_id: &inv.tool_call_id, input_hash: &inv.input_hash };
    assert!(matches!(f.store.grant_approval(&dec("usr_other"), &apr, &right).await.unwrap(), DecideOutcome::NotFound));

    // Expiry.
    let mut expiring = new_inv(&f, "e", true);
    expiring.approval = Some(ApprovalRequest::new(json!({}), mira::ids::now_plus_ms(0)));
    let FreezeOutcome::Created(exp_inv, Some(exp_apr)) = f.store.freeze_invocation(&expiring).await.unwrap() else {
        panic!("created")
    };
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let triple = GrantRequest {
        tool_id: &exp_inv.tool_id,
        tool_call_id: &exp_inv.tool_call_id,
        input_hash: &exp_inv.input_hash,
    };
    assert!(matches!(
        f.store.grant_approval(&dec(&f.user), &exp_apr, &triple).await.unwrap(),
        DecideOutcome::Expired(_)
    ));
    assert_eq!(f.store.expire_approvals().await.unwrap(), 1);
    assert_eq!(f.store.invocation_by_id(&exp_inv.id).await.unwrap().unwrap().status.as_str(), "expired");
    let events = f.store.events_after(&f.run.id, 0, 100).await.unwrap();
    assert!(events.iter().any(|e| e.kind == "approval.expired"));
}

async fn four_eyes_decisions_and_claims(backend: Backend) {
    use mira::approval::policy::ApprovalRule;
    use mira::store::{Roles, Viewer};
    let f = fixture(backend).await;
    let approver = f
        .store
        .create_user_with_roles("appr", Roles { admin: false, approver: true }, &mira::auth::hash_token("a"))
        .await
        .unwrap();
    assert!(approver.is_approver);
    assert!(f.store.may_second(&approver.id).await.unwrap());
    let plain = f.store.create_user("plain", false, &mira::auth::hash_token("p")).await.unwrap();
    assert!(!f.store.may_second(&plain.id).await.unwrap() && !f.store.may_second(&f.user).await.unwrap());
    let mut new = new_inv(&f, "fe", true);
    new.approval = Some(ApprovalRequest {
        rule: ApprovalRule::FourEyes,
        rule_domain: Some("edit".into()),
        ..ApprovalRequest::new(json!({}), mira::ids::now_plus_ms(60_000))
    });
    let FreezeOutcome::Created(inv, Some(apr)) = f.store.freeze_invocation(&new).await.unwrap() else {
        panic!("created with an approval")
    };
    let triple = GrantRequest { tool_id: &inv.tool_id, tool_call_id: &inv.tool_call_id, input_hash: &inv.input_hash };
    let who = |user_id, may_second| Decider { user_id, token_id: "tok", may_second };
    // The requester, even one who may second others: refused, nothing changed.
    for may_second in [false, true] {
        let outcome = f.store.grant_approval(&who(&f.user, may_second), &apr, &triple).await.unwrap();
        assert!(matches!(outcome, DecideOutcome::FourEyesRequired(_)), "{outcome:?}");
    }
    // Another user who may not second: not found, not listed.
    let outcome = f.store.grant_approval(&who(&plain.id, false), &apr, &triple).await.unwrap();
    assert!(matches!(outcome, DecideOutcome::NotFound), "{outcome:?}");
    let plain_view = Viewer { user_id: &plain.id, may_second: false };
    assert!(f.store.list_approvals(&plain_view, None, None, None, 10).await.unwrap().rows.is_empty());
    assert!(f.store.approval_visible(&plain_view, &apr).await.unwrap().is_none());
    assert_eq!(f.store.invocation_by_id(&inv.id).await.unwrap().unwrap().status.as_str(), "awaiting_approval");
    // The approver: listed (requester named), granted, then claimable.
    let view = Viewer { user_id: &approver.id, may_second: true };
    let listed =
        f.store.list_approvals(&view, Some(mira::state::ApprovalStatus::Pending), None, None, 10).await.unwrap().rows;
    assert_eq!(
        listed.iter().map(|a| (a.id.as_str(), a.requester_name.as_str())).collect::<Vec<_>>(),
        [(apr.as_str(), "u")]
    );
    assert!(listed[0].may_grant(&view) && !listed[0].may_grant(&Viewer::owner(&f.user)));
    assert!(f.store.claim_next("n", 60_000).await.unwrap().is_none());
    let DecideOutcome::Decided(row) = f.store.grant_approval(&who(&approver.id, true), &apr, &triple).await.unwrap()
    else {
        panic!("the approver's grant")
    };
    assert_eq!(
        (row.rule(), row.decided_by.as_deref(), row.rule_domain.as_deref()),
        (ApprovalRule::FourEyes, Some(approver.id.as_str()), Some("edit"))
    );
    assert_eq!(f.store.claim_next("n", 60_000).await.unwrap().map(|r| r.id), Some(inv.id));
}

async fn bus_wakes_after_commit_only(backend: Backend) {
    let f = fixture(backend).await;
    let mut rx = f.store.bus().subscribe();
    let mut tx = f.store.begin_write().await.unwrap();
    let seq = tx.append_event(&f.run.id, EventKind::TerminalOutput, &json!({})).await.unwrap();
    assert!(rx.try_recv().is_none(), "no signal before commit");
    tx.commit().await.unwrap();
    let mira::events::Heard::Run(signal) = rx.recv().await else { panic!("a run signal") };
    assert_eq!((signal.run_id.as_str(), signal.seq), (f.run.id.as_str(), seq));
    // A rolled-back append leaves no event and sends no signal.
    let mut tx = f.store.begin_write().await.unwrap();
    tx.append_event(&f.run.id, EventKind::TerminalOutput, &json!({})).await.unwrap();
    drop(tx);
    assert!(rx.try_recv().is_none());
    assert_eq!(f.store.last_event_seq(&f.run.id).await.unwrap(), seq);
    let _ = EventBus::new();
}

/// Batched appends interleaved with single ones, over two runs: every run's ids stay
/// distinct, gapless and in commit order, and the batch's own events of a run are
/// consecutive in the order given.
async fn batched_event_appends_stay_gapless_per_run(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    let other = f.store.create_run(&f.user, &f.run.workspace_id, None, None, None).await.unwrap();
    let other = Arc::new(other.id);
    let mut tasks = Vec::new();
    for i in 0..20 {
        let (f, other) = (f.clone(), other.clone());
        tasks.push(tokio::spawn(async move {
            let mut tx = f.store.begin_write().await.unwrap();
            let seqs = if i % 2 == 0 {
                let events = [
                    (f.run.id.as_str(), EventKind::TerminalOutput, json!({"i": i, "k": 0})),
                    (other.as_str(), EventKind::TerminalOutput, json!({"i": i, "k": 0})),
                    (f.run.id.as_str(), EventKind::TerminalOutput, json!({"i": i, "k": 1})),
                ];
                tx.append_events(&events).await.unwrap()
            } else {
                vec![tx.append_event(&f.run.id, EventKind::TerminalOutput, &json!({"i": i, "k": 0})).await.unwrap()]
            };
            tx.commit().await.unwrap();
            (i, seqs)
        }));
    }
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for t in tasks {
        let (i, seqs) = t.await.unwrap();
        if i % 2 == 0 {
            assert_eq!(seqs[2], seqs[0] + 1, "one batch's events of a run are consecutive: {seqs:?}");
            mine.extend([seqs[0], seqs[2]]);
            theirs.push(seqs[1]);
        } else {
            mine.push(seqs[0]);
        }
    }
    mine.sort();
    theirs.sort();
    // The fixture's run starts with exposure.created (1); the other run has no events yet.
    assert_eq!(mine, (2..=31).collect::<Vec<_>>());
    assert_eq!(theirs, (1..=10).collect::<Vec<_>>());
    let stored = f.store.events_after(&f.run.id, 0, 100).await.unwrap();
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=31).collect::<Vec<_>>());
    let pair = stored.iter().filter(|e| e.data.contains("\"k\":1")).count();
    assert_eq!(pair, 10);
    assert_eq!(f.store.last_event_seq(&other).await.unwrap(), 10);
    assert_eq!(f.store.events_after(&other, 0, 100).await.unwrap().len(), 10);
}

/// Workers claiming in batches get every queued invocation exactly once, oldest first
/// within a batch, each with one `execution.started`; the approval-gated one stays.
async fn batch_claims_are_exclusive_and_gated(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    for i in 0..40 {
        freeze(&f, &format!("q{i:02}"), false).await;
    }
    let (gated, _) = freeze(&f, "needs-approval", true).await;
    let mut tasks = Vec::new();
    for worker in 0..4 {
        let f = f.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let batch = f.store.claim_batch(&format!("node-{worker}"), 60_000, 7, &[]).await.unwrap();
                if batch.is_empty() {
                    break;
                }
                assert!(batch.len() <= 7);
                assert!(batch.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
                for inv in &batch {
                    assert_eq!(inv.status, mira::state::InvocationStatus::Running);
                    assert_eq!(inv.claimed_by.as_deref(), Some(format!("node-{worker}").as_str()));
                }
                got.extend(batch.into_iter().map(|i| i.id));
            }
            got
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let unique: HashSet<_> = all.iter().cloned().collect();
    assert_eq!((all.len(), unique.len()), (40, 40), "every queued invocation claimed exactly once");
    assert!(!unique.contains(&gated.id), "an approval-gated invocation is never claimed without a grant");
    let events = f.store.events_after(&f.run.id, 0, 1000).await.unwrap();
    let started: Vec<_> = events.iter().filter(|e| e.kind == "execution.started").collect();
    assert_eq!(started.len(), 40);
    assert!(events.windows(2).all(|w| w[1].seq == w[0].seq + 1), "gapless");
    assert!(f.store.claim_batch("n", 60_000, 0, &[]).await.unwrap().is_empty());
}

/// Freezes and results written at the same time by many tasks over several runs (group
/// commits, on Postgres two at once): a follower reading each run's log after the last id it
/// saw never meets a gap — every read continues at the next id — so an id is never visible
/// before a smaller one of its run. Every result is stored once, with its evidence event.
async fn group_commits_are_seen_in_id_order(backend: Backend) {
    let f = Arc::new(fixture(backend).await);
    let mut runs = vec![f.run.id.clone()];
    for _ in 0..3 {
        runs.push(f.store.create_run(&f.user, &f.run.workspace_id, None, None, None).await.unwrap().id);
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for run in &runs {
        let (f, run, done) = (f.clone(), run.clone(), done.clone());
        readers.push(tokio::spawn(async move {
            let mut last = 0;
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let events = f.store.events_after(&run, last, 1000).await.unwrap();
                for e in &events {
                    assert_eq!(e.seq, last + 1, "{run}: after id {last} the next one read must follow it");
                    last = e.seq;
                }
                if finished && events.is_empty() {
                    return last;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut writers = Vec::new();
    for w in 0..8 {
        let (f, runs) = (f.clone(), runs.clone());
        writers.push(tokio::spawn(async move {
            for n in 0..15 {
                let mut new = new_inv(&f, &format!("w{w}-{n}"), false);
                new.run_id = runs[(w + n) % runs.len()].clone();
                let claim = mira::store::HarnessClaim { node_id: "node", lease_ms: 60_000 };
                let inv = match f.store.freeze_and_claim(&new, Some(claim)).await.unwrap() {
                    FreezeOutcome::Created(row, _) => row,
                    FreezeOutcome::Existing(..) => panic!("expected a new invocation"),
                };
                assert_eq!(inv.status, mira::state::InvocationStatus::Running);
                let evidence = mira::evidence::EvidenceDraft::of_text("note", json!({}), "done");
                let stored = f
                    .store
                    .finish_invocation(
                        &inv,
                        "node",
                        mira::store::FinalStatus::Completed,
                        &json!({"ok": true}),
                        &[evidence],
                    )
                    .await
                    .unwrap();
                assert_eq!(stored.map(|ids| ids.len()), Some(1), "stored once, with its evidence");
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for (run, reader) in runs.iter().zip(readers) {
        let last = reader.await.unwrap();
        assert_eq!(last, f.store.last_event_seq(run).await.unwrap(), "{run}: the follower saw every event");
        total += last;
    }
    // Per invocation frozen, started, completed and evidence; plus the fixture's exposure.
    assert_eq!(total, 8 * 15 * 4 + 1);
}

/// A result whose claim was lost (the invocation is `running` under another node) stores
/// nothing — no status, no evidence, no event — while a result stored in the same group
/// commit is stored whole, with its evidence and events gapless after the freezes'.
async fn a_lost_claim_stores_nothing_beside_a_stored_result(backend: Backend) {
    let f = fixture(backend).await;
    let mut frozen = Vec::new();
    for call in ["kept", "lost"] {
        let claim = mira::store::HarnessClaim { node_id: "node-a", lease_ms: 60_000 };
        match f.store.freeze_and_claim(&new_inv(&f, call, false), Some(claim)).await.unwrap() {
            FreezeOutcome::Created(row, _) => frozen.push(row),
            FreezeOutcome::Existing(..) => panic!("expected a new invocation"),
        }
    }
    let before = f.store.last_event_seq(&f.run.id).await.unwrap();
    let evidence = || vec![mira::evidence::EvidenceDraft::of_text("note", json!({}), "done")];
    let (kept, lost) = (evidence(), evidence());
    let ok = json!({"ok": true});
    let (kept, lost) = tokio::join!(
        f.store.finish_invocation(&frozen[0], "node-a", mira::store::FinalStatus::Completed, &ok, &kept),
        f.store.finish_invocation(&frozen[1], "node-b", mira::store::FinalStatus::Completed, &ok, &lost),
    );
    assert_eq!(kept.unwrap().map(|ids| ids.len()), Some(1), "the claimer's result is stored with its evidence");
    assert_eq!(lost.unwrap(), None, "another node's result is refused");
    let lost = f.store.invocation_by_id(&frozen[1].id).await.unwrap().unwrap();
    assert_eq!(lost.status, mira::state::InvocationStatus::Running, "still running under its claimer");
    assert!(lost.result.is_none());
    assert!(f.store.evidence_ids_of(&frozen[1].id).await.unwrap().is_empty(), "no evidence of the refused result");
    assert_eq!(f.store.evidence_ids_of(&frozen[0].id).await.unwrap().len(), 1);
    let events = f.store.events_after(&f.run.id, before, 100).await.unwrap();
    let kinds: Vec<(i64, &str)> = events.iter().map(|e| (e.seq, e.kind.as_str())).collect();
    assert_eq!(
        kinds,
        vec![(before + 1, "execution.completed"), (before + 2, "evidence.recorded")],
        "only the stored result's events, numbered on"
    );
    assert!(events.iter().all(|e| e.data.contains(&frozen[0].id)));
}

/// A freeze that cannot be written (its run does not exist) fails alone, whether or not it
/// shared a group commit: the freezes beside it are stored with their events, nothing of it
/// is, and the store goes on writing (on SQLite the failed transaction's connection was
/// closed, rolling it back).
async fn a_failing_freeze_fails_alone_and_writes_go_on(backend: Backend) {
    let f = fixture(backend).await;
    let before = f.store.last_event_seq(&f.run.id).await.unwrap();
    let mut orphan = new_inv(&f, "orphan", false);
    orphan.run_id = "run_does_not_exist".into();
    let (a, b) = (new_inv(&f, "a", false), new_inv(&f, "b", false));
    let (a, bad, b) =
        tokio::join!(f.store.freeze_invocation(&a), f.store.freeze_invocation(&orphan), f.store.freeze_invocation(&b),);
    assert!(matches!(a.unwrap(), FreezeOutcome::Created(..)));
    assert!(matches!(b.unwrap(), FreezeOutcome::Created(..)));
    assert!(bad.is_err(), "a freeze in a run that does not exist fails");
    assert!(f.store.invocation_by_call("run_does_not_exist", "orphan").await.unwrap().is_none());
    let (c, _) = freeze(&f, "c", false).await;
    let events = f.store.events_after(&f.run.id, before, 100).await.unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, ((before + 1)..=(before + 3)).collect::<Vec<_>>(), "one gapless event per stored freeze");
    assert!(events[2].data.contains(&c.id));
}

/// A stdio server row of `f`'s user, stored.
async fn mcp_server(f: &Fixture, id: &str) -> mira::store::McpServerRow {
    let now = mira::ids::now();
    let server = mira::store::McpServerRow {
        id: id.into(),
        owner_id: Some(f.user.clone()),
        installed_by: f.user.clone(),
        name: id.into(),
        transport: "stdio".into(),
        config: "{}".into(),
        secrets: None,
        secrets_key_id: None,
        disclaimer: None,
        disclaimer_accepted_at: None,
        disclaimer_accepted_by: None,
        enabled: true,
        default_agent_access: true,
        request_timeout_ms: 1000,
        created_at: now.clone(),
        updated_at: now,
    };
    f.store.insert_mcp_server(&server).await.unwrap();
    server
}

/// A listed tool of `server_id`, discovered now.
fn listed_tool(server_id: &str, name: &str, description: &str) -> mira::store::McpToolRow {
    mira::store::McpToolRow {
        server_id: server_id.into(),
        name: name.into(),
        status: mira::state::McpToolStatus::Ok,
        rejection: None,
        title: None,
        description: Some(description.into()),
        input_schema: Some(r#"{"type":"object"}"#.into()),
        output_schema: None,
        annotations: None,
        discovered_at: mira::ids::now(),
        removed_at: None,
        schema_dialect: None,
        schema_declared: None,
        schema_problem: None,
        review_previous: None,
        review_since: None,
    }
}

/// A server that renames its tools at every listing: of the tools it no longer lists, only
/// the 1,000 most recently removed stay (the whole latest removal, then the newest of the one
/// before), so its rows do not grow without end; the listed tools are untouched.
async fn removed_mcp_tools_are_kept_up_to_a_limit(backend: Backend) {
    use mira::state::McpToolStatus;
    let f = fixture(backend).await;
    let server = mcp_server(&f, "mcp_churn").await;
    let listing = |generation: &str| -> Vec<mira::store::McpToolRow> {
        (0..600)
            .map(|i| {
                listed_tool(
                    &server.id,
                    &format!("{generation}_{i:03}"),
                    &format!("tool {i} of generation {generation}"),
                )
            })
            .collect()
    };
    for generation in ["a", "b", "c"] {
        f.store.replace_mcp_tools(&server.id, &listing(generation)).await.unwrap();
        // Distinct removal times for each generation.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let rows = f.store.mcp_tools(&server.id).await.unwrap();
    let of = |prefix: &str, status: McpToolStatus| {
        rows.iter().filter(|r| r.name.starts_with(prefix) && r.status == status).count()
    };
    assert_eq!(of("c_", McpToolStatus::Ok), 600, "the current listing");
    assert_eq!(of("b_", McpToolStatus::Removed), 600, "the latest removal, whole");
    assert_eq!(of("a_", McpToolStatus::Removed), 400, "the rest of the 1,000 from the removal before");
    assert_eq!(rows.len(), 600 + mira::store::MAX_REMOVED_TOOLS_KEPT);
}

/// A re-listing writes only what changed: a tool listed as it is stored keeps its row (and
/// its `discovered_at`); a changed, a new and a re-listed removed tool are written; a tool
/// no longer listed becomes `removed`.
async fn a_relisting_writes_only_what_changed(backend: Backend) {
    use mira::state::McpToolStatus;
    let f = fixture(backend).await;
    let server = mcp_server(&f, "mcp_steady").await;
    let first = ["same", "changes", "goes", "comes_back"].map(|n| listed_tool(&server.id, n, &format!("the {n} tool")));
    f.store.replace_mcp_tools(&server.id, &first).await.unwrap();
    f.store.replace_mcp_tools(&server.id, &first[..3]).await.unwrap();
    let before = f.store.mcp_tools(&server.id).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let second = [
        listed_tool(&server.id, "same", "the same tool"),
        listed_tool(&server.id, "changes", "a new description"),
        listed_tool(&server.id, "new", "a new tool"),
        listed_tool(&server.id, "comes_back", "the comes_back tool"),
    ];
    f.store.replace_mcp_tools(&server.id, &second).await.unwrap();
    let after = f.store.mcp_tools(&server.id).await.unwrap();
    let row = |rows: &[mira::store::McpToolRow], name: &str| rows.iter().find(|r| r.name == name).cloned().unwrap();
    assert_eq!(row(&after, "same").discovered_at, row(&before, "same").discovered_at, "not rewritten");
    assert!(row(&after, "changes").discovered_at > row(&before, "changes").discovered_at);
    assert_eq!(row(&after, "changes").description.as_deref(), Some("a new description"));
    assert_eq!(row(&after, "new").status, McpToolStatus::Ok);
    assert_eq!(row(&before, "comes_back").status, McpToolStatus::Removed);
    assert_eq!((row(&after, "comes_back").status, row(&after, "comes_back").removed_at), (McpToolStatus::Ok, None));
    assert_eq!(row(&after, "goes").status, McpToolStatus::Removed);
    assert!(row(&after, "goes").removed_at.is_some());
    assert_eq!(after.len(), 5);
    // The same listing again changes nothing at all.
    f.store.replace_mcp_tools(&server.id, &second).await.unwrap();
    let again = f.store.mcp_tools(&server.id).await.unwrap();
    for (a, b) in after.iter().zip(&again) {
        assert_eq!(
            (&a.name, &a.discovered_at, a.status, &a.removed_at),
            (&b.name, &b.discovered_at, b.status, &b.removed_at)
        );
    }
}

/// The embedding cache's sweep: of one model's rows stored before the cutoff, the tool
/// vectors (and rows of no kind, from before migration 0029) whose text no indexed tool uses
/// go; live tool vectors, task vectors (learning from use), rows stored after the cutoff and
/// another model's rows stay.
async fn unused_tool_vectors_are_swept(backend: Backend) {
    use mira::state::VectorKind;
    let f = fixture(backend).await;
    let rows = |names: &[&str]| names.iter().map(|n| (n.to_string(), vec![1.0, 0.5, -0.25])).collect::<Vec<_>>();
    f.store.put_tool_vectors("m1", VectorKind::Tool, &rows(&["live", "gone_1", "gone_2"])).await.unwrap();
    f.store.put_tool_vectors("m1", VectorKind::Task, &rows(&["a_task"])).await.unwrap();
    f.store.put_tool_vectors("m2", VectorKind::Tool, &rows(&["gone_1"])).await.unwrap();
    // A row cached before kinds were kept (migration 0029): swept like a tool vector.
    let pool = sqlx::AnyPool::connect(&f._db.url).await.unwrap();
    sqlx::query("INSERT INTO tool_embeddings (model_id, text_sha256, dim, vector, created_at) VALUES ('m1', 'legacy', 3, 'x', $1)")
        .bind(mira::ids::now())
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let live = vec!["live".to_string(), "not_stored".to_string()];
    // A cutoff before the rows were stored: everything is too young.
    let before = mira::ids::now_minus_ms(60_000);
    assert_eq!(f.store.sweep_tool_vectors("m1", &live, &before).await.unwrap(), 0);
    assert_eq!(f.store.count_tool_vectors("m1").await.unwrap(), 5);
    // Everything stored before the cutoff: only the unused tool vectors of m1 go.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(f.store.sweep_tool_vectors("m1", &live, &mira::ids::now()).await.unwrap(), 3);
    assert_eq!(f.store.count_tool_vectors("m1").await.unwrap(), 2, "the legacy row went too");
    let keys = |model: &'static str| {
        let store = f.store.clone();
        async move {
            let all = ["live", "gone_1", "gone_2", "a_task"].map(String::from);
            let mut found: Vec<String> =
                store.tool_vectors(model, &all).await.unwrap().into_iter().map(|(k, _)| k).collect();
            found.sort();
            found
        }
    };
    assert_eq!(keys("m1").await, ["a_task", "live"]);
    assert_eq!(keys("m2").await, ["gone_1"], "another model's rows are not this sweep's");
    // An empty live set sweeps every tool vector of the model, never a task's.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(f.store.sweep_tool_vectors("m1", &[], &mira::ids::now()).await.unwrap(), 1);
    assert_eq!(keys("m1").await, ["a_task"]);
}

/// The execution queue is claimed by queue tag, then id (start-time fair queuing between
/// users, `harness::fair`): a second user's call queued after a first user's burst is
/// claimed with the burst's first call, and a grant queues its call with the tag it is given.
async fn the_queue_is_claimed_in_tag_order(backend: Backend) {
    let f = fixture(backend).await;
    let other = f.store.create_user("v", false, &mira::auth::hash_token("v")).await.unwrap();
    let ws = f.store.upsert_default_workspace(f._tmp.path().to_str().unwrap(), "1:1").await.unwrap();
    let run_b = f.store.create_run(&other.id, &ws.id, None, None, None).await.unwrap();
    let turn_b = f.store.create_turn(&run_b, "task", None, &json!({"strategy": "all", "tools": []})).await.unwrap();
    let queue = mira::harness::fair::FairQueue::default();
    let frozen = |new: NewInvocation| {
        let store = f.store.clone();
        async move {
            let FreezeOutcome::Created(row, _) = store.freeze_invocation(&new).await.unwrap() else { panic!("new") };
            row
        }
    };
    // Frozen (held for approval) before every other call, granted after them.
    let gated = frozen(new_inv(&f, "a-gated", true)).await;
    let mut a = Vec::new();
    for i in 0..10 {
        a.push(frozen(NewInvocation { queue_tag: queue.tag(&f.user), ..new_inv(&f, &format!("a{i}"), false) }).await);
    }
    let b_call = NewInvocation {
        run_id: run_b.id.clone(),
        turn_id: turn_b.id.clone(),
        owner_id: other.id.clone(),
        queue_tag: queue.tag(&other.id),
        ..new_inv(&f, "b0", false)
    };
    let b = frozen(b_call).await;
    assert_eq!((a[0].queue_tag, a[9].queue_tag, b.queue_tag, gated.queue_tag), (0, 9, 0, 0));
    let apr = f.store.approval_of_invocation(&gated.id).await.unwrap().unwrap();
    let triple =
        GrantRequest { tool_id: &gated.tool_id, tool_call_id: &gated.tool_call_id, input_hash: &gated.input_hash };
    let tag = queue.tag(&f.user);
    let (outcome, claimed) = f.store.grant_and_claim(&dec(&f.user), &apr.id, &triple, None, None, tag).await.unwrap();
    assert!(matches!(outcome, DecideOutcome::Decided(_)) && claimed.is_none());
    assert_eq!(f.store.invocation_by_id(&gated.id).await.unwrap().unwrap().queue_tag, 10, "tagged at its grant");
    assert_eq!(f.store.queue_head_tag().await.unwrap(), Some(0));

    // The claim loop's read: calls in queue order, passing over users who hold their share.
    let head = f.store.queue_head(64, &[]).await.unwrap();
    let mut users = vec![f.user.clone(), other.id.clone()];
    users.sort();
    assert_eq!(head.owners, users);
    let owners: Vec<&str> = head.calls.iter().map(|(_, o)| o.as_str()).collect();
    assert_eq!(owners.len(), 12);
    assert_eq!((owners[0], owners[1], owners[11]), (f.user.as_str(), other.id.as_str(), f.user.as_str()));
    assert_eq!(head.calls[11].0, gated.id, "granted last, tagged last");
    let skipping_a = [f.user.clone()];
    let head = f.store.queue_head(2, &skipping_a).await.unwrap();
    assert_eq!((head.owners.len(), head.calls), (2, vec![(b.id.clone(), other.id.clone())]));

    let ids = |rows: Vec<mira::store::InvocationRow>| rows.into_iter().map(|r| r.tool_call_id).collect::<Vec<_>>();
    let first = ids(f.store.claim_batch("n", 60_000, 2, &[]).await.unwrap());
    assert_eq!(first, ["a0", "b0"], "b's call is claimed with a's first, not after all ten");
    // One at a time (a batch is returned in id order): the call granted last comes last,
    // though it was frozen first.
    let mut rest = Vec::new();
    while let Some(inv) = f.store.claim_next("n", 60_000).await.unwrap() {
        rest.push(inv.tool_call_id);
    }
    assert_eq!(rest, ["a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a-gated"]);
    assert_eq!(f.store.queue_head_tag().await.unwrap(), None);

    // A claim passes over the calls of users who hold their share of the slots, however many
    // of theirs come first.
    for i in 10..310 {
        frozen(NewInvocation { queue_tag: queue.tag(&f.user), ..new_inv(&f, &format!("a{i}"), false) }).await;
    }
    let b1 = NewInvocation {
        run_id: run_b.id.clone(),
        turn_id: turn_b.id.clone(),
        owner_id: other.id.clone(),
        queue_tag: queue.tag(&f.user) - 1,
        ..new_inv(&f, "b1", false)
    };
    frozen(b1).await;
    assert_eq!(ids(f.store.claim_batch("n", 60_000, 5, &skipping_a).await.unwrap()), ["b1"]);
    assert_eq!(ids(f.store.claim_batch("n", 60_000, 2, &[]).await.unwrap()), ["a10", "a11"]);
}

both_backends!(
    the_queue_is_claimed_in_tag_order,
    unused_tool_vectors_are_swept,
    a_relisting_writes_only_what_changed,
    removed_mcp_tools_are_kept_up_to_a_limit,
    a_failing_freeze_fails_alone_and_writes_go_on,
    a_lost_claim_stores_nothing_beside_a_stored_result,
    group_commits_are_seen_in_id_order,
    batched_event_appends_stay_gapless_per_run,
    batch_claims_are_exclusive_and_gated,
    users_tokens_and_isolation,
    runs_paginate_newest_first,
    list_filters_none_empty_and_cursor,
    concurrent_event_appends_get_distinct_monotonic_ids,
    freezing_is_idempotent_per_call_id,
    claims_are_exclusive_and_gated,
    racing_grants_have_one_winner,
    a_grant_claims_for_the_granting_harness,
    a_freeze_claims_approval_free_calls_only,
    grant_and_deny_race_one_wins,
    mismatch_changes_nothing_and_expiry_ends_the_wait,
    four_eyes_decisions_and_claims,
    bus_wakes_after_commit_only,
);

/// SQLite: the writer leaves checkpoints to `Checkpointer` (its own `wal_autocheckpoint` is
/// off). Were nobody to copy the log back, it would hold all of the 64 MB written below; the
/// checkpoints after commits let a writer start the log over — past 8,000 frames (32 MiB) one
/// that holds the writer slot — so the `-wal` file stays below 40 MiB.
#[tokio::test]
async fn sqlite_log_is_checkpointed_after_commits() {
    let f = fixture(Backend::Sqlite).await;
    let wal = f._tmp.path().join("mira.db-wal");
    let chunk = "x".repeat(40 * 1024);
    for i in 0..1600 {
        let mut tx = f.store.begin_write().await.unwrap();
        tx.append_event(&f.run.id, EventKind::TerminalOutput, &json!({"i": i, "text": chunk})).await.unwrap();
        tx.commit().await.unwrap();
        // Room for the checkpoint to run between commits, as between a server's requests.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let size = std::fs::metadata(&wal).unwrap().len();
    assert!(size < 40 * 1024 * 1024, "the log grew to {size} bytes: nothing checkpointed it");
    assert_eq!(f.store.last_event_seq(&f.run.id).await.unwrap(), 1601);
}
