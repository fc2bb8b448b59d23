-- mcp_owners: which replica holds the process of a stdio MCP server (issue 16, replica-owned
-- resources). A stdio server is a child process of one `mira serve` replica: `node_id` is
-- that replica's data directory (its stable node id), `process_id` the process that claimed
-- it. `held` while that replica may run it; `lost` once that replica was declared dead (its
-- heartbeat stopped). Nobody takes a server over silently: a `lost` server, or one whose
-- replica is dead, moves to another replica only by an explicit connect
-- (POST /v1/mcp/servers/{id}/connect), one conditional UPDATE deciding. Streamable HTTP
-- servers have no row: every replica connects to them itself.
CREATE TABLE mcp_owners (
    server_id   TEXT PRIMARY KEY REFERENCES mcp_servers(id) ON DELETE CASCADE,
    node_id     TEXT NOT NULL,
    process_id  TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('held', 'lost')),
    since       TEXT NOT NULL
);
