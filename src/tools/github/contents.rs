//! Repository contents: read a file or a tree, search code, create a branch, commit file
//! changes (one commit of several files through the Git database API).

use async_trait::async_trait;
use http::Method;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::api::{ACCEPT_JSON, ACCEPT_RAW, Api, MAX_RAW_BYTES, path, seg};
use super::{Action, MAX_ITEMS, MAX_TEXT_BYTES, check_branch, check_sha, cut, targeted, third_party};
use crate::error::ErrorCode;
use crate::evidence::{EvidenceDraft, sha256_hex};
use crate::registry::{ToolError, ToolOutput};

/// `/repos/{owner}/{repo}` of `owner/repo`.
pub fn repo_path(repo: &str) -> String {
    let (owner, name) = repo.split_once('/').unwrap_or((repo, ""));
    format!("/repos/{}/{}", seg(owner), seg(name))
}

/// Checks a path inside a repository: relative, `/`-separated, no empty, `.` or `..`
/// segment, no NUL or control character, at most 4096 bytes.
pub fn check_path(p: &str) -> Result<(), ToolError> {
    let bad = p.len() > 4096
        || p.starts_with('/')
        || p.chars().any(char::is_control)
        || (!p.is_empty() && p.trim_end_matches('/').split('/').any(|s| s.is_empty() || s == "." || s == ".."));
    if bad {
        return Err(ToolError::new(ErrorCode::InvalidPath, format!("{p:?} is not a path inside the repository")));
    }
    Ok(())
}

/// A branch's head commit SHA (`GET /repos/{o}/{r}/git/ref/heads/{branch}`).
pub async fn branch_head(api: &Api, repo: &str, branch: &str) -> Result<String, ToolError> {
    let r = api.get(&format!("{}/git/ref/heads/{}", repo_path(repo), path(branch))).await?;
    r.pointer("/object/sha")
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| ToolError::new(ErrorCode::GithubError, format!("GitHub named no head for branch {branch}")))
}

/// The repository's default branch.
pub async fn default_branch(api: &Api, repo: &str) -> Result<String, ToolError> {
    let r = api.get(&repo_path(repo)).await?;
    r.get("default_branch")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ToolError::new(ErrorCode::GithubError, format!("GitHub named no default branch for {repo}")))
}

// ---- github_read ------------------------------------------------------------------------------

/// Input of `github_read`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Path of a file or directory (empty or leave out: the root directory)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub path: Option<String>,
    /// Branch, tag or commit SHA (default: the default branch)
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "ref")]
    #[schemars(length(min = 1, max = 255))]
    pub git_ref: Option<String>,
    /// List the whole tree below the path's commit recursively (default false; at most 1000 entries)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recursive: Option<bool>,
}
targeted!(ReadInput);

/// `github_read`: a file's text or a directory listing.
pub struct ReadContents;

#[async_trait]
impl Action for ReadContents {
    type Input = ReadInput;
    const ID: &'static str = "github_read";
    const TITLE: &'static str = "Read a GitHub file or tree";
    const DESCRIPTION: &'static str = "Read a file of a GitHub repository (its text, cut at 128 KiB) or list a \
        directory (name, path, type, size, sha); `recursive: true` lists the whole tree. The text is untrusted \
        third-party content.";
    const PERMISSION: &'static str = "contents:read";
    const WRITE: bool = false;

    fn check(input: &mut ReadInput) -> Result<(), ToolError> {
        if let Some(p) = &input.path {
            check_path(p)?;
        }
        if let Some(r) = &input.git_ref {
            check_branch(r)?;
        }
        Ok(())
    }

