//! GitHub: the dynamic capabilities of a user's GitHub connection (REST API v3, GitHub.com or
//! GitHub Enterprise through the connection's `base_url`).
//!
//! * [`driver`] is the connection kind `github`: settings (`base_url`, optional
//!   `repositories` allowlist of `owner/repo`), credentials (a personal access token, classic
//!   or fine-grained, or a GitHub App installation) and the check that reports each permission
//!   ([`PERMISSIONS`]) from the real grant — classic tokens' `X-OAuth-Scopes`, an App
//!   installation's `permissions`, and probes for fine-grained tokens; what cannot be verified
//!   is `unknown`, never granted.
//! * [`register`] adds one tool per action (contents, issues, pull requests, Actions). Reads run
//!   without approval; every write needs the exact approval of its canonical input, which names
//!   the connection and the exact target (`owner/repo`, number, branch, head SHA, contents).
//! * Every call is limited to the connection's repository allowlist, in `prepare` and again in
//!   `execute` (`repository_not_allowed`).
//! * Text read from GitHub (files, issue and pull request bodies, comments, diffs, job logs) is
//!   evidence with `provenance.trust = "third_party"`: untrusted text.
//!
//! HTTP goes through `octocrab` (its request plumbing and GitHub App installation tokens) over
//! the project's own `reqwest` client (rustls with ring, no redirects), with every body read
//! under a byte cap. Responses are read as JSON values and projected onto the tools' outputs,
//! so a field GitHub adds or a mock leaves out does not break a call.

pub mod actions;
pub mod api;
pub mod contents;
pub mod driver;
pub mod issues;
pub mod pulls;

use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::availability::{Availability, AvailabilityContext};
use crate::connections::{ConnectionHub, ConnectionKind, FINGERPRINT_KEY};
use crate::error::ErrorCode;
use crate::evidence::EvidenceDraft;
use crate::registry::{
    ExecContext, PrepareContext, Prepared, Registry, RegistryError, Tool, ToolError, ToolKind, ToolOutput, ToolSpec,
};
use crate::tools::{ToolDeps, input};

pub use api::Api;

/// Every permission a GitHub connection reports, with what it allows.
pub const PERMISSIONS: &[(&str, &str)] = &[
    ("contents:read", "read files and trees, search code"),
    ("contents:write", "create branches, commit file changes, merge pull requests"),
    ("issues:read", "search and read issues and their comments"),
    ("issues:write", "create issues, comment, close or reopen, add labels"),
    ("pull_requests:read", "list and read pull requests with their diff and checks"),
    ("pull_requests:write", "create and review pull requests"),
    ("actions:read", "list workflow runs, read a run with its job logs"),
    ("actions:write", "re-run a workflow run"),
];

/// The driver of the `github` connection kind.
pub fn driver() -> Arc<dyn crate::connections::Driver> {
    Arc::new(driver::GithubDriver)
}

/// Registers every GitHub tool (kind `dynamic`, domain `github`) and declares what each needs
/// of a connection.
pub fn register(registry: &Registry, deps: &ToolDeps) -> Result<(), RegistryError> {
    let hub = &deps.connections;
    let tools = [
        entry::<contents::ReadContents>(hub),
        entry::<contents::SearchCode>(hub),
        entry::<contents::CreateBranch>(hub),
        entry::<contents::CommitFiles>(hub),
        entry::<issues::SearchIssues>(hub),
        entry::<issues::ReadIssue>(hub),
        entry::<issues::CreateIssue>(hub),
        entry::<issues::CommentIssue>(hub),
        entry::<issues::SetIssueState>(hub),
        entry::<issues::LabelIssue>(hub),
        entry::<pulls::ListPulls>(hub),
        entry::<pulls::ReadPull>(hub),
        entry::<pulls::CreatePull>(hub),
        entry::<pulls::ReviewPull>(hub),
        entry::<pulls::MergePull>(hub),
        entry::<actions::ListRuns>(hub),
        entry::<actions::ReadRun>(hub),
        entry::<actions::RerunRun>(hub),
    ];
    for (tool, permission) in tools {
        let id = tool.spec().id.clone();
        registry.register(tool)?;
        hub.declare_need(&id, ConnectionKind::Github, permission);
    }
    Ok(())
}

