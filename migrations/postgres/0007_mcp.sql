-- External MCP servers: the six stages Install → Connect → Discover → Agent Access → Tool
-- Exposure → Approval, with "enabled" and "disclaimer accepted" along the way. Each stage's
-- stored fact lives here, so "where is this capability stuck" has a stored answer.

-- Install: one row per installed server. owner_id NULL = deployment-wide (installed and
-- managed by an admin, visible to every user). `config` is the transport without secret
-- values: {"stdio": {command, args, cwd, env: {NAME: {"source": "encrypted"|"env", "from_env"?}}}}
-- or {"http": {url, headers: {NAME: {...}}}}. `secrets` is the XChaCha20-Poly1305-sealed JSON
-- of the secret values ({"env": {...}, "headers": {...}}), bound to the server id and
-- sealed under the key whose id is `secrets_key_id`; it is never returned by the API.
CREATE TABLE mcp_servers (
    id                      TEXT PRIMARY KEY,
    owner_id                TEXT REFERENCES users(id),
    installed_by            TEXT NOT NULL REFERENCES users(id),
    name                    TEXT NOT NULL,
    transport               TEXT NOT NULL,
    config                  TEXT NOT NULL,
    secrets                 TEXT,
    secrets_key_id          TEXT,
    disclaimer              TEXT,
    disclaimer_accepted_at  TEXT,
    disclaimer_accepted_by  TEXT,
    enabled                 INTEGER NOT NULL,
    default_agent_access    INTEGER NOT NULL,
    request_timeout_ms      INTEGER NOT NULL,
    created_at              TEXT NOT NULL,
    updated_at              TEXT NOT NULL
);
CREATE INDEX mcp_servers_owner ON mcp_servers(owner_id, id);

-- Connect: the last known connection of each server (connecting|connected|failed|
-- disconnected), the negotiated protocol version, the server's implementation info and
-- capabilities (JSON), the last error and the tail of a stdio server's stderr.
CREATE TABLE mcp_connections (
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
    updated_at        TEXT NOT NULL
);

-- Discover: every tool a server listed (`status` ok), listed but refused (`rejected`, with
-- the reason: missing or non-object inputSchema, an invalid name…) or listed before and
-- dropped by the server since (`removed`). Definitions are kept as the server sent them.
CREATE TABLE mcp_tools (
    server_id      TEXT NOT NULL REFERENCES mcp_servers(id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    status         TEXT NOT NULL,
    rejection      TEXT,
    title          TEXT,
    description    TEXT,
    input_schema   TEXT,
    output_schema  TEXT,
    annotations    TEXT,
    discovered_at  TEXT NOT NULL,
    removed_at     TEXT,
    PRIMARY KEY (server_id, name)
);

-- Agent Access: the owner's per-tool switch. Kept apart from mcp_tools so that it survives
-- re-discovery, reconnects and a tool that disappears and comes back; a tool without a row
-- follows the server's default_agent_access.
CREATE TABLE mcp_agent_access (
    server_id   TEXT NOT NULL REFERENCES mcp_servers(id) ON DELETE CASCADE,
    tool_name   TEXT NOT NULL,
    enabled     INTEGER NOT NULL,
    updated_by  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (server_id, tool_name)
);