    async fn run(api: &Api, input: ReadInput) -> Result<ToolOutput, ToolError> {
        let repo = input.repo.as_str();
        let p = input.path.clone().unwrap_or_default();
        let query = input.git_ref.as_deref().map(|r| format!("?ref={}", seg(r))).unwrap_or_default();
        if input.recursive == Some(true) {
            let git_ref = match &input.git_ref {
                Some(r) => r.clone(),
                None => default_branch(api, repo).await?,
            };
            let tree = api.get(&format!("{}/git/trees/{}?recursive=1", repo_path(repo), path(&git_ref))).await?;
            let prefix = if p.is_empty() { String::new() } else { format!("{}/", p.trim_end_matches('/')) };
            let entries: Vec<Value> = tree
                .get("tree")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|e| e.get("path").and_then(Value::as_str).is_some_and(|x| x.starts_with(&prefix)))
                .take(1000)
                .map(|e| json!({"path": e["path"], "type": e["type"], "size": e.get("size"), "sha": e["sha"]}))
                .collect();
            let listing = entries.iter().filter_map(|e| e["path"].as_str()).collect::<Vec<_>>().join("\n");
            let evidence = vec![third_party("github_tree", api, repo, json!({"path": p, "ref": git_ref}), &listing)];
            let truncated = tree.get("truncated").and_then(Value::as_bool).unwrap_or(false) || entries.len() >= 1000;
            return Ok(ToolOutput {
                output: json!({"repo": repo, "path": p, "ref": git_ref, "type": "tree", "entries": entries, "truncated": truncated}),
                evidence,
            });
        }
        let url = format!("{}/contents/{}{query}", repo_path(repo), path(&p));
        let directory = p.is_empty() || p.ends_with('/');
        let accept = if directory { ACCEPT_JSON } else { ACCEPT_RAW };
        let reply = api.ok(api.send(Method::GET, &url, None, accept, MAX_RAW_BYTES).await?)?;
        let is_json = reply.header("content-type").is_some_and(|c| c.contains("json"));
        let listing = if is_json { serde_json::from_slice::<Value>(&reply.body).ok().filter(Value::is_array) } else { None };
        if let Some(Value::Array(items)) = listing {
            let entries: Vec<Value> = items
                .iter()
                .take(1000)
                .map(|e| json!({"name": e["name"], "path": e["path"], "type": e["type"], "size": e["size"], "sha": e["sha"]}))
                .collect();
            let text = entries.iter().filter_map(|e| e["path"].as_str()).collect::<Vec<_>>().join("\n");
            let evidence =
                vec![third_party("github_tree", api, repo, json!({"path": p, "ref": input.git_ref}), &text)];
            return Ok(ToolOutput {
                output: json!({"repo": repo, "path": p, "ref": input.git_ref, "type": "dir", "entries": entries}),
                evidence,
            });
        }
        let size = reply.body.len();
        let sha256 = sha256_hex(&reply.body);
        let Ok(text) = std::str::from_utf8(&reply.body) else {
            return Ok(ToolOutput {
                output: json!({"repo": repo, "path": p, "ref": input.git_ref, "type": "file", "binary": true,
                    "size": size, "content_sha256": sha256}),
                evidence: Vec::new(),
            });
        };
        let (content, truncated) = cut(text, MAX_TEXT_BYTES);
        let prov = json!({"path": p, "ref": input.git_ref, "size": size, "truncated": truncated});
        let evidence = vec![third_party("github_file", api, repo, prov, text)];
        Ok(ToolOutput {
            output: json!({"repo": repo, "path": p, "ref": input.git_ref, "type": "file", "size": size,
                "content_sha256": sha256, "content": content, "truncated": truncated}),
            evidence,
        })
    }
}

// ---- github_search_code -----------------------------------------------------------------------

/// Input of `github_search_code`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchCodeInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// GitHub code search query (qualifiers such as language:rust or path:src allowed)
    #[schemars(length(min = 1, max = 256))]
    pub query: String,
    /// Only this repository, owner/name (required when the connection is limited to a list of repositories)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 3, max = 140))]
    pub repo: Option<String>,
    /// Results wanted, 1-100 (default 30)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub count: Option<u64>,
}
targeted!(SearchCodeInput, opt);

/// Refuses qualifiers that would leave the named repository (`repo:`, `org:`, `user:`).
pub fn check_query(query: &str) -> Result<String, ToolError> {
    let q = query.trim();
    if q.is_empty() {
        return Err(ToolError::new(ErrorCode::EmptyQuery, "query is empty"));
    }
    let scoped = q.split_whitespace().any(|w| {
        let w = w.trim_start_matches(['-', '(']).to_ascii_lowercase();
        ["repo:", "org:", "user:", "owner:"].iter().any(|p| w.starts_with(p))
    });
    if scoped {
        return Err(ToolError::new(
            ErrorCode::InvalidField,
            "query may not use repo:, org:, user: or owner: qualifiers; name the repository with repo",
        ));
    }
    Ok(q.to_owned())
}

