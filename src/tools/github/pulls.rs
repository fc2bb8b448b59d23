//! Pull requests: list, read (with diff and checks), create, review, merge.
//!
//! A merge is bound to the head SHA the approver saw (`sha`): the tool compares it with the
//! pull request's head before merging and sends it to GitHub's merge API, which refuses the
//! merge (409) if the head moved in between — either way the call ends `head_changed` and
//! nothing unseen is merged.
//!
//! A merge is bound to its base too: when the call is frozen the pull request's base branch
//! (`base`) and that branch's head (`base_sha`) are derived and shown on the approval. Before
//! merging, the pull request is read again and
//! * a base branch other than `base` (the pull request was retargeted, say from `develop` to
//!   `main`) ends the call `base_changed` (409): the approver never saw that branch;
//! * a base branch that merely advanced (its head now a descendant of `base_sha`: others
//!   merged in between) is merged into, as GitHub always merges into the base's current head:
//!   what the approver approved — these head commits, into this branch — is what lands, and the
//!   commits the base gained were already in it. Refusing those would make merges on any busy
//!   branch fail; the output reports both base SHAs;
//! * a base branch that was rewritten (its head no longer descends from `base_sha`: a force
//!   push, a branch deleted and made again) ends the call `base_changed`, since the branch is
//!   no longer the one the approver saw. Told by GitHub's compare API (`status` `ahead`).
//!
//! GitHub's merge API has no parameter binding the base, so a retarget in the moment between
//! the re-read and the merge request is not caught (the head is: its `sha` is sent).

use async_trait::async_trait;
use http::Method;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::api::{ACCEPT_DIFF, Api, MAX_RAW_BYTES, seg};
use super::contents::repo_path;
use super::issues::{MAX_BODY_BYTES, MAX_TITLE_BYTES};
use super::{Action, MAX_ITEMS, MAX_TEXT_BYTES, check_branch, check_sha, cut, targeted, third_party};
use crate::error::ErrorCode;
use crate::evidence::EvidenceDraft;
use crate::registry::{ToolError, ToolOutput};

fn pull_summary(p: &Value) -> Value {
    json!({
        "number": p["number"],
        "title": p["title"],
        "state": p["state"],
        "draft": p.get("draft"),
        "merged": p.get("merged"),
        "mergeable": p.get("mergeable"),
        "user": p.pointer("/user/login"),
        "head": {"ref": p.pointer("/head/ref"), "sha": p.pointer("/head/sha"), "repo": p.pointer("/head/repo/full_name")},
        "base": {"ref": p.pointer("/base/ref"), "sha": p.pointer("/base/sha")},
        "created_at": p.get("created_at"),
        "updated_at": p.get("updated_at"),
        "url": p.get("html_url"),
    })
}

fn written(api: &Api, action: &str, repo: &str, number: Option<u64>, extra: Value, text: &str) -> EvidenceDraft {
    let mut prov = json!({"source": "github", "action": action, "repo": repo, "number": number,
        "connection_id": api.connection_id()});
    if let (Value::Object(p), Value::Object(e)) = (&mut prov, extra) {
        p.extend(e);
    }
    EvidenceDraft::of_text("github_write", prov, text)
}

// ---- github_list_pulls ------------------------------------------------------------------------

/// Which pull requests to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PullState {
    /// Open ones.
    Open,
    /// Closed or merged ones.
    Closed,
    /// Both.
    All,
}

/// Input of `github_list_pulls`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPullsInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// open (default), closed or all
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PullState>,
    /// Only pull requests into this base branch
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub base: Option<String>,
    /// Results wanted, 1-100 (default 30)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub count: Option<u64>,
}
targeted!(ListPullsInput);

/// `github_list_pulls`.
pub struct ListPulls;

#[async_trait]
impl Action for ListPulls {
    type Input = ListPullsInput;
    const ID: &'static str = "github_list_pulls";
    const TITLE: &'static str = "List GitHub pull requests";
    const DESCRIPTION: &'static str = "List a repository's pull requests (number, title, state, author, head and \
        base branch and SHA). Titles are untrusted third-party text.";
    const PERMISSION: &'static str = "pull_requests:read";
    const WRITE: bool = false;

