-- terminal_session: PTY sessions and their retained output (chunks, base64 text).
CREATE TABLE terminal_sessions (
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
    ended_at         TEXT
);
CREATE INDEX terminal_sessions_owner ON terminal_sessions (owner_id, id);
CREATE INDEX terminal_sessions_state ON terminal_sessions (node_id, state);

CREATE TABLE terminal_chunks (
    session_id    TEXT NOT NULL REFERENCES terminal_sessions(id) ON DELETE CASCADE,
    start_offset  BIGINT NOT NULL,
    end_offset    BIGINT NOT NULL,
    data          TEXT NOT NULL,
    PRIMARY KEY (session_id, start_offset)
);