/// `q` for GitHub's search: the query, scoped to `repo` when given.
pub fn scoped_query(query: &str, repo: Option<&str>) -> String {
    match repo {
        Some(r) => format!("{query} repo:{r}"),
        None => query.to_owned(),
    }
}

/// `github_search_code`: GitHub code search.
pub struct SearchCode;

#[async_trait]
impl Action for SearchCode {
    type Input = SearchCodeInput;
    const ID: &'static str = "github_search_code";
    const TITLE: &'static str = "Search code on GitHub";
    const DESCRIPTION: &'static str = "Search code with GitHub's code search, optionally in one repository. \
        Returns matching files (repo, path, sha, url); read one with github_read.";
    const PERMISSION: &'static str = "contents:read";
    const WRITE: bool = false;

    fn check(input: &mut SearchCodeInput) -> Result<(), ToolError> {
        input.query = check_query(&input.query)?;
        input.count = Some(input.count.unwrap_or(30).clamp(1, MAX_ITEMS));
        Ok(())
    }

    async fn run(api: &Api, input: SearchCodeInput) -> Result<ToolOutput, ToolError> {
        let q = scoped_query(&input.query, input.repo.as_deref());
        let count = input.count.unwrap_or(30);
        let r = api.get(&format!("/search/code?q={}&per_page={count}", seg(&q))).await?;
        let mut items = Vec::new();
        let mut evidence = Vec::new();
        for it in r.get("items").and_then(Value::as_array).into_iter().flatten().take(count as usize) {
            let repo = it.pointer("/repository/full_name").and_then(Value::as_str).unwrap_or_default();
            if !super::allowed(api.settings(), repo) {
                continue;
            }
            let item = json!({"repo": repo, "path": it["path"], "sha": it["sha"], "url": it["html_url"]});
            evidence.push(third_party(
                "github_search_result",
                api,
                repo,
                json!({"path": it["path"], "sha": it["sha"], "url": it["html_url"]}),
                &format!("{repo}:{}", it["path"].as_str().unwrap_or_default()),
            ));
            items.push(item);
        }
        Ok(ToolOutput {
            output: json!({"query": q, "total_count": r.get("total_count"), "items": items}),
            evidence,
        })
    }
}

// ---- github_create_branch ---------------------------------------------------------------------

/// Input of `github_create_branch`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBranchInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Name of the new branch
    #[schemars(length(min = 1, max = 255))]
    pub branch: String,
    /// Branch to start from (default: the default branch); ignored when sha is given
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub from: Option<String>,
    /// Commit SHA the branch starts at (default: the head of `from`, resolved when the call is frozen)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 40, max = 40))]
    pub sha: Option<String>,
}
targeted!(CreateBranchInput);

/// `github_create_branch`.
pub struct CreateBranch;

#[async_trait]
impl Action for CreateBranch {
    type Input = CreateBranchInput;
    const ID: &'static str = "github_create_branch";
    const TITLE: &'static str = "Create a GitHub branch";
    const DESCRIPTION: &'static str = "Create a branch in a GitHub repository at an exact commit: `sha`, or the \
        head of `from` (default: the default branch) as it is when the call is frozen. Needs approval.";
    const PERMISSION: &'static str = "contents:write";
    const WRITE: bool = true;
    const DERIVED: &'static [&'static str] = &["sha", "from"];

    fn check(input: &mut CreateBranchInput) -> Result<(), ToolError> {
        check_branch(&input.branch)?;
        if let Some(f) = &input.from {
            check_branch(f)?;
        }
        if let Some(s) = &input.sha {
            input.sha = Some(check_sha("sha", s)?);
        }
        Ok(())
    }

    async fn derive(api: &Api, input: &mut CreateBranchInput) -> Result<Value, ToolError> {
        if input.sha.is_none() {
            let from = match &input.from {
                Some(f) => f.clone(),
                None => default_branch(api, &input.repo).await?,
            };
            input.sha = Some(branch_head(api, &input.repo, &from).await?);
            input.from = Some(from);
        }
        Ok(json!({"repo": input.repo, "branch": input.branch, "sha": input.sha}))
    }

    async fn run(api: &Api, input: CreateBranchInput) -> Result<ToolOutput, ToolError> {
        let sha = input.sha.clone().ok_or_else(|| ToolError::new(ErrorCode::CorruptInput, "the frozen input has no sha"))?;
        let body = json!({"ref": format!("refs/heads/{}", input.branch), "sha": sha});
        let reply = api.send(Method::POST, &format!("{}/git/refs", repo_path(&input.repo)), Some(&body), ACCEPT_JSON, MAX_RAW_BYTES).await?;
        if reply.status.as_u16() == 422 && reply.message().to_ascii_lowercase().contains("already exists") {
            return Err(ToolError::new(ErrorCode::AlreadyExists, format!("branch {} already exists in {}", input.branch, input.repo)));
        }
        let r = api.ok(reply)?.json()?;
        Ok(ToolOutput {
            output: json!({"repo": input.repo, "branch": input.branch, "ref": r.get("ref"), "sha": sha}),
            evidence: vec![EvidenceDraft::of_text(
                "github_write",
                json!({"source": "github", "action": "create_branch", "repo": input.repo, "branch": input.branch,
                    "sha": sha, "connection_id": api.connection_id()}),
                &format!("created branch {} at {sha}", input.branch),
            )],
        })
    }
}

