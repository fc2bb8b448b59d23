-- Which replica holds a device runner's live connection (issue 17 in a cluster,
-- docs/runner.md "Reconnecting"). A runner keeps one streaming connection to one replica:
-- holder_node_id is that replica's stable node id, holder_process_id its process (the
-- replicas row says whether that process still beats), session_sha256 the SHA-256 of the
-- connection's session token (the token itself is never stored), so that a heartbeat or a
-- result landing on another replica reaches the holder. A newer connection replaces all
-- three; a connection that ends clears them (only while they are still its own).
ALTER TABLE devices ADD COLUMN holder_node_id TEXT;
ALTER TABLE devices ADD COLUMN holder_process_id TEXT;
ALTER TABLE devices ADD COLUMN session_sha256 TEXT;
CREATE UNIQUE INDEX devices_session ON devices(session_sha256);
-- Connect challenges of runners (valid once for 60 s), in the store so that a runner's
-- challenge and its connect may land on different replicas. Only the SHA-256 is kept; a
-- connect spends its challenge with one conditional DELETE.
CREATE TABLE runner_challenges (
    challenge_sha256 TEXT PRIMARY KEY,
    device_id        TEXT NOT NULL REFERENCES devices(id) ON DELETE CASCADE,
    expires_at       TEXT NOT NULL
);