    fn check(input: &mut ListPullsInput) -> Result<(), ToolError> {
        if let Some(b) = &input.base {
            check_branch(b)?;
        }
        input.state = Some(input.state.unwrap_or(PullState::Open));
        input.count = Some(input.count.unwrap_or(30).clamp(1, MAX_ITEMS));
        Ok(())
    }

    async fn run(api: &Api, input: ListPullsInput) -> Result<ToolOutput, ToolError> {
        let state = serde_json::to_value(input.state.unwrap_or(PullState::Open)).unwrap_or(json!("open"));
        let mut url = format!(
            "{}/pulls?state={}&per_page={}",
            repo_path(&input.repo),
            state.as_str().unwrap_or("open"),
            input.count.unwrap_or(30)
        );
        if let Some(b) = &input.base {
            url.push_str(&format!("&base={}", seg(b)));
        }
        let r = api.get(&url).await?;
        let pulls: Vec<Value> = r.as_array().into_iter().flatten().take(MAX_ITEMS as usize).map(pull_summary).collect();
        let titles = pulls
            .iter()
            .map(|p| format!("#{} {}", p["number"], p["title"].as_str().unwrap_or_default()))
            .collect::<Vec<_>>();
        let evidence =
            vec![third_party("github_pull_list", api, &input.repo, json!({"state": state}), &titles.join("\n"))];
        Ok(ToolOutput { output: json!({"repo": input.repo, "pulls": pulls}), evidence })
    }
}

// ---- github_read_pull -------------------------------------------------------------------------

/// Input of `github_read_pull`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullRef {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Pull request number
    #[schemars(range(min = 1, max = 2147483647))]
    pub number: u64,
}
targeted!(PullRef);

/// `github_read_pull`.
pub struct ReadPull;

#[async_trait]
impl Action for ReadPull {
    type Input = PullRef;
    const ID: &'static str = "github_read_pull";
    const TITLE: &'static str = "Read a GitHub pull request";
    const DESCRIPTION: &'static str = "Read a pull request: title, body, head and base (with the head SHA a merge \
        must name), mergeability, its unified diff (cut at 128 KiB) and the checks and statuses of its head commit. \
        The body and diff are untrusted third-party text.";
    const PERMISSION: &'static str = "pull_requests:read";
    const WRITE: bool = false;

    async fn run(api: &Api, input: PullRef) -> Result<ToolOutput, ToolError> {
        let rp = repo_path(&input.repo);
        let pull = api.get(&format!("{rp}/pulls/{}", input.number)).await?;
        let head_sha = pull.pointer("/head/sha").and_then(Value::as_str).unwrap_or_default().to_owned();
        let mut out = pull_summary(&pull);
        let body_text = pull["body"].as_str().unwrap_or_default();
        let (body, body_truncated) = cut(body_text, MAX_TEXT_BYTES);
        out["repo"] = json!(input.repo);
        out["body"] = json!(body);
        out["body_truncated"] = json!(body_truncated);
        out["trust"] = json!("third_party");
        let mut evidence = vec![third_party(
            "github_pull",
            api,
            &input.repo,
            json!({"number": input.number, "url": pull["html_url"], "head_sha": head_sha, "author": pull.pointer("/user/login")}),
            &format!("{}\n\n{body_text}", pull["title"].as_str().unwrap_or_default()),
        )];
        // The diff: GitHub's diff media type on the same URL.
        let diff =
            api.send(Method::GET, &format!("{rp}/pulls/{}", input.number), None, ACCEPT_DIFF, MAX_RAW_BYTES).await;
        match diff {
            Ok(reply)
                if reply.status.is_success() && !reply.header("content-type").is_some_and(|c| c.contains("json")) =>
            {
                let text = String::from_utf8_lossy(&reply.body).into_owned();
                let (shown, truncated) = cut(&text, MAX_TEXT_BYTES);
                evidence.push(third_party(
                    "github_diff",
                    api,
                    &input.repo,
                    json!({"number": input.number, "head_sha": head_sha, "bytes": text.len()}),
                    &text,
                ));
                out["diff"] = json!(shown);
                out["diff_truncated"] = json!(truncated);
            }
            Ok(reply) => out["diff_error"] = json!(format!("GitHub answered {} for the diff", reply.status.as_u16())),
            Err(e) => out["diff_error"] = json!(e.message),
        }
        if !head_sha.is_empty() {
            let sha = seg(&head_sha);
            match api.get(&format!("{rp}/commits/{sha}/check-runs?per_page=100")).await {
                Ok(c) => {
                    let runs: Vec<Value> = c
                        .get("check_runs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|r| json!({"name": r["name"], "status": r["status"], "conclusion": r["conclusion"], "url": r.get("html_url")}))
                        .collect();
                    out["check_runs"] = json!(runs);
                }
                Err(e) => out["check_runs_error"] = json!(e.message),
            }
            match api.get(&format!("{rp}/commits/{sha}/status")).await {
                Ok(s) => {
                    let statuses: Vec<Value> = s
                        .get("statuses")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|x| json!({"context": x["context"], "state": x["state"], "description": x.get("description")}))
                        .collect();
                    out["status"] = json!({"state": s.get("state"), "statuses": statuses});
                }
                Err(e) => out["status_error"] = json!(e.message),
            }
        }
        Ok(ToolOutput { output: out, evidence })
    }
}

