//! GitHub Actions: list workflow runs, read a run with its jobs and their logs (each log's
//! tail, size-capped), re-run a run.

use async_trait::async_trait;
use http::Method;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::api::{ACCEPT_JSON, Api, MAX_RAW_BYTES, seg};
use super::contents::repo_path;
use super::{Action, MAX_ITEMS, check_branch, tail, targeted, third_party};
use crate::evidence::EvidenceDraft;
use crate::registry::{ToolError, ToolOutput};

/// Most jobs of a run whose logs are read.
pub const MAX_LOG_JOBS: usize = 10;

/// The tail of each job's log kept, in bytes.
pub const MAX_LOG_TAIL_BYTES: usize = 16 * 1024;

fn run_summary(r: &Value) -> Value {
    json!({
        "id": r["id"],
        "name": r.get("name"),
        "workflow_id": r.get("workflow_id"),
        "event": r.get("event"),
        "status": r.get("status"),
        "conclusion": r.get("conclusion"),
        "head_branch": r.get("head_branch"),
        "head_sha": r.get("head_sha"),
        "run_attempt": r.get("run_attempt"),
        "created_at": r.get("created_at"),
        "url": r.get("html_url"),
    })
}

// ---- github_list_runs -------------------------------------------------------------------------

/// Input of `github_list_runs`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListRunsInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Only runs of this branch
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub branch: Option<String>,
    /// Only runs of this commit SHA
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 40, max = 40))]
    pub head_sha: Option<String>,
    /// Results wanted, 1-100 (default 20)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub count: Option<u64>,
}
targeted!(ListRunsInput);

/// `github_list_runs`.
pub struct ListRuns;

#[async_trait]
impl Action for ListRuns {
    type Input = ListRunsInput;
    const ID: &'static str = "github_list_runs";
    const TITLE: &'static str = "List GitHub Actions runs";
    const DESCRIPTION: &'static str = "List a repository's workflow runs, newest first (id, workflow name, event, \
        status, conclusion, branch, head SHA).";
    const PERMISSION: &'static str = "actions:read";
    const WRITE: bool = false;

    fn check(input: &mut ListRunsInput) -> Result<(), ToolError> {
        if let Some(b) = &input.branch {
            check_branch(b)?;
        }
        if let Some(s) = &input.head_sha {
            input.head_sha = Some(super::check_sha("head_sha", s)?);
        }
        input.count = Some(input.count.unwrap_or(20).clamp(1, MAX_ITEMS));
        Ok(())
    }

    async fn run(api: &Api, input: ListRunsInput) -> Result<ToolOutput, ToolError> {
        let mut url = format!("{}/actions/runs?per_page={}", repo_path(&input.repo), input.count.unwrap_or(20));
        if let Some(b) = &input.branch {
            url.push_str(&format!("&branch={}", seg(b)));
        }
        if let Some(s) = &input.head_sha {
            url.push_str(&format!("&head_sha={s}"));
        }
        let r = api.get(&url).await?;
        let runs: Vec<Value> = r
            .get("workflow_runs")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .take(MAX_ITEMS as usize)
            .map(run_summary)
            .collect();
        Ok(ToolOutput {
            output: json!({"repo": input.repo, "total_count": r.get("total_count"), "runs": runs}),
            evidence: Vec::new(),
        })
    }
}

// ---- github_read_run --------------------------------------------------------------------------

/// Input of `github_read_run` and `github_rerun`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRef {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Workflow run id
    #[schemars(range(min = 1, max = 9_007_199_254_740_991_i64))]
    pub run_id: u64,
}
targeted!(RunRef);

/// `github_read_run`.
pub struct ReadRun;