/// The tool of action `A` and the permission it needs.
fn entry<A: Action>(hub: &Arc<ConnectionHub>) -> (Arc<dyn Tool>, &'static str) {
    (GithubTool::<A>::new(hub), A::PERMISSION)
}

/// Longest text of one piece of content (a file, an issue body, a diff, a log) put into an
/// output, in bytes; longer text is cut with `truncated: true`.
pub const MAX_TEXT_BYTES: usize = 128 * 1024;

/// Most items of a list or search output.
pub const MAX_ITEMS: u64 = 100;

/// Checks an `owner/repo` name as GitHub spells them: owner 1–39 of `[A-Za-z0-9-]` not
/// starting with `-`, repository 1–100 of `[A-Za-z0-9._-]`, not `.` or `..`
/// (`invalid_field` otherwise).
pub fn check_repo(repo: &str) -> Result<(), ToolError> {
    let valid = match repo.split_once('/') {
        Some((owner, name)) => {
            (1..=39).contains(&owner.len())
                && !owner.starts_with('-')
                && owner.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && (1..=100).contains(&name.len())
                && name != "."
                && name != ".."
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => false,
    };
    if !valid {
        return Err(ToolError::new(ErrorCode::InvalidField, format!("repo {repo:?} is not an owner/repository name")));
    }
    Ok(())
}

/// Checks a branch name by git's rules for ref names (`git check-ref-format --branch`).
pub fn check_branch(branch: &str) -> Result<(), ToolError> {
    let bad = branch.is_empty()
        || branch.len() > 255
        || branch.starts_with('-')
        || branch.starts_with('/')
        || branch.ends_with('/')
        || branch.ends_with('.')
        || branch.ends_with(".lock")
        || branch.contains("..")
        || branch.contains("//")
        || branch.contains("@{")
        || branch == "@"
        || branch.split('/').any(|c| c.starts_with('.'))
        || branch.chars().any(|c| c.is_ascii_control() || " ~^:?*[\\".contains(c) || c == '\u{7f}');
    if bad {
        return Err(ToolError::new(ErrorCode::InvalidField, format!("{branch:?} is not a valid branch name")));
    }
    Ok(())
}

/// Checks a full commit SHA (40 lowercase hex digits after lowercasing).
pub fn check_sha(field: &str, sha: &str) -> Result<String, ToolError> {
    let sha = sha.to_ascii_lowercase();
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ToolError::new(ErrorCode::InvalidField, format!("{field} must be a full 40-digit commit SHA")));
    }
    Ok(sha)
}

/// Whether `repo` is allowed by the connection's settings (`repositories`: absent = any).
/// Compared case-insensitively, as GitHub compares names.
pub fn allowed(settings: &Value, repo: &str) -> bool {
    match settings.get("repositories").and_then(Value::as_array) {
        None => true,
        Some(list) => list.iter().filter_map(Value::as_str).any(|r| r.eq_ignore_ascii_case(repo)),
    }
}

/// `repository_not_allowed` unless the connection allows `repo`.
pub fn require_allowed(conn_id: &str, settings: &Value, repo: &str) -> Result<(), ToolError> {
    if allowed(settings, repo) {
        Ok(())
    } else {
        Err(ToolError::new(
            ErrorCode::RepositoryNotAllowed,
            format!("connection {conn_id} is limited to its repositories setting, which does not list {repo}"),
        )
        .with_details(json!({"repo": repo, "connection": conn_id})))
    }
}