// ---- github_create_pull -----------------------------------------------------------------------

/// Input of `github_create_pull`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePullInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Title
    #[schemars(length(min = 1, max = 1024))]
    pub title: String,
    /// Branch with the changes (owner:branch for a fork)
    #[schemars(length(min = 1, max = 300))]
    pub head: String,
    /// Branch to merge into
    #[schemars(length(min = 1, max = 255))]
    pub base: String,
    /// Description (Markdown)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// Open as a draft (default false)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<bool>,
}
targeted!(CreatePullInput);

/// `github_create_pull`.
pub struct CreatePull;

#[async_trait]
impl Action for CreatePull {
    type Input = CreatePullInput;
    const ID: &'static str = "github_create_pull";
    const TITLE: &'static str = "Open a GitHub pull request";
    const DESCRIPTION: &'static str = "Open a pull request from head into base with this exact title and body. \
        Needs approval.";
    const PERMISSION: &'static str = "pull_requests:write";
    const WRITE: bool = true;

    fn check(input: &mut CreatePullInput) -> Result<(), ToolError> {
        check_branch(&input.base)?;
        let head_branch = input.head.split_once(':').map_or(input.head.as_str(), |(_, b)| b);
        check_branch(head_branch)?;
        if input.title.len() > MAX_TITLE_BYTES || input.title.trim().is_empty() {
            return Err(ToolError::new(ErrorCode::InvalidField, "title is empty or too long"));
        }
        if input.body.as_ref().is_some_and(|b| b.len() > MAX_BODY_BYTES) {
            return Err(ToolError::new(ErrorCode::InvalidField, format!("body is longer than {MAX_BODY_BYTES} bytes")));
        }
        Ok(())
    }

    async fn run(api: &Api, input: CreatePullInput) -> Result<ToolOutput, ToolError> {
        let mut body = json!({"title": input.title, "head": input.head, "base": input.base});
        if let Some(b) = &input.body {
            body["body"] = json!(b);
        }
        if let Some(d) = input.draft {
            body["draft"] = json!(d);
        }
        let r = api.json(Method::POST, &format!("{}/pulls", repo_path(&input.repo)), Some(&body)).await?;
        let number = r["number"].as_u64();
        Ok(ToolOutput {
            output: pull_summary(&r),
            evidence: vec![written(
                api,
                "create_pull",
                &input.repo,
                number,
                json!({"url": r["html_url"]}),
                &input.title,
            )],
        })
    }
}

// ---- github_review_pull -----------------------------------------------------------------------

/// A review's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReviewEvent {
    /// Approve.
    Approve,
    /// Ask for changes.
    RequestChanges,
    /// Comment only.
    Comment,
}

/// Input of `github_review_pull`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReviewInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Pull request number
    #[schemars(range(min = 1, max = 2147483647))]
    pub number: u64,
    /// APPROVE, REQUEST_CHANGES or COMMENT
    pub event: ReviewEvent,
    /// Review text (required for REQUEST_CHANGES and COMMENT)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The head commit the review is about (default: the head when the call is frozen)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 40, max = 40))]
    pub commit_id: Option<String>,
}
targeted!(ReviewInput);

