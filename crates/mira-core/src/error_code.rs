//! The catalogue of stable error codes: every `code` the API answers in its error body
//! (`{"error": {"code", "message", "details"}}`) and every `code` a tool error carries (at
//! freeze time as an HTTP error, during execution as the invocation's `result.error.code`).
//!
//! Each code has one HTTP status ([`ErrorCode::status`]) and one snake_case string
//! ([`ErrorCode::as_str`], also its serde and OpenAPI form). The server's `http::error` maps
//! an error to its response through the code. Codes that only end an execution (an invocation's
//! `result.error`) carry the status they would have at freeze time; the API never answers
//! them.
//!
//! Not here: the ladder's reason codes, the MCP stage codes, the News Hub fetch codes and the
//! stop outcomes, which describe a state rather than refuse a request.
//!
//! Self-contained (serde and utoipa only): the server re-exports it as `mira::error::code`.

use std::fmt;
use std::str::FromStr;

/// Declares [`ErrorCode`] from one table: variant, HTTP status, snake_case string.
macro_rules! catalogue {
    ($( $(#[doc = $doc:literal])* $variant:ident = ($status:literal, $code:literal), )*) => {
        /// A stable, machine-readable error code; each has one HTTP status (docs/api.md,
        /// Error codes).
        // The serde (and OpenAPI) name is the variant's snake_case, checked against the
        // table's string by a test.
        #[derive(
            Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            serde::Serialize, serde::Deserialize, utoipa::ToSchema,
        )]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $(
                $(#[doc = $doc])*
                $variant,
            )*
        }

        impl ErrorCode {
            /// Every code of the catalogue, ordered by status then name.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The snake_case string of the code, as the API writes it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The HTTP status (100–599) an error with this code is answered with.
            pub const fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                }
            }
        }
    };
}

