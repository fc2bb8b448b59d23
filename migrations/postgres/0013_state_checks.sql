-- Every state column accepts only the values its Rust enum names (crate::state), so a
-- typo or a hand-edited row is refused by the database, not only by the code that reads
-- it; 0/1 flags of the same tables accept only 0 and 1. Existing rows are kept as they are
-- (a row with a value outside these lists makes this migration fail, on purpose).
-- SQLite rebuilds its tables to add the same constraints, by the same names.
-- approvals.rule has been checked since 0009 (approvals_rule_check).
ALTER TABLE invocations ADD CONSTRAINT invocations_status_check CHECK (status IN ('awaiting_approval', 'queued', 'running', 'completed', 'failed', 'denied', 'expired', 'cancelled', 'interrupted'));
ALTER TABLE invocations ADD CONSTRAINT invocations_approval_required_check CHECK (approval_required IN (0, 1));
ALTER TABLE approvals ADD CONSTRAINT approvals_status_check CHECK (status IN ('pending', 'granted', 'denied', 'expired', 'cancelled'));
ALTER TABLE mcp_connections ADD CONSTRAINT mcp_connections_state_check CHECK (state IN ('connecting', 'connected', 'failed', 'disconnected'));
ALTER TABLE mcp_tools ADD CONSTRAINT mcp_tools_status_check CHECK (status IN ('ok', 'rejected', 'removed'));
ALTER TABLE mcp_tools ADD CONSTRAINT mcp_tools_schema_declared_check CHECK (schema_declared IN (0, 1));
ALTER TABLE terminal_sessions ADD CONSTRAINT terminal_sessions_state_check CHECK (state IN ('running', 'exited', 'killed', 'timed_out', 'reaped', 'lost', 'failed'));