/// The head SHA of pull request `number`.
async fn pull_head(api: &Api, repo: &str, number: u64) -> Result<(String, Value), ToolError> {
    let pull = api.get(&format!("{}/pulls/{number}", repo_path(repo))).await?;
    let sha = pull.pointer("/head/sha").and_then(Value::as_str).map(str::to_ascii_lowercase).ok_or_else(|| {
        ToolError::new(ErrorCode::GithubError, format!("GitHub named no head commit for pull request {number}"))
    })?;
    Ok((sha, pull))
}

/// `github_review_pull`.
pub struct ReviewPull;

#[async_trait]
impl Action for ReviewPull {
    type Input = ReviewInput;
    const ID: &'static str = "github_review_pull";
    const TITLE: &'static str = "Review a GitHub pull request";
    const DESCRIPTION: &'static str = "Submit a review (APPROVE, REQUEST_CHANGES or COMMENT) of a pull request's \
        exact head commit. Needs approval.";
    const PERMISSION: &'static str = "pull_requests:write";
    const WRITE: bool = true;
    const DERIVED: &'static [&'static str] = &["commit_id"];

    fn check(input: &mut ReviewInput) -> Result<(), ToolError> {
        if let Some(c) = &input.commit_id {
            input.commit_id = Some(check_sha("commit_id", c)?);
        }
        let empty = input.body.as_deref().is_none_or(|b| b.trim().is_empty());
        if empty && input.event != ReviewEvent::Approve {
            return Err(ToolError::new(ErrorCode::MissingField, "body is required for REQUEST_CHANGES and COMMENT"));
        }
        if input.body.as_ref().is_some_and(|b| b.len() > MAX_BODY_BYTES) {
            return Err(ToolError::new(ErrorCode::InvalidField, format!("body is longer than {MAX_BODY_BYTES} bytes")));
        }
        Ok(())
    }

    async fn derive(api: &Api, input: &mut ReviewInput) -> Result<Value, ToolError> {
        let (sha, pull) = pull_head(api, &input.repo, input.number).await?;
        if input.commit_id.is_none() {
            input.commit_id = Some(sha.clone());
        }
        Ok(json!({"title": pull["title"], "head_sha": sha, "commit_id": input.commit_id}))
    }

    async fn run(api: &Api, input: ReviewInput) -> Result<ToolOutput, ToolError> {
        let mut body = json!({"event": input.event});
        if let Some(b) = &input.body {
            body["body"] = json!(b);
        }
        if let Some(c) = &input.commit_id {
            body["commit_id"] = json!(c);
        }
        let url = format!("{}/pulls/{}/reviews", repo_path(&input.repo), input.number);
        let r = api.json(Method::POST, &url, Some(&body)).await?;
        Ok(ToolOutput {
            output: json!({"repo": input.repo, "number": input.number, "review_id": r["id"], "state": r["state"],
                "commit_id": r.get("commit_id"), "url": r.get("html_url")}),
            evidence: vec![written(
                api,
                "review",
                &input.repo,
                Some(input.number),
                json!({"event": input.event, "commit_id": input.commit_id}),
                input.body.as_deref().unwrap_or_default(),
            )],
        })
    }
}

// ---- github_merge_pull ------------------------------------------------------------------------

/// `Ok` when the base branch's head `now` descends from the approved `approved` (the branch
/// advanced), else `base_changed` (it was rewritten, or GitHub no longer knows `approved`).
async fn check_base_advanced(
    api: &Api,
    input: &MergeInput,
    base: &str,
    approved: &str,
    now: &str,
) -> Result<(), ToolError> {
    let details = json!({"base": base, "expected_base_sha": approved, "current_base_sha": now});
    let url = format!("{}/compare/{approved}...{now}", repo_path(&input.repo));
    let reply = api.send(Method::GET, &url, None, super::api::ACCEPT_JSON, super::api::MAX_JSON_BYTES).await?;
    if reply.status.as_u16() == 404 {
        return Err(base_changed(
            &input.repo,
            input.number,
            &format!("branch {base} no longer holds the approved commit {approved}"),
            details,
        ));
    }
    let cmp = api.ok(reply)?.json()?;
    match cmp.get("status").and_then(Value::as_str) {
        Some("ahead") => Ok(()),
        status => Err(base_changed(
            &input.repo,
            input.number,
            &format!(
                "branch {base} was rewritten: its head {now} does not descend from the approved {approved} ({})",
                status.unwrap_or("no comparison")
            ),
            details,
        )),
    }
}