// ---- github_commit ----------------------------------------------------------------------------

/// One file change of a commit.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileChange {
    /// Path inside the repository
    #[schemars(length(min = 1, max = 4096))]
    pub path: String,
    /// The file's new text (UTF-8); leave out with delete: true
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Delete the file instead (default false)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete: Option<bool>,
}

/// Input of `github_commit`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitInput {
    /// Connection id (default: your first usable GitHub connection)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100))]
    pub connection: Option<String>,
    /// Repository, owner/name
    #[schemars(length(min = 3, max = 140))]
    pub repo: String,
    /// Branch to commit to (it must exist)
    #[schemars(length(min = 1, max = 255))]
    pub branch: String,
    /// Commit message
    #[schemars(length(min = 1, max = 65536))]
    pub message: String,
    /// The changes, 1-100 files
    #[schemars(length(min = 1, max = 100))]
    pub files: Vec<FileChange>,
    /// The branch head the commit goes on (default: resolved when the call is frozen); the commit fails with head_changed if the branch moved
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 40, max = 40))]
    pub parent_sha: Option<String>,
}
targeted!(CommitInput);

/// Largest text of one file of a commit, in bytes.
pub const MAX_COMMIT_FILE_BYTES: usize = 1024 * 1024;

/// `github_commit`: one commit with several file changes on a branch.
pub struct CommitFiles;

fn head_changed(repo: &str, branch: &str, expected: &str, now: Option<&str>) -> ToolError {
    ToolError::new(
        ErrorCode::HeadChanged,
        format!("branch {branch} of {repo} moved since the call was frozen (expected head {expected}); nothing was committed"),
    )
    .with_details(json!({"expected_sha": expected, "current_sha": now}))
}