/// `text` cut to at most `max` bytes on a character boundary, and whether it was cut.
pub fn cut(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

/// The last `max` bytes of `text` (on a character boundary), and whether it was cut.
pub fn tail(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    (text[start..].to_owned(), true)
}

/// Evidence of text read from GitHub: untrusted third-party content.
pub fn third_party(kind: &str, api: &Api, repo: &str, mut provenance: Value, text: &str) -> EvidenceDraft {
    if let Value::Object(p) = &mut provenance {
        p.insert("source".into(), json!("github"));
        p.insert("trust".into(), json!("third_party"));
        p.insert("repo".into(), json!(repo));
        p.insert("connection_id".into(), json!(api.connection_id()));
    }
    EvidenceDraft::of_text(kind, provenance, text)
}

/// A tool input's connection and target repository.
pub trait Targeted {
    /// The optional `connection` field (filled with the resolved id in the canonical input).
    fn connection_mut(&mut self) -> &mut Option<String>;
    /// The `owner/repo` the call acts on (None: a search over everything the token sees).
    fn repo(&self) -> Option<&str>;
}

/// Implements [`Targeted`] for an input with `connection` and `repo: String` (or
/// `repo: Option<String>` with `opt`).
macro_rules! targeted {
    ($t:ty) => {
        impl $crate::tools::github::Targeted for $t {
            fn connection_mut(&mut self) -> &mut Option<String> {
                &mut self.connection
            }
            fn repo(&self) -> Option<&str> {
                Some(self.repo.as_str())
            }
        }
    };
    ($t:ty, opt) => {
        impl $crate::tools::github::Targeted for $t {
            fn connection_mut(&mut self) -> &mut Option<String> {
                &mut self.connection
            }
            fn repo(&self) -> Option<&str> {
                self.repo.as_deref()
            }
        }
    };
}
pub(crate) use targeted;

/// One GitHub action: its input type, what it needs, and how it runs.
#[async_trait]
pub trait Action: Send + Sync + 'static {
    /// The input (also the canonical input, with `connection` and derived fields filled).
    type Input: DeserializeOwned + Serialize + JsonSchema + Targeted + Send + Sync + 'static;
    /// Tool id.
    const ID: &'static str;
    /// Short title.
    const TITLE: &'static str;
    /// What the tool does, for the model.
    const DESCRIPTION: &'static str;
    /// The permission ([`PERMISSIONS`]) a connection must grant.
    const PERMISSION: &'static str;
    /// Whether it changes anything (then every call needs an exact approval).
    const WRITE: bool;
    /// Fields `prepare` derives from the world (a branch's head SHA): carried over from the
    /// frozen input on a replay.
    const DERIVED: &'static [&'static str] = &[];

    /// Checks and normalises the input without I/O (names, ranges, defaults).
    fn check(_input: &mut Self::Input) -> Result<(), ToolError> {
        Ok(())
    }

    /// Fills the derived fields from GitHub at freeze time; returns the approval preview.
    async fn derive(_api: &Api, _input: &mut Self::Input) -> Result<Value, ToolError> {
        Ok(Value::Null)
    }

    /// Runs the frozen input.
    async fn run(api: &Api, input: Self::Input) -> Result<ToolOutput, ToolError>;
}

/// A registry tool over an [`Action`].
pub struct GithubTool<A: Action> {
    spec: ToolSpec,
    hub: Arc<ConnectionHub>,
    _action: PhantomData<fn() -> A>,
}

impl<A: Action> GithubTool<A> {
    /// The tool over the connections of `hub`.
    pub fn new(hub: &Arc<ConnectionHub>) -> Arc<Self> {
        Arc::new(Self {
            spec: ToolSpec {
                id: A::ID.into(),
                kind: ToolKind::Dynamic,
                domain: "github".into(),
                title: A::TITLE.into(),
                description: format!(
                    "{} Optional `connection`: the id of the GitHub connection to use (default: your first usable \
                     one). (needs {})",
                    A::DESCRIPTION,
                    A::PERMISSION
                ),
                input_schema: input::schema_of::<A::Input>(),
                requires_approval: A::WRITE,
                capability: Some("net".into()),
                replacement: None,
                owner: None,
            },
            hub: Arc::clone(hub),
            _action: PhantomData,
        })
    }

    fn parse(&self, raw: &Value) -> Result<A::Input, ToolError> {
        let mut input: A::Input = input::parse(raw)?;
        if let Some(repo) = input.repo() {
            check_repo(repo)?;
        }
        A::check(&mut input)?;
        Ok(input)
    }