/// How to merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MergeMethod {
    /// A merge commit.
    Merge,
    /// One squashed commit.
    Squash,
    /// The commits rebased onto the base.
    Rebase,
}

/// Input of `github_merge_pull`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Pull request number
    #[schemars(range(min = 1, max = 2147483647))]
    pub number: u64,
    /// The head commit SHA you reviewed (from github_read_pull): the merge fails with head_changed if the pull request's head is another
    #[schemars(length(min = 40, max = 40))]
    pub sha: String,
    /// merge (default), squash or rebase
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_method: Option<MergeMethod>,
    /// Title of the merge commit
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub commit_title: Option<String>,
    /// Message of the merge commit
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_message: Option<String>,
    /// The base branch the pull request merges into (default: its base when the call is frozen); the merge fails with base_changed if the pull request was retargeted
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub base: Option<String>,
    /// The base branch's head commit (default: resolved when the call is frozen); the merge fails with base_changed if the branch was rewritten so that this is no longer in it
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 40, max = 40))]
    pub base_sha: Option<String>,
}
targeted!(MergeInput);

/// The base branch and its head SHA of a pull request as GitHub answered it.
fn pull_base(pull: &Value, number: u64) -> Result<(String, String), ToolError> {
    let base = pull.pointer("/base/ref").and_then(Value::as_str);
    let sha = pull.pointer("/base/sha").and_then(Value::as_str).and_then(|s| check_sha("base.sha", s).ok());
    match (base, sha) {
        (Some(b), Some(s)) if check_branch(b).is_ok() => Ok((b.to_owned(), s)),
        _ => Err(ToolError::new(
            ErrorCode::GithubError,
            format!("GitHub named no valid base branch and commit for pull request {number}"),
        )),
    }
}

fn base_changed(repo: &str, number: u64, why: &str, details: Value) -> ToolError {
    ToolError::new(
        ErrorCode::BaseChanged,
        format!(
            "the base of pull request {repo}#{number} changed since the merge was approved: {why}; nothing was merged"
        ),
    )
    .with_details(details)
}

fn moved(repo: &str, number: u64, expected: &str, now: Option<&str>) -> ToolError {
    ToolError::new(
        ErrorCode::HeadChanged,
        format!(
            "the head of pull request {repo}#{number} is no longer {expected}: new commits were pushed since the merge \
             was approved; nothing was merged"
        ),
    )
    .with_details(json!({"expected_sha": expected, "current_sha": now}))
}

/// `github_merge_pull`.
pub struct MergePull;

