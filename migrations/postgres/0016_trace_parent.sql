-- The W3C trace context (`traceparent`) of the HTTP request that made an invocation runnable
-- (its freeze, or the grant of its approval), so that the harness, which runs off the request
-- path (possibly on another replica), parents its `execute_tool` span to it. A row exists only
-- for calls made while trace export was on. A table of its own rather than a column of
-- `invocations`: nothing is written or read when tracing is off, and the shape of
-- `invocations` (read with `SELECT *` by connections whose schema may predate a migration)
-- stays as it was.
CREATE TABLE invocation_traces (
    invocation_id TEXT PRIMARY KEY REFERENCES invocations(id) ON DELETE CASCADE,
    trace_parent  TEXT NOT NULL
);