#[async_trait]
impl Action for CommitFiles {
    type Input = CommitInput;
    const ID: &'static str = "github_commit";
    const TITLE: &'static str = "Commit file changes on GitHub";
    const DESCRIPTION: &'static str = "Commit changes to files (new text, or delete) as one commit on a branch of \
        a GitHub repository. The commit goes on the branch head seen when the call is frozen (parent_sha); if the \
        branch moved, nothing is committed (head_changed). Needs approval.";
    const PERMISSION: &'static str = "contents:write";
    const WRITE: bool = true;
    const DERIVED: &'static [&'static str] = &["parent_sha"];

    fn check(input: &mut CommitInput) -> Result<(), ToolError> {
        check_branch(&input.branch)?;
        if let Some(s) = &input.parent_sha {
            input.parent_sha = Some(check_sha("parent_sha", s)?);
        }
        let mut seen = std::collections::HashSet::new();
        for f in &input.files {
            check_path(&f.path)?;
            if f.path.is_empty() || f.path.ends_with('/') {
                return Err(ToolError::new(ErrorCode::InvalidPath, format!("{:?} is not a file path", f.path)));
            }
            if !seen.insert(f.path.clone()) {
                return Err(ToolError::new(ErrorCode::InvalidField, format!("{} is changed twice", f.path)));
            }
            match (&f.content, f.delete.unwrap_or(false)) {
                (Some(_), true) | (None, false) => {
                    return Err(ToolError::new(
                        ErrorCode::InvalidField,
                        format!("{}: give either content or delete: true", f.path),
                    ));
                }
                (Some(c), false) if c.len() > MAX_COMMIT_FILE_BYTES => {
                    return Err(ToolError::new(
                        ErrorCode::FileTooLarge,
                        format!("{}: more than {MAX_COMMIT_FILE_BYTES} bytes", f.path),
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn derive(api: &Api, input: &mut CommitInput) -> Result<Value, ToolError> {
        if input.parent_sha.is_none() {
            input.parent_sha = Some(branch_head(api, &input.repo, &input.branch).await?);
        }
        let files: Vec<Value> = input
            .files
            .iter()
            .map(|f| match &f.content {
                Some(c) => json!({"path": f.path, "bytes": c.len(), "sha256": sha256_hex(c.as_bytes())}),
                None => json!({"path": f.path, "delete": true}),
            })
            .collect();
        Ok(json!({"repo": input.repo, "branch": input.branch, "parent_sha": input.parent_sha, "files": files}))
    }

    async fn run(api: &Api, input: CommitInput) -> Result<ToolOutput, ToolError> {
        let repo = input.repo.as_str();
        let parent = input
            .parent_sha
            .clone()
            .ok_or_else(|| ToolError::new(ErrorCode::CorruptInput, "the frozen input has no parent_sha"))?;
        let head = branch_head(api, repo, &input.branch).await?;
        if head != parent {
            return Err(head_changed(repo, &input.branch, &parent, Some(&head)));
        }
        let rp = repo_path(repo);
        let commit = api.get(&format!("{rp}/git/commits/{parent}")).await?;
        let base_tree = commit.pointer("/tree/sha").and_then(Value::as_str).unwrap_or_default().to_owned();
        let tree: Vec<Value> = input
            .files
            .iter()
            .map(|f| match &f.content {
                Some(c) => json!({"path": f.path, "mode": "100644", "type": "blob", "content": c}),
                None => json!({"path": f.path, "mode": "100644", "type": "blob", "sha": null}),
            })
            .collect();
        let new_tree = api.json(Method::POST, &format!("{rp}/git/trees"), Some(&json!({"base_tree": base_tree, "tree": tree}))).await?;
        let tree_sha = new_tree.get("sha").and_then(Value::as_str).unwrap_or_default().to_owned();
        let new_commit = api
            .json(
                Method::POST,
                &format!("{rp}/git/commits"),
                Some(&json!({"message": input.message, "tree": tree_sha, "parents": [parent]})),
            )
            .await?;
        let commit_sha = new_commit.get("sha").and_then(Value::as_str).unwrap_or_default().to_owned();
        let body = json!({"sha": commit_sha, "force": false});
        let reply =
            api.send(Method::PATCH, &format!("{rp}/git/refs/heads/{}", path(&input.branch)), Some(&body), ACCEPT_JSON, MAX_RAW_BYTES).await?;
        if reply.status.as_u16() == 422 {
            return Err(head_changed(repo, &input.branch, &parent, None));
        }
        api.ok(reply)?;
        let paths: Vec<&str> = input.files.iter().map(|f| f.path.as_str()).collect();
        Ok(ToolOutput {
            output: json!({"repo": repo, "branch": input.branch, "commit_sha": commit_sha, "parent_sha": parent,
                "tree_sha": tree_sha, "files": paths}),
            evidence: vec![EvidenceDraft::of_text(
                "github_write",
                json!({"source": "github", "action": "commit", "repo": repo, "branch": input.branch,
                    "commit_sha": commit_sha, "parent_sha": parent, "connection_id": api.connection_id()}),
                &format!("committed {} file(s) on {}: {}", paths.len(), input.branch, paths.join(", ")),
            )],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_queries_are_checked() {
        assert!(check_path("src/main.rs").is_ok());
        assert!(check_path("").is_ok());
        assert!(check_path("docs/").is_ok());
        assert!(check_path("../etc").is_err());
        assert!(check_path("/abs").is_err());
        assert!(check_path("a//b").is_err());
        assert!(check_query("foo repo:other/x").is_err());
        assert!(check_query("foo -org:x").is_err());
        assert_eq!(scoped_query("sesame", Some("o/r")), "sesame repo:o/r");
    }
}
