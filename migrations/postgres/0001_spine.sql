-- The spine: users and their tokens, devices and workspaces, runs with their turns
-- (each turn stores the exact exposure the model saw), frozen invocations, approvals,
-- evidence and the per-run event log. Times are RFC 3339 UTC text with millisecond
-- precision (fixed width, so text order is time order); JSON documents are text.
-- Ids are prefixed UUIDv7 strings, so id order is creation order.

-- A person or service that owns runs. Admins may create users and workspaces.
CREATE TABLE users (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    is_admin    BIGINT NOT NULL DEFAULT 0,
    created_at  TEXT NOT NULL
);

-- Bearer tokens, stored only as the lowercase hex SHA-256 of the token text.
CREATE TABLE tokens (
    id            TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL REFERENCES users(id),
    token_sha256  TEXT NOT NULL UNIQUE,
    label         TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    revoked_at    TEXT
);

-- Devices a user's work can run on; `capabilities` is a JSON array of strings.
CREATE TABLE devices (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL REFERENCES users(id),
    name          TEXT NOT NULL,
    capabilities  TEXT NOT NULL,
    created_at    TEXT NOT NULL
);

-- A workspace is a root folder on a device. owner_id NULL = deployment-wide
-- (for example the default workspace given to `mira serve --workspace`).
CREATE TABLE workspaces (
    id          TEXT PRIMARY KEY,
    owner_id    TEXT REFERENCES users(id),
    name        TEXT NOT NULL,
    path        TEXT NOT NULL,
    device_id   TEXT,
    created_at  TEXT NOT NULL
);
CREATE UNIQUE INDEX workspaces_default ON workspaces(name) WHERE owner_id IS NULL;

-- A run is one agent task. event_seq is the last event id handed out for the run.
CREATE TABLE runs (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL REFERENCES users(id),
    workspace_id  TEXT NOT NULL REFERENCES workspaces(id),
    device_id     TEXT,
    title         TEXT,
    event_seq     BIGINT NOT NULL DEFAULT 0,
    created_at    TEXT NOT NULL
);
CREATE INDEX runs_owner ON runs(owner_id, id);

-- A turn is one Planner step; `exposure` is the JSON the model was shown, verbatim.
CREATE TABLE turns (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs(id),
    owner_id    TEXT NOT NULL REFERENCES users(id),
    task        TEXT NOT NULL,
    context     TEXT,
    exposure    TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX turns_run ON turns(run_id, id);

-- A frozen invocation: never changes after insert except its status and result.
-- (run_id, tool_call_id) is unique: a call id names exactly one frozen call per run.
CREATE TABLE invocations (
    id                 TEXT PRIMARY KEY,
    run_id             TEXT NOT NULL REFERENCES runs(id),
    turn_id            TEXT NOT NULL REFERENCES turns(id),
    owner_id           TEXT NOT NULL REFERENCES users(id),
    tool_id            TEXT NOT NULL,
    tool_call_id       TEXT NOT NULL,
    input              TEXT NOT NULL,
    input_hash         TEXT NOT NULL,
    approval_required  BIGINT NOT NULL,
    status             TEXT NOT NULL,
    result             TEXT,
    claimed_by         TEXT,
    lease_until        TEXT,
    created_at         TEXT NOT NULL,
    updated_at         TEXT NOT NULL,
    started_at         TEXT,
    finished_at        TEXT,
    UNIQUE (run_id, tool_call_id)
);
CREATE INDEX invocations_status ON invocations(status, id);
CREATE INDEX invocations_run ON invocations(run_id, id);

-- One approval request per invocation that needs one. The triple is copied from the
-- invocation; a grant must match both. decided_token_id names the token that decided.
CREATE TABLE approvals (
    id                TEXT PRIMARY KEY,
    invocation_id     TEXT NOT NULL UNIQUE REFERENCES invocations(id),
    run_id            TEXT NOT NULL REFERENCES runs(id),
    owner_id          TEXT NOT NULL REFERENCES users(id),
    tool_id           TEXT NOT NULL,
    tool_call_id      TEXT NOT NULL,
    input_hash        TEXT NOT NULL,
    status            TEXT NOT NULL,
    preview           TEXT,
    reason            TEXT,
    expires_at        TEXT NOT NULL,
    decided_by        TEXT,
    decided_token_id  TEXT,
    decided_at        TEXT,
    created_at        TEXT NOT NULL
);
CREATE INDEX approvals_owner_status ON approvals(owner_id, status, id);
CREATE INDEX approvals_expiry ON approvals(status, expires_at);

-- Citable facts produced by tool results, with the Planner's acceptance.
CREATE TABLE evidence (
    id               TEXT PRIMARY KEY,
    run_id           TEXT NOT NULL REFERENCES runs(id),
    invocation_id    TEXT NOT NULL REFERENCES invocations(id),
    owner_id         TEXT NOT NULL REFERENCES users(id),
    tool_id          TEXT NOT NULL,
    kind             TEXT NOT NULL,
    provenance       TEXT NOT NULL,
    content_sha256   TEXT NOT NULL,
    excerpt          TEXT NOT NULL,
    created_at       TEXT NOT NULL,
    accepted         BIGINT,
    acceptance_note  TEXT,
    accepted_at      TEXT,
    accepted_by      TEXT
);
CREATE INDEX evidence_run ON evidence(run_id, id);
CREATE INDEX evidence_invocation ON evidence(invocation_id);

-- The run's event log. Every event is stored here before it is broadcast; seq is the
-- SSE id, monotonic per run.
CREATE TABLE events (
    run_id      TEXT NOT NULL REFERENCES runs(id),
    seq         BIGINT NOT NULL,
    type        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