/// A job's log: GitHub answers 302 to a short-lived download URL (or the text itself).
async fn job_log(api: &Api, repo: &str, job_id: &Value) -> Result<String, String> {
    let url = format!("{}/actions/jobs/{}/logs", repo_path(repo), job_id.as_u64().unwrap_or_default());
    let reply = api.send(Method::GET, &url, None, ACCEPT_JSON, MAX_RAW_BYTES).await.map_err(|e| e.message)?;
    let bytes = if reply.status.is_redirection() {
        let location = reply.header("location").ok_or("a redirect without Location")?.to_owned();
        api.download(&location, MAX_RAW_BYTES).await?
    } else if reply.status.is_success() {
        reply.body
    } else {
        return Err(format!("GitHub answered {}: {}", reply.status.as_u16(), reply.message()));
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[async_trait]
impl Action for ReadRun {
    type Input = RunRef;
    const ID: &'static str = "github_read_run";
    const TITLE: &'static str = "Read a GitHub Actions run";
    const DESCRIPTION: &'static str = "Read a workflow run with its jobs and steps, and the last 16 KiB of the log \
        of each of its first 10 jobs. Logs are untrusted third-party text.";
    const PERMISSION: &'static str = "actions:read";
    const WRITE: bool = false;

    async fn run(api: &Api, input: RunRef) -> Result<ToolOutput, ToolError> {
        let base = format!("{}/actions/runs/{}", repo_path(&input.repo), input.run_id);
        let run = api.get(&base).await?;
        let jobs = api.get(&format!("{base}/jobs?per_page=100")).await?;
        let mut out = run_summary(&run);
        let mut evidence: Vec<EvidenceDraft> = Vec::new();
        let mut out_jobs = Vec::new();
        for (i, j) in jobs.get("jobs").and_then(Value::as_array).into_iter().flatten().take(100).enumerate() {
            let steps: Vec<Value> = j
                .get("steps")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|s| json!({"number": s.get("number"), "name": s["name"], "status": s["status"], "conclusion": s.get("conclusion")}))
                .collect();
            let mut job = json!({"id": j["id"], "name": j["name"], "status": j["status"], "conclusion": j.get("conclusion"),
                "started_at": j.get("started_at"), "completed_at": j.get("completed_at"), "steps": steps});
            if i < MAX_LOG_JOBS {
                match job_log(api, &input.repo, &j["id"]).await {
                    Ok(log) => {
                        let (kept, truncated) = tail(&log, MAX_LOG_TAIL_BYTES);
                        evidence.push(third_party(
                            "github_job_log",
                            api,
                            &input.repo,
                            json!({"run_id": input.run_id, "job_id": j["id"], "bytes": log.len(), "tail_bytes": kept.len()}),
                            &kept,
                        ));
                        job["log_tail"] = json!(kept);
                        job["log_truncated"] = json!(truncated);
                    }
                    Err(e) => job["log_error"] = json!(e),
                }
            }
            out_jobs.push(job);
        }
        out["repo"] = json!(input.repo);
        out["jobs"] = json!(out_jobs);
        out["trust"] = json!("third_party");
        Ok(ToolOutput { output: out, evidence })
    }
}

// ---- github_rerun -----------------------------------------------------------------------------

/// `github_rerun`.
pub struct RerunRun;

#[async_trait]
impl Action for RerunRun {
    type Input = RunRef;
    const ID: &'static str = "github_rerun";
    const TITLE: &'static str = "Re-run a GitHub Actions run";
    const DESCRIPTION: &'static str = "Re-run every job of a workflow run. Needs approval.";
    const PERMISSION: &'static str = "actions:write";
    const WRITE: bool = true;

    async fn run(api: &Api, input: RunRef) -> Result<ToolOutput, ToolError> {
        let url = format!("{}/actions/runs/{}/rerun", repo_path(&input.repo), input.run_id);
        api.json(Method::POST, &url, Some(&json!({}))).await?;
        Ok(ToolOutput {
            output: json!({"repo": input.repo, "run_id": input.run_id, "rerun_requested": true}),
            evidence: vec![EvidenceDraft::of_text(
                "github_write",
                json!({"source": "github", "action": "rerun", "repo": input.repo, "run_id": input.run_id,
                    "connection_id": api.connection_id()}),
                &format!("re-run requested for run {}", input.run_id),
            )],
        })
    }
}
