//! Results a runner delivers after the control plane stopped waiting for them.
//!
//! The control plane sends an execution once and waits; when the runner stays away it ends
//! the invocation `interrupted` with `outcome_unknown` (or a stop ends it `cancelled` while
//! the device ran it). The runner journals what it did and delivers the result when it is
//! back (the `late` flag of `POST /v1/runner/results`). That result does not re-open the
//! invocation — its status stays — but it is what really happened on the device, so it is
//! attached to the invocation as evidence of kind [`LATE_RESULT_KIND`] (with its
//! `evidence.recorded` event, `late: true`): the device, whether the call succeeded or
//! failed, the SHA-256 of what it returned and the content hashes of the tool's own evidence.

use std::time::Duration;

use hmac::{KeyInit, Mac};
use mira_core::remote::{JobOutcome, JobResult};
use serde_json::{Value, json};

use crate::evidence::EvidenceDraft;
use crate::registry::Registry;
use crate::state::InvocationStatus;
use crate::store::{Store, StoreError};

/// The evidence kind of a late device result.
pub const LATE_RESULT_KIND: &str = "late_device_result";
/// Most of the tool's own evidence entries listed in the provenance.
const MAX_LISTED_EVIDENCE: usize = 32;

/// Job nonces that name what they were issued for: 16 random bytes and an HMAC-SHA-256
/// (RFC 2104) of them with the device and the invocation, under a key derived from the
/// control plane's job-signing key (so every replica, sharing `MIRA_SECRET_KEY`, checks what
/// another issued, also after a restart). A runner journals the nonce of every execution it
/// starts and delivers a late result with it; a late result whose nonce was not issued for
/// its device and invocation is dropped — a runner cannot attach what it claims to another
/// of its device's calls than the one it was sent.
///
/// Shape: 96 lowercase hex digits (32 random, then the MAC's first 32 bytes as 64).
pub struct JobNonces {
    /// The 32-byte key zero-padded to SHA-256's block, as HMAC pads a shorter key.
    key: [u8; 64],
}

impl JobNonces {
    /// Nonces keyed from `signing_key` (its 32 secret bytes, hashed with a label of this use).
    pub fn new(signing_key: &mira_core::remote::SigningKey) -> Self {
        use sha2::Digest;
        let derived =
            sha2::Sha256::new().chain_update(b"mira job nonce mac\0").chain_update(signing_key.to_bytes()).finalize();
        let mut key = [0u8; 64];
        key[..32].copy_from_slice(&derived);
        Self { key }
    }

    fn mac(&self, device_id: &str, invocation_id: &str, random: &str) -> [u8; 32] {
        let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new(&self.key.into());
        for part in [device_id, invocation_id, random] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac.finalize().into_bytes().into()
    }

    /// A new nonce for a job of `invocation_id` (empty for a prepare or canonicalize) sent to
    /// `device_id`.
    pub fn issue(&self, device_id: &str, invocation_id: &str) -> String {
        use rand::RngExt;
        let mut random = [0u8; 16];
        rand::rng().fill(&mut random);
        let random = hex::encode(random);
        let mac = hex::encode(self.mac(device_id, invocation_id, &random));
        format!("{random}{mac}")
    }

    /// Whether `nonce` was issued by [`JobNonces::issue`] for `device_id` and `invocation_id`
    /// (compared in constant time).
    pub fn names(&self, device_id: &str, invocation_id: &str, nonce: &str) -> bool {
        use subtle::ConstantTimeEq;
        if nonce.len() != 96 || !nonce.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return false;
        }
        let (random, mac) = nonce.split_at(32);
        let Ok(mac) = hex::decode(mac) else { return false };
        self.mac(device_id, invocation_id, random).ct_eq(&mac[..]).into()
    }
}

/// What a late outcome says: `succeeded` or `failed`, and the JSON it returned.
fn describe(outcome: &JobOutcome) -> Option<(&'static str, Value, Option<Value>)> {
    match outcome {
        JobOutcome::Output { output } => {
            let listed: Vec<Value> = output
                .evidence
                .iter()
                .take(MAX_LISTED_EVIDENCE)
                .map(|e| json!({"kind": e.kind, "content_sha256": e.content_sha256, "provenance": e.provenance}))
                .collect();
            Some(("succeeded", json!({"output": output.output, "evidence": listed}), None))
        }
        JobOutcome::Error { error } => Some(("failed", json!({"error": error}), Some(json!(error.code)))),
        // Prepare and canonicalize results change nothing; nothing to attach.
        JobOutcome::Prepared { .. } | JobOutcome::Canonical { .. } => None,
    }
}

/// The evidence draft of `result`, delivered late by `device_id`'s runner; None for an
/// outcome that is not an execution's.
pub fn draft(device_id: &str, result: &JobResult, status_kept: &str) -> Option<EvidenceDraft> {
    let (outcome, content, error_code) = describe(&result.outcome)?;
    let content = mira_core::canonical::to_canonical_string(&content);
    let output_sha256 = crate::evidence::sha256_hex(content.as_bytes());
    let message = format!(
        "late result from device {device_id}: {outcome}, with its output hash {output_sha256}; the invocation stays \
         {status_kept} (it is not re-opened)"
    );
    Some(EvidenceDraft {
        kind: LATE_RESULT_KIND.to_owned(),
        provenance: json!({
            "device_id": device_id, "invocation_id": result.invocation_id, "outcome": outcome,
            "output_sha256": output_sha256, "error_code": error_code, "late": result.late,
            "status_kept": status_kept, "received_at": crate::ids::now(),
        }),
        content_sha256: output_sha256,
        excerpt: crate::evidence::excerpt(&format!("{message}\n{content}"), crate::evidence::EXCERPT_MAX_BYTES),
    })
}