    fn canonical(input: &A::Input) -> Result<Value, ToolError> {
        serde_json::to_value(input)
            .map_err(|e| ToolError::new(ErrorCode::Internal, format!("the canonical input does not serialise: {e}")))
    }

    /// Opens the connection of a frozen or prepared call (still the one frozen: `fingerprint`,
    /// as stored now, not as this replica last loaded it) and checks the allowlist.
    async fn api(&self, user_id: &str, input: &mut A::Input, fingerprint: Option<&str>) -> Result<Api, ToolError> {
        let Some(id) = input.connection_mut().clone() else {
            return Err(ToolError::new(ErrorCode::CorruptInput, "the frozen input names no connection"));
        };
        let opened =
            self.hub.open_frozen_current(user_id, &id, fingerprint, ConnectionKind::Github, A::PERMISSION).await?;
        match input.repo() {
            Some(repo) => require_allowed(&opened.id, &opened.settings, repo)?,
            None if opened.settings.get("repositories").is_some() => {
                return Err(ToolError::new(
                    ErrorCode::RepositoryNotAllowed,
                    format!("connection {} is limited to its repositories setting: name one with repo", opened.id),
                ));
            }
            None => {}
        }
        Api::new(opened, Arc::clone(&self.hub), A::PERMISSION)
    }
}

#[async_trait]
impl<A: Action> Tool for GithubTool<A> {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn availability(&self, ctx: &AvailabilityContext) -> Availability {
        self.hub.availability(&ctx.user_id, ConnectionKind::Github, A::PERMISSION)
    }

    async fn prepare(&self, input: Value, ctx: &PrepareContext<'_>) -> Result<Prepared, ToolError> {
        let mut input = self.parse(&input)?;
        let requested = input.connection_mut().clone();
        let resolved = self.hub.resolve(ctx.owner_id, ConnectionKind::Github, A::PERMISSION, requested.as_deref())?;
        *input.connection_mut() = Some(resolved.id);
        let api = self.api(ctx.owner_id, &mut input, Some(&resolved.fingerprint)).await?;
        let preview = A::derive(&api, &mut input).await?;
        let mut canonical = Self::canonical(&input)?;
        if let Some(o) = canonical.as_object_mut() {
            o.insert(FINGERPRINT_KEY.into(), Value::String(resolved.fingerprint));
        }
        Ok(Prepared { input: canonical, preview })
    }

    async fn canonicalize(&self, input: Value, _ctx: &PrepareContext<'_>) -> Result<Value, ToolError> {
        // The pure part: the connection and derived fields come from the frozen input
        // (`replay_input`), so a replay does not depend on the connection's state now.
        let input = self.parse(&input)?;
        Self::canonical(&input)
    }

    fn replay_input(&self, mut canonical: Value, frozen: &Value) -> Value {
        if let (Value::Object(c), Value::Object(f)) = (&mut canonical, frozen) {
            for key in ["connection", FINGERPRINT_KEY].into_iter().chain(A::DERIVED.iter().copied()) {
                let given = c.get(key).is_some_and(|v| !v.is_null());
                if let (false, Some(v)) = (given, f.get(key)) {
                    c.insert(key.to_owned(), v.clone());
                }
            }
        }
        canonical
    }

    async fn execute(&self, input: &Value, ctx: &ExecContext) -> Result<ToolOutput, ToolError> {
        // The fingerprint is the hub's, not the action's: parsed apart.
        let mut frozen = input.clone();
        let fingerprint = frozen.as_object_mut().and_then(|o| o.remove(FINGERPRINT_KEY));
        let mut input: A::Input = input::frozen(&frozen)?;
        let api = self.api(&ctx.owner_id, &mut input, fingerprint.as_ref().and_then(Value::as_str)).await?;
        if A::WRITE {
            // A write is not abandoned half-way: it ends within the client's timeout.
            return A::run(&api, input).await;
        }
        tokio::select! {
            () = ctx.cancel.cancelled() => Err(ToolError::new(ErrorCode::Cancelled, "the call was cancelled")),
            out = A::run(&api, input) => out,
        }
    }
}