catalogue! {
    /// A mail attachment (or all of a message's attachments together) larger than the limit,
    /// refused by its size before it is decoded or stored.
    AttachmentTooLarge = (400, "attachment_too_large"),
    /// A search provider that needs a base URL got none.
    BaseUrlRequired = (400, "base_url_required"),
    /// The file is binary.
    BinaryFile = (400, "binary_file"),
    /// The program is not found on `PATH`.
    CommandNotFound = (400, "command_not_found"),
    /// A search provider that needs an API key got none.
    CredentialRequired = (400, "credential_required"),
    /// The cwd is not a directory.
    CwdNotADirectory = (400, "cwd_not_a_directory"),
    /// The query is empty.
    EmptyQuery = (400, "empty_query"),
    /// CR, LF or another control character in a mail header field (subject, recipient,
    /// attachment name): refused instead of letting it start a new header.
    HeaderInjection = (400, "header_injection"),
    /// A mail address that does not parse as an RFC 5322 addr-spec (or is not ASCII).
    InvalidAddress = (400, "invalid_address"),
    /// An API key that is empty, too long or not printable.
    InvalidApiKey = (400, "invalid_api_key"),
    /// An environment variable name for an API key that is not allowed.
    InvalidApiKeyEnv = (400, "invalid_api_key_env"),
    /// A cursor that is no listing's `next_cursor`.
    InvalidCursor = (400, "invalid_cursor"),
    /// An environment variable name that is not valid.
    InvalidEnv = (400, "invalid_env"),
    /// A field that is out of range or not taken by this action.
    InvalidField = (400, "invalid_field"),
    /// A glob that does not compile.
    InvalidGlob = (400, "invalid_glob"),
    /// The MCP tool's arguments fail its input schema.
    InvalidInput = (400, "invalid_input"),
    /// A news source fetch interval out of range.
    InvalidInterval = (400, "invalid_interval"),
    /// A body that is empty or not JSON.
    InvalidJson = (400, "invalid_json"),
    /// An unknown query kind.
    InvalidKind = (400, "invalid_kind"),
    /// A `Last-Event-ID` that is not an event id of the run.
    InvalidLastEventId = (400, "invalid_last_event_id"),
    /// A name that is empty, too long or of characters not allowed.
    InvalidName = (400, "invalid_name"),
    /// A terminal output offset that is not a number or past the output so far.
    InvalidOffset = (400, "invalid_offset"),
    /// A path that is not valid (NUL, empty segment…).
    InvalidPath = (400, "invalid_path"),
    /// A path segment that does not parse or is not UTF-8.
    InvalidPathParameter = (400, "invalid_path_parameter"),
    /// A pattern that does not compile or is too long.
    InvalidPattern = (400, "invalid_pattern"),
    /// A query parameter that does not parse, an unknown one, a bad `limit` or `cursor`.
    InvalidQuery = (400, "invalid_query"),
    /// A range whose start is after its end, or out of the file.
    InvalidRange = (400, "invalid_range"),
    /// A body of the wrong shape, NUL in a string, invalid UTF-8 in a query, or a value out of range.
    InvalidRequest = (400, "invalid_request"),
    /// A site that is not a host name.
    InvalidSite = (400, "invalid_site"),
    /// A time that is not RFC 3339.
    InvalidTime = (400, "invalid_time"),
    /// A URL that does not parse or has a scheme not allowed.
    InvalidUrl = (400, "invalid_url"),
    /// The file is not valid UTF-16.
    InvalidUtf16 = (400, "invalid_utf16"),
    /// The file is not valid UTF-8.
    InvalidUtf8 = (400, "invalid_utf8"),
    /// A workspace path that does not resolve to a usable folder.
    InvalidWorkspacePath = (400, "invalid_workspace_path"),
    /// The path is a directory.
    IsADirectory = (400, "is_a_directory"),
    /// A field the action needs is missing.
    MissingField = (400, "missing_field"),
    /// A directory cannot move into itself.
    MoveIntoItself = (400, "move_into_itself"),
    /// The replacement is the same as the block.
    NoChange = (400, "no_change"),
    /// The path is not a directory.
    NotADirectory = (400, "not_a_directory"),
    /// NUL in a string the program would get.
    NulByte = (400, "nul_byte"),
    /// The path leaves the workspace (or has several hard links).
    OutsideWorkspace = (400, "outside_workspace"),
    /// Deleting a directory needs `recursive: true`.
    RecursiveRequired = (400, "recursive_required"),
    /// Source and destination are the same path.
    SamePath = (400, "same_path"),
    /// Too many levels of symbolic links.
    SymlinkLoop = (400, "symlink_loop"),
    /// The file's encoding is not handled.
    UnsupportedEncoding = (400, "unsupported_encoding"),
    /// Neither a regular file nor a directory.
    UnsupportedFileType = (400, "unsupported_file_type"),
    /// The workspace root itself is refused.
    WorkspaceRoot = (400, "workspace_root"),
    /// The runner's signed challenge or its session does not verify (unknown device, wrong key, expired challenge or session).
    DeviceAuthFailed = (401, "device_auth_failed"),
    /// The device enrollment code is unknown, already used or expired.
    EnrollmentCodeInvalid = (401, "enrollment_code_invalid"),
    /// No, a malformed or an unknown bearer token.
    Unauthorized = (401, "unauthorized"),
    /// The cwd is hidden by the sandbox.
    CwdHidden = (403, "cwd_hidden"),
    /// The cwd is outside what the sandbox lets the program see.
    CwdOutsideSandbox = (403, "cwd_outside_sandbox"),
    /// The device was revoked: its runner is refused and its tools are unavailable.
    DeviceRevoked = (403, "device_revoked"),
    /// The caller may not do this (admin-only actions).
    Forbidden = (403, "forbidden"),
    /// The requester of a four-eyes approval cannot grant it; at execution, the stored grant is not a valid second person's.
    FourEyesRequired = (403, "four_eyes_required"),
    /// A URL the server would fetch points inside the host's networks.
    InternalAddress = (403, "internal_address"),
    /// A connection limited to a list of repositories was asked to act on another one.
    RepositoryNotAllowed = (403, "repository_not_allowed"),
    /// The host cannot sandbox a non-admin's terminal.
    SandboxUnavailable = (403, "sandbox_unavailable"),
    /// The connection's credential lacks the scope or permission the tool needs (the scope
    /// is named in the message).
    ScopeMissing = (403, "scope_missing"),
    /// A non-admin referred to the server's environment (`from_env`).
    ServerEnvReference = (403, "server_env_reference"),
    /// The tab named is not one the attached browser's connection grants (`settings.tabs`): the
    /// attached-browser tools act only in the tabs the user chose.
    TabNotGranted = (403, "tab_not_granted"),
    /// The bearer token lacks the scope the action needs (`plan`, `approve` or `manage`;
    /// `details.needed` names it).
    TokenScopeMissing = (403, "token_scope_missing"),
    /// A non-admin asked for a workspace path outside the allowed roots.
    WorkspacePathNotAllowed = (403, "workspace_path_not_allowed"),
    /// The cwd does not exist.
    CwdNotFound = (404, "cwd_not_found"),
    /// The object (or a file) does not exist or is not the caller's.
    NotFound = (404, "not_found"),
    /// No such terminal session.
    TerminalSessionNotFound = (404, "terminal_session_not_found"),
    /// The route exists, not for this method.
    MethodNotAllowed = (405, "method_not_allowed"),
    /// The path already exists.
    AlreadyExists = (409, "already_exists"),
    /// The invocation is past its commit point.
    AlreadyRunning = (409, "already_running"),
    /// The approval was already decided.
    ApprovalDecided = (409, "approval_decided"),
    /// The approval expired.
    ApprovalExpired = (409, "approval_expired"),
    /// The approval names another invocation.
    ApprovalMismatch = (409, "approval_mismatch"),
    /// The base branch of a pull request moved, or the pull request now targets another base,
    /// since the merge was frozen: nothing was merged.
    BaseChanged = (409, "base_changed"),
    /// The block to replace is not in the file.
    BlockNotFound = (409, "block_not_found"),
    /// The managed browser's bound is reached: as many users' browser contexts
    /// (`--browser-max-contexts`) or tabs in one context (`--browser-max-tabs`) as allowed.
    BrowserLimit = (409, "browser_limit"),
    /// An expert's A2A agent card no longer has the SHA-256 (RFC 8785 canonical JSON) pinned
    /// in its connection's `settings.card_sha256`: nothing was sent; the user re-approves the
    /// card by pinning its new hash (also a ladder reason).
    CardChanged = (409, "card_changed"),
    /// A connection's settings or credential changed after the call was frozen (the approval
    /// bound the connection as it was then): nothing was done.
    ConnectionChanged = (409, "connection_changed"),
    /// The caller has the most search connections allowed.
    ConnectionLimit = (409, "connection_limit"),
    /// The MCP tool's definition listed now is not the one given.
    DefinitionChanged = (409, "definition_changed"),
    /// The move's destination is a directory.
    DestinationIsDirectory = (409, "destination_is_directory"),
    /// The branch or pull request head moved since the call was frozen (a merge or commit bound to
    /// the head SHA the approver saw): nothing was changed.
    HeadChanged = (409, "head_changed"),
    /// The invocation is not in a state that allows this.
    InvalidState = (409, "invalid_state"),
    /// The MCP server's tool discovery failed.
    McpDiscoveryFailed = (409, "mcp_discovery_failed"),
    /// The MCP server is not connected.
    McpNotConnected = (409, "mcp_not_connected"),
    /// The MCP server is disabled.
    McpServerDisabled = (409, "mcp_server_disabled"),
    /// The name is already used.
    NameTaken = (409, "name_taken"),
    /// The MCP server has no disclaimer to accept.
    NoDisclaimer = (409, "no_disclaimer"),
    /// The tool is available but not exposed in the turn.
    NotExposed = (409, "not_exposed"),
    /// GitHub will not merge the pull request (closed, already merged, conflicts, failing required checks).
    NotMergeable = (409, "not_mergeable"),
    /// The tool is registered but not on the public surface.
    NotPublic = (409, "not_public"),
    /// The tool is not registered (a refused freeze; at execution, the tool is gone).
    NotRegistered = (409, "not_registered"),
    /// The block occurs another number of times than expected.
    OccurrenceMismatch = (409, "occurrence_mismatch"),
    /// The sandbox the server can give is not the frozen one.
    SandboxChanged = (409, "sandbox_changed"),
    /// The caller has the most skills allowed.
    SkillLimit = (409, "skill_limit"),
    /// The news source is already registered.
    SourceExists = (409, "source_exists"),
    /// The caller has the most news sources allowed.
    SourceLimit = (409, "source_limit"),
    /// The news source is paused.
    SourcePaused = (409, "source_paused"),
    /// The MCP tool's definition changed since the call was frozen.
    StaleDefinition = (409, "stale_definition"),
    /// A browser element reference from a snapshot that is not the tab's latest, or from a page
    /// that changed (navigated, or its accessibility tree differs) since that snapshot: take a
    /// new snapshot; the reference is never re-resolved to another element.
    StaleSnapshot = (409, "stale_snapshot"),
    /// The target is not in the frozen state.
    StaleTarget = (409, "stale_target"),
    /// The terminal session has ended.
    TerminalSessionEnded = (409, "terminal_session_ended"),
    /// The most terminal sessions are open (`--terminal-max-sessions`).
    TerminalSessionLimit = (409, "terminal_session_limit"),
    /// The user has the most valid bearer tokens allowed; revoke one first.
    TokenLimit = (409, "token_limit"),
    /// The `tool_call_id` was already used in the turn for another call.
    ToolCallIdConflict = (409, "tool_call_id_conflict"),
    /// The path is not of the frozen type.
    TypeMismatch = (409, "type_mismatch"),
    /// The tool is public but not usable now (`details.ladder` has the reason).
    Unavailable = (409, "unavailable"),
    /// The workspace root is not the folder registered.
    WorkspaceChanged = (409, "workspace_changed"),
    /// A non-admin holds the most host workspaces a user may register (64).
    WorkspaceLimit = (409, "workspace_limit"),
    /// The folder is, contains or lies inside another user's workspace: a non-admin cannot
    /// register it, and a sandboxed terminal does not start in a workspace whose folder is
    /// also another user's.
    WorkspacePathTaken = (409, "workspace_path_taken"),
    /// A body larger than `--body-limit`.
    BodyTooLarge = (413, "body_too_large"),
    /// A run bundle (`GET /v1/runs/{id}/bundle`) larger than the server builds (64 MiB of
    /// records).
    BundleTooLarge = (413, "bundle_too_large"),
    /// A file larger than the tool handles.
    FileTooLarge = (413, "file_too_large"),
    /// A mail message larger than the tool reads.
    MessageTooLarge = (413, "message_too_large"),
    /// A run's task and context over the limit.
    TaskTooLarge = (413, "task_too_large"),
    /// A non-empty body whose `Content-Type` is not JSON.
    UnsupportedMediaType = (415, "unsupported_media_type"),
    /// No granted approval names this exact call.
    ApprovalRequired = (422, "approval_required"),
    /// The managed browser failed: it could not start, a DevTools command failed or timed
    /// out, or the element cannot be acted on (no box, not a select).
    BrowserError = (422, "browser_error"),
    /// The call was cancelled.
    Cancelled = (422, "cancelled"),
    /// The frozen input no longer parses.
    CorruptInput = (422, "corrupt_input"),
    /// The runner refused a job because its local policy does not give it that workspace folder.
    DeviceWorkspaceRefused = (422, "device_workspace_refused"),
    /// An external expert (A2A) answered with a failure: a JSON-RPC error, a non-success HTTP
    /// status, or a task that ended `failed`, `rejected` or `canceled`.
    ExpertError = (422, "expert_error"),
    /// An external expert's answer ended before a final task state (the stream was cut, or a
    /// limit on bytes, lines or time was reached): never reported as an answer; the partial
    /// text is kept, marked incomplete, in the error's details.
    ExpertIncomplete = (422, "expert_incomplete"),
    /// GitHub answered with an error other than those with their own code (a validation error, 5xx).
    GithubError = (422, "github_error"),
    /// The input fails the tool's JSON Schema.
    InputInvalid = (422, "input_invalid"),
    /// The server stopped.
    Interrupted = (422, "interrupted"),
    /// Another I/O error.
    IoError = (422, "io_error"),
    /// The person at the device declined the job at the runner's confirmation prompt (`--confirm`), or did not answer in time: nothing was run.
    JobDeclined = (422, "job_declined"),
    /// The runner refused a job whose expiry had passed.
    JobExpired = (422, "job_expired"),
    /// The runner refused a job whose input hash is not the hash of its canonical input.
    JobInputMismatch = (422, "job_input_mismatch"),
    /// The runner refused a job it had already received (same nonce or invocation): nothing ran again.
    JobReplayed = (422, "job_replayed"),
    /// The runner refused a job whose signature does not verify under the control plane key it pinned.
    JobSignatureInvalid = (422, "job_signature_invalid"),
    /// The runner refused a job addressed to another device.
    JobWrongDevice = (422, "job_wrong_device"),
    /// Another node took over the invocation.
    LeaseLost = (422, "lease_lost"),
    /// The mail server (IMAP or SMTP) answered with an error or an answer that does not parse.
    MailError = (422, "mail_error"),
    /// The SMTP server refused the message (at MAIL, RCPT or after its data): it was not sent.
    MailRejected = (422, "mail_rejected"),
    /// The MCP tool's result does not parse.
    McpBadResult = (422, "mcp_bad_result"),
    /// The connection to the MCP server was lost during the call.
    McpConnectionLost = (422, "mcp_connection_lost"),
    /// The MCP server answered with a protocol error.
    McpError = (422, "mcp_error"),
    /// The MCP message is too large.
    McpMessageTooLarge = (422, "mcp_message_too_large"),
    /// The MCP call timed out.
    McpTimeout = (422, "mcp_timeout"),
    /// The MCP tool answered with `isError`.
    McpToolError = (422, "mcp_tool_error"),
    /// No space left (or a quota or file size limit).
    NoSpace = (422, "no_space"),
    /// Past its commit point, the call did not finish within 60 s of a stop request.
    OutcomeUnknown = (422, "outcome_unknown"),
    /// The operating system refused access.
    PermissionDenied = (422, "permission_denied"),
    /// The search provider's answer does not parse.
    ProviderBadResponse = (422, "provider_bad_response"),
    /// Every engine of the search provider failed.
    ProviderEnginesFailed = (422, "provider_engines_failed"),
    /// The search provider answered with an HTTP error.
    ProviderError = (422, "provider_error"),
    /// The search provider answered 429.
    ProviderRateLimited = (422, "provider_rate_limited"),
    /// The search provider did not answer in time.
    ProviderTimeout = (422, "provider_timeout"),
    /// The program does not read its input.
    PtyInputBlocked = (422, "pty_input_blocked"),
    /// A PTY could not be opened.
    PtyOpenFailed = (422, "pty_open_failed"),
    /// Resizing the PTY failed.
    PtyResizeFailed = (422, "pty_resize_failed"),
    /// Writing to the PTY failed.
    PtyWriteFailed = (422, "pty_write_failed"),
    /// The caller's search rate limit passed.
    RateLimited = (422, "rate_limited"),
    /// The sandbox could not be prepared or applied.
    SandboxFailed = (422, "sandbox_failed"),
    /// The program could not be started.
    SpawnFailed = (422, "spawn_failed"),
    /// The execution time limit passed.
    Timeout = (422, "timeout"),
    /// The tool is no longer registered.
    ToolGone = (422, "tool_gone"),
    /// The resolved path changed.
    WorkspaceMoved = (422, "workspace_moved"),
    /// Too many wrong enrollment codes from this address, or from everyone (`Retry-After`
    /// says when to try again; a right code is refused too meanwhile).
    EnrollmentRateLimited = (429, "enrollment_rate_limited"),
    /// The server is building as many run bundles as it builds at once (2) and none finished
    /// within 10 s: try again later.
    TooManyBundles = (429, "too_many_bundles"),
    /// The caller already has `--max-streams-per-user` event streams open.
    TooManyStreams = (429, "too_many_streams"),
    /// The caller already has `--max-turns-per-user` turns in progress (each ranks the
    /// available tools); retry when one has its exposure.
    TooManyTurns = (429, "too_many_turns"),
    /// A bug or a store error other than unavailability (logged, never detailed).
    Internal = (500, "internal"),
    /// The user's attached browser is gone: it cannot be reached at its debugging endpoint, the
    /// connection to it closed, or no tab it grants is open (also a ladder reason); the tools
    /// return when the browser does. Also, once per user who had a context, the managed browser
    /// ended since their last call (killed by its memory limit, or crashed): the next call
    /// starts a fresh one.
    BrowserGone = (503, "browser_gone"),
    /// No Chromium binary is configured or found (`--browser-chromium`): the browser tools are
    /// `unavailable`.
    BrowserMissing = (503, "browser_missing"),
    /// The search connection was removed.
    ConnectionGone = (503, "connection_gone"),
    /// The connection cannot be reached (its server is down or refuses the connection).
    ConnectionUnreachable = (503, "connection_unreachable"),
    /// The search connection's credential cannot be read.
    CredentialUnavailable = (503, "credential_unavailable"),
    /// The device does not declare the capability the tool needs.
    DeviceLacksCapability = (503, "device_lacks_capability"),
    /// No runner is connected for the device.
    DeviceNotConnected = (503, "device_not_connected"),
    /// The device's runner is not connected now (its heartbeat lease ran out; `details.last_seen_at`).
    DeviceOffline = (503, "device_offline"),
    /// The code graph is being built.
    IndexBuilding = (503, "index_building"),
    /// The code graph could not be built.
    IndexFailed = (503, "index_failed"),
    /// The MCP server is not installed.
    McpServerNotInstalled = (503, "mcp_server_not_installed"),
    /// The MCP client is stopped.
    McpStopped = (503, "mcp_stopped"),
    /// The News Hub has no items yet.
    NewsHubEmpty = (503, "news_hub_empty"),
    /// The caller has no usable connection of the kind a tool needs (GitHub, mail…).
    NoConnection = (503, "no_connection"),
    /// No search provider is configured for the caller.
    NoSearchProvider = (503, "no_search_provider"),
    /// The replica that owns the resource (a terminal session, a stdio MCP server's process)
    /// stopped sending heartbeats: nothing ran. A session ends `lost` once that replica is
    /// declared dead; an MCP server waits for an explicit connect on a live replica.
    OwnerGone = (503, "owner_gone"),
    /// The replica that owns the resource runs but cannot be reached from this one (no
    /// `--cluster-secret`, or the forwarded request failed before it was sent).
    OwnerUnreachable = (503, "owner_unreachable"),
    /// Whether the connection's credential grants what a tool needs cannot be verified (not
    /// checked yet, or the server does not say); never treated as granted.
    PermissionUnknown = (503, "permission_unknown"),
    /// The search provider cannot be reached.
    ProviderUnreachable = (503, "provider_unreachable"),
    /// The connection's credential was refused (wrong, expired or revoked): the user must
    /// replace it.
    ReauthRequired = (503, "reauth_required"),
    /// A non-streaming request took longer than `--request-timeout-secs`.
    RequestTimeout = (503, "request_timeout"),
    /// The tool's input schema compiles in no JSON Schema dialect.
    SchemaUnusable = (503, "schema_unusable"),
    /// The server's secret key cannot be loaded.
    SecretKeyUnavailable = (503, "secret_key_unavailable"),
    /// The server is stopping.
    ServerStopping = (503, "server_stopping"),
    /// The store failed during a stream or a terminal action.
    StoreError = (503, "store_error"),
    /// The database cannot be reached.
    StoreUnavailable = (503, "store_unavailable"),
    /// The workspace root cannot be opened.
    WorkspaceUnavailable = (503, "workspace_unavailable"),
}

