-- terminal_session: which byte range of a session's output each action reported.
-- A session's "reported up to" offset is the largest end_offset among the reports whose
-- invocation completed (its result, which carries the range, is stored), so an action that
-- failed, was cancelled or was interrupted by a restart reports nothing and the next action
-- reports those bytes again.
CREATE TABLE terminal_reports (
    invocation_id  TEXT PRIMARY KEY,
    session_id     TEXT NOT NULL REFERENCES terminal_sessions(id) ON DELETE CASCADE,
    start_offset   BIGINT NOT NULL,
    end_offset     BIGINT NOT NULL
);
CREATE INDEX terminal_reports_session ON terminal_reports (session_id, end_offset);
