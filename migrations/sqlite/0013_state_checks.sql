-- no-transaction
-- Every state column accepts only the values its Rust enum names (crate::state), so a
-- typo or a hand-edited row is refused by the database, not only by the code that reads
-- it; 0/1 flags of the rebuilt tables accept only 0 and 1. Existing rows are kept as they
-- are (a row with a value outside these lists makes this migration fail, on purpose).
--
-- SQLite cannot add a CHECK constraint to a table, so each table is rebuilt: a new table
-- with the constraints, its rows copied, the old one dropped, the new one renamed, its
-- indexes created again (the 12 steps of https://www.sqlite.org/lang_altertable.html).
-- Foreign-key enforcement is switched off for the rebuild — which is why this migration
-- runs outside sqlx's transaction and opens its own — so that dropping a parent table
-- neither fails on nor cascades to the rows that refer to it (terminal chunks and reports,
-- evidence, approvals). Every table keeps its name, columns, keys and indexes.
-- Postgres adds the same constraints, by the same names, with ALTER TABLE.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

CREATE TABLE invocations_0013 (
    id                   TEXT PRIMARY KEY,
    run_id               TEXT NOT NULL REFERENCES runs(id),
    turn_id              TEXT NOT NULL REFERENCES turns(id),
    owner_id             TEXT NOT NULL REFERENCES users(id),
    tool_id              TEXT NOT NULL,
    tool_call_id         TEXT NOT NULL,
    input                TEXT NOT NULL,
    input_hash           TEXT NOT NULL,
    approval_required    INTEGER NOT NULL,
    status               TEXT NOT NULL,
    result               TEXT,
    claimed_by           TEXT,
    lease_until          TEXT,
    created_at           TEXT NOT NULL,
    updated_at           TEXT NOT NULL,
    started_at           TEXT,
    finished_at          TEXT,
    cancel_requested_at  TEXT,
    cancel_requested_by  TEXT,
    cancel_token_id      TEXT,
    UNIQUE (run_id, tool_call_id),
    CONSTRAINT invocations_status_check CHECK (status IN ('awaiting_approval', 'queued', 'running', 'completed', 'failed', 'denied', 'expired', 'cancelled', 'interrupted')),
    CONSTRAINT invocations_approval_required_check CHECK (approval_required IN (0, 1))
);
INSERT INTO invocations_0013 (id, run_id, turn_id, owner_id, tool_id, tool_call_id, input, input_hash,
        approval_required, status, result, claimed_by, lease_until, created_at, updated_at, started_at,
        finished_at, cancel_requested_at, cancel_requested_by, cancel_token_id)
    SELECT id, run_id, turn_id, owner_id, tool_id, tool_call_id, input, input_hash,
        approval_required, status, result, claimed_by, lease_until, created_at, updated_at, started_at,
        finished_at, cancel_requested_at, cancel_requested_by, cancel_token_id
    FROM invocations;
DROP TABLE invocations;
ALTER TABLE invocations_0013 RENAME TO invocations;
CREATE INDEX invocations_status ON invocations(status, id);
CREATE INDEX invocations_run ON invocations(run_id, id);

CREATE TABLE approvals_0013 (
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
    created_at        TEXT NOT NULL,
    rule              TEXT NOT NULL DEFAULT 'self_approval',
    rule_domain       TEXT,
    CONSTRAINT approvals_status_check CHECK (status IN ('pending', 'granted', 'denied', 'expired', 'cancelled')),
    CONSTRAINT approvals_rule_check CHECK (rule IN ('self_approval', 'four_eyes'))
);
INSERT INTO approvals_0013 (id, invocation_id, run_id, owner_id, tool_id, tool_call_id, input_hash, status,
        preview, reason, expires_at, decided_by, decided_token_id, decided_at, created_at, rule, rule_domain)
    SELECT id, invocation_id, run_id, owner_id, tool_id, tool_call_id, input_hash, status,
        preview, reason, expires_at, decided_by, decided_token_id, decided_at, created_at, rule, rule_domain
    FROM approvals;
DROP TABLE approvals;
ALTER TABLE approvals_0013 RENAME TO approvals;
CREATE INDEX approvals_owner_status ON approvals(owner_id, status, id);
CREATE INDEX approvals_expiry ON approvals(status, expires_at);
CREATE INDEX approvals_rule_status ON approvals(rule, status, id);

CREATE TABLE mcp_connections_0013 (
    server_id         TEXT PRIMARY KEY REFERENCES mcp_servers(id) ON DELETE CASCADE,
    state             TEXT NOT NULL,
    protocol_version  TEXT,
    server_info       TEXT,
    capabilities      TEXT,
    last_error        TEXT,
    stderr_tail       TEXT,
    attempts          INTEGER NOT NULL,
    connected_at      TEXT,
    discovered_at     TEXT,
    discovery_error   TEXT,
    updated_at        TEXT NOT NULL,
    CONSTRAINT mcp_connections_state_check CHECK (state IN ('connecting', 'connected', 'failed', 'disconnected'))
);
INSERT INTO mcp_connections_0013 (server_id, state, protocol_version, server_info, capabilities, last_error,
        stderr_tail, attempts, connected_at, discovered_at, discovery_error, updated_at)
    SELECT server_id, state, protocol_version, server_info, capabilities, last_error,
        stderr_tail, attempts, connected_at, discovered_at, discovery_error, updated_at
    FROM mcp_connections;
DROP TABLE mcp_connections;
ALTER TABLE mcp_connections_0013 RENAME TO mcp_connections;

CREATE TABLE mcp_tools_0013 (
    server_id        TEXT NOT NULL REFERENCES mcp_servers(id) ON DELETE CASCADE,
    name             TEXT NOT NULL,
    status           TEXT NOT NULL,
    rejection        TEXT,
    title            TEXT,
    description      TEXT,
    input_schema     TEXT,
    output_schema    TEXT,
    annotations      TEXT,
    discovered_at    TEXT NOT NULL,
    removed_at       TEXT,
    schema_dialect   TEXT,
    schema_declared  INTEGER,
    schema_problem   TEXT,
    review_previous  TEXT,
    review_since     TEXT,
    PRIMARY KEY (server_id, name),
    CONSTRAINT mcp_tools_status_check CHECK (status IN ('ok', 'rejected', 'removed')),
    CONSTRAINT mcp_tools_schema_declared_check CHECK (schema_declared IN (0, 1))
);
INSERT INTO mcp_tools_0013 (server_id, name, status, rejection, title, description, input_schema, output_schema,
        annotations, discovered_at, removed_at, schema_dialect, schema_declared, schema_problem, review_previous,
        review_since)
    SELECT server_id, name, status, rejection, title, description, input_schema, output_schema,
        annotations, discovered_at, removed_at, schema_dialect, schema_declared, schema_problem, review_previous,
        review_since
    FROM mcp_tools;
DROP TABLE mcp_tools;
ALTER TABLE mcp_tools_0013 RENAME TO mcp_tools;

CREATE TABLE terminal_sessions_0013 (
    id               TEXT PRIMARY KEY,
    owner_id         TEXT NOT NULL REFERENCES users(id),
    run_id           TEXT NOT NULL,
    invocation_id    TEXT NOT NULL,
    node_id          TEXT NOT NULL,
    command          TEXT NOT NULL,
    args             TEXT NOT NULL,
    cwd              TEXT NOT NULL,
    env              TEXT NOT NULL,
    cols             BIGINT NOT NULL,
    rows             BIGINT NOT NULL,
    timeout_ms       BIGINT NOT NULL,
    pid              BIGINT,
    pid_start        TEXT,
    state            TEXT NOT NULL,
    end_reason       TEXT,
    exit_code        BIGINT,
    signal           TEXT,
    bytes_out        BIGINT NOT NULL DEFAULT 0,
    retained_from    BIGINT NOT NULL DEFAULT 0,
    started_at       TEXT NOT NULL,
    ended_at         TEXT,
    CONSTRAINT terminal_sessions_state_check CHECK (state IN ('running', 'exited', 'killed', 'timed_out', 'reaped', 'lost', 'failed'))
);
INSERT INTO terminal_sessions_0013 (id, owner_id, run_id, invocation_id, node_id, command, args, cwd, env, cols,
        rows, timeout_ms, pid, pid_start, state, end_reason, exit_code, signal, bytes_out, retained_from,
        started_at, ended_at)
    SELECT id, owner_id, run_id, invocation_id, node_id, command, args, cwd, env, cols,
        rows, timeout_ms, pid, pid_start, state, end_reason, exit_code, signal, bytes_out, retained_from,
        started_at, ended_at
    FROM terminal_sessions;
DROP TABLE terminal_sessions;
ALTER TABLE terminal_sessions_0013 RENAME TO terminal_sessions;
CREATE INDEX terminal_sessions_owner ON terminal_sessions (owner_id, id);
CREATE INDEX terminal_sessions_state ON terminal_sessions (node_id, state);

COMMIT;
PRAGMA foreign_keys = ON;