impl ErrorCode {
    /// The code whose string is `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.as_str() == s)
    }
}

/// The code's string, as the API writes it (so a debug print of an error shows
/// `index_building`, not the variant's name).
impl fmt::Debug for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is no code of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownErrorCode(pub String);

impl fmt::Display for UnknownErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not an error code of the catalogue", self.0)
    }
}

impl std::error::Error for UnknownErrorCode {}

impl FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s).ok_or_else(|| UnknownErrorCode(s.to_owned()))
    }
}

impl PartialEq<str> for ErrorCode {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_unique_snake_case_and_match_serde() {
        let mut seen = std::collections::BTreeSet::new();
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{s}");
            assert_eq!(serde_json::to_value(code).ok(), Some(serde_json::Value::String(s.to_owned())));
            assert_eq!(serde_json::from_value::<ErrorCode>(serde_json::json!(s)).ok(), Some(*code));
            assert_eq!(s.parse::<ErrorCode>().ok(), Some(*code));
            assert!((400..600).contains(&code.status()), "{s}: {}", code.status());
        }
        assert!("no_such_code".parse::<ErrorCode>().is_err());
        assert_eq!(format!("{:?}", ErrorCode::IndexBuilding), "index_building");
    }

    #[test]
    fn all_is_ordered_by_status_then_name() {
        let keys: Vec<_> = ErrorCode::ALL.iter().map(|c| (c.status(), c.as_str())).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        assert_eq!(keys, sorted);
    }
}