#[async_trait]
impl Action for MergePull {
    type Input = MergeInput;
    const ID: &'static str = "github_merge_pull";
    const TITLE: &'static str = "Merge a GitHub pull request";
    const DESCRIPTION: &'static str = "Merge a pull request whose head is exactly `sha` (the commit you reviewed); \
        if anything was pushed since, nothing is merged (head_changed). The merge is bound to the pull request's base \
        branch when the call is frozen: if it was retargeted or that branch rewritten, nothing is merged \
        (base_changed). Needs approval.";
    const PERMISSION: &'static str = "contents:write";
    const WRITE: bool = true;
    const DERIVED: &'static [&'static str] = &["base", "base_sha"];

    fn check(input: &mut MergeInput) -> Result<(), ToolError> {
        input.sha = check_sha("sha", &input.sha)?;
        input.merge_method = Some(input.merge_method.unwrap_or(MergeMethod::Merge));
        if input.commit_message.as_ref().is_some_and(|m| m.len() > MAX_BODY_BYTES) {
            return Err(ToolError::new(ErrorCode::InvalidField, "commit_message is too long"));
        }
        if let Some(b) = &input.base {
            check_branch(b)?;
        }
        if let Some(s) = &input.base_sha {
            input.base_sha = Some(check_sha("base_sha", s)?);
        }
        Ok(())
    }

    async fn derive(api: &Api, input: &mut MergeInput) -> Result<Value, ToolError> {
        // The approver sees the pull request as it is now next to the SHA being approved, and
        // the base branch (with its head) the merge is bound to.
        let (head, pull) = pull_head(api, &input.repo, input.number).await?;
        let (base, base_sha) = pull_base(&pull, input.number)?;
        match &input.base {
            Some(b) if *b != base => {
                return Err(base_changed(
                    &input.repo,
                    input.number,
                    &format!("it merges into {base}, not {b}"),
                    json!({"expected_base": b, "current_base": base}),
                ));
            }
            Some(_) => {}
            None => input.base = Some(base),
        }
        if input.base_sha.is_none() {
            input.base_sha = Some(base_sha);
        }
        Ok(json!({"title": pull["title"], "state": pull["state"], "head_sha_now": head, "sha": input.sha,
            "head_matches": head == input.sha, "base": input.base, "base_sha": input.base_sha,
            "head": pull.pointer("/head/ref")}))
    }

    async fn run(api: &Api, input: MergeInput) -> Result<ToolOutput, ToolError> {
        let (Some(base), Some(base_sha)) = (input.base.clone(), input.base_sha.clone()) else {
            return Err(ToolError::new(ErrorCode::CorruptInput, "the frozen input names no base branch and commit"));
        };
        let (head, pull) = pull_head(api, &input.repo, input.number).await?;
        if head != input.sha {
            return Err(moved(&input.repo, input.number, &input.sha, Some(&head)));
        }
        let (base_now, base_sha_now) = pull_base(&pull, input.number)?;
        if base_now != base {
            return Err(base_changed(
                &input.repo,
                input.number,
                &format!("it was retargeted from {base} to {base_now}"),
                json!({"expected_base": base, "current_base": base_now}),
            ));
        }
        if base_sha_now != base_sha {
            check_base_advanced(api, &input, &base, &base_sha, &base_sha_now).await?;
        }
        if pull.get("merged").and_then(Value::as_bool) == Some(true) {
            return Err(ToolError::new(
                ErrorCode::NotMergeable,
                format!("{}#{} is already merged", input.repo, input.number),
            ));
        }
        let mut body = json!({"sha": input.sha, "merge_method": input.merge_method.unwrap_or(MergeMethod::Merge)});
        if let Some(t) = &input.commit_title {
            body["commit_title"] = json!(t);
        }
        if let Some(m) = &input.commit_message {
            body["commit_message"] = json!(m);
        }
        let url = format!("{}/pulls/{}/merge", repo_path(&input.repo), input.number);
        let reply = api.send(Method::PUT, &url, Some(&body), super::api::ACCEPT_JSON, MAX_RAW_BYTES).await?;
        match reply.status.as_u16() {
            409 => return Err(moved(&input.repo, input.number, &input.sha, None)),
            405 => {
                return Err(ToolError::new(
                    ErrorCode::NotMergeable,
                    format!("GitHub will not merge {}#{}: {}", input.repo, input.number, reply.message()),
                ));
            }
            _ => {}
        }
        let r = api.ok(reply)?.json()?;
        if r.get("merged").and_then(Value::as_bool) != Some(true) {
            return Err(ToolError::new(
                ErrorCode::NotMergeable,
                format!(
                    "GitHub did not merge {}#{}: {}",
                    input.repo,
                    input.number,
                    r["message"].as_str().unwrap_or_default()
                ),
            ));
        }
        Ok(ToolOutput {
            output: json!({"repo": input.repo, "number": input.number, "merged": true, "merge_commit_sha": r["sha"],
                "head_sha": input.sha, "base": base, "base_sha_approved": base_sha, "base_sha": base_sha_now,
                "message": r.get("message")}),
            evidence: vec![written(
                api,
                "merge",
                &input.repo,
                Some(input.number),
                json!({"head_sha": input.sha, "merge_commit_sha": r["sha"], "base": base, "base_sha": base_sha_now}),
                &format!("merged {}#{} at head {} into {base}", input.repo, input.number, input.sha),
            )],
        })
    }
}