/// Attaches `result`, which `device_id`'s runner delivered while no call waited for it, to
/// its invocation: only when that invocation is a call of a tool that runs on the device
/// (its capability in `registry` says it works in the workspace,
/// [`super::executor::runs_on_device`]: a host tool's call never reached the device) on a run
/// bound to `device_id` (a runner speaks for its own device only; both checked before
/// anything waits) and once it has ended `interrupted` or `cancelled` after it started
/// (waiting up to `wait` while it is still `running`, a call that is still giving up; one
/// that has not started never reached the device and is dropped at once). Returns the
/// evidence id, None when nothing was attached (unknown invocation, a host tool's, another
/// device's, not started, completed or failed, already attached).
pub async fn attach(
    store: &Store,
    registry: &Registry,
    device_id: &str,
    result: JobResult,
    wait: Duration,
) -> Result<Option<String>, StoreError> {
    let Some(first) = store.invocation_by_id(&result.invocation_id).await? else {
        tracing::warn!(device = device_id, invocation = %result.invocation_id, "a late result names an unknown invocation; dropped");
        return Ok(None);
    };
    let capability = registry.get_any(&first.tool_id).and_then(|e| e.spec().capability.clone());
    if !super::executor::runs_on_device(capability.as_deref()) {
        tracing::warn!(device = device_id, invocation = %first.id, tool = %first.tool_id,
            "a late result names a call of a tool that does not run on a device; dropped");
        return Ok(None);
    }
    let run = store.run_for(&first.owner_id, &first.run_id).await?;
    if run.and_then(|r| r.device_id).as_deref() != Some(device_id) {
        tracing::warn!(device = device_id, invocation = %first.id, "a runner delivered a result for another device's invocation; dropped");
        return Ok(None);
    }
    let until = tokio::time::Instant::now() + wait;
    let mut inv = first;
    while !inv.status.is_final() {
        if inv.status != InvocationStatus::Running {
            tracing::warn!(device = device_id, invocation = %inv.id, status = %inv.status.as_str(),
                "a late result names an invocation that was never sent to a device; dropped");
            return Ok(None);
        }
        if tokio::time::Instant::now() >= until {
            tracing::warn!(device = device_id, invocation = %inv.id, status = %inv.status.as_str(),
                "a late result's invocation did not end in time; dropped");
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(now) = store.invocation_by_id(&inv.id).await? else { return Ok(None) };
        inv = now;
    }
    let Some(draft) = draft(device_id, &result, inv.status.as_str()) else { return Ok(None) };
    let id = store.attach_late_evidence(&inv, &draft).await?;
    match &id {
        Some(id) => {
            tracing::info!(device = device_id, invocation = %inv.id, evidence = %id, status = %inv.status.as_str(),
            "a late device result was attached to its invocation (its status stays)")
        }
        None => tracing::info!(device = device_id, invocation = %inv.id, status = %inv.status.as_str(),
            "a late device result was not attached (the invocation did not end with an unknown outcome, or has one already)"),
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use mira_core::tool::ToolOutput;

    fn result(outcome: JobOutcome) -> JobResult {
        JobResult { nonce: "n".into(), invocation_id: "inv_1".into(), outcome, late: true }
    }

    #[test]
    fn a_nonce_names_its_device_and_invocation_only() {
        let nonces = JobNonces::new(&mira_core::remote::SigningKey::from_bytes(&[7; 32]));
        let nonce = nonces.issue("dev_1", "inv_1");
        assert_eq!(nonce.len(), 96);
        assert!(nonces.names("dev_1", "inv_1", &nonce));
        assert!(!nonces.names("dev_1", "inv_2", &nonce));
        assert!(!nonces.names("dev_2", "inv_1", &nonce));
        assert!(!nonces.names("dev_1", "inv_1", &nonce.to_uppercase()));
        assert!(!nonces.names("dev_1", "inv_1", &nonce[..95]));
        // Fields are length-prefixed: moving a boundary changes the MAC.
        assert!(!nonces.names("dev_1i", "nv_1", &nonce));
        let other = JobNonces::new(&mira_core::remote::SigningKey::from_bytes(&[8; 32]));
        assert!(!other.names("dev_1", "inv_1", &nonce));
        assert_ne!(nonces.issue("dev_1", "inv_1"), nonce);
    }

    #[test]
    fn a_late_output_names_the_device_and_hashes_what_it_returned() {
        let output = ToolOutput { output: json!({"written": "a.txt"}), evidence: Vec::new() };
        let d = draft("dev_1", &result(JobOutcome::Output { output }), "interrupted").unwrap();
        assert_eq!(d.kind, LATE_RESULT_KIND);
        assert_eq!(d.provenance["outcome"], "succeeded");
        assert_eq!(d.provenance["status_kept"], "interrupted");
        let content =
            mira_core::canonical::to_canonical_string(&json!({"output": {"written": "a.txt"}, "evidence": []}));
        assert_eq!(d.content_sha256, crate::evidence::sha256_hex(content.as_bytes()));
        assert_eq!(d.provenance["output_sha256"], d.content_sha256.as_str());
        assert!(
            d.excerpt.starts_with("late result from device dev_1: succeeded, with its output hash "),
            "{}",
            d.excerpt
        );
    }

    #[test]
    fn a_late_error_is_failed_and_a_prepare_is_nothing() {
        let error = crate::registry::ToolError::new(crate::error::ErrorCode::NotFound, "gone");
        let d = draft("dev_1", &result(JobOutcome::Error { error }), "cancelled").unwrap();
        assert_eq!(d.provenance["outcome"], "failed");
        assert_eq!(d.provenance["error_code"], "not_found");
        assert!(draft("dev_1", &result(JobOutcome::Canonical { input: json!({}) }), "interrupted").is_none());
    }
}
