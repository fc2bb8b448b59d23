-- Remote runners (docs/runner.md): a device is enrolled once with a one-time code (only its
-- SHA-256 is kept, with its expiry), then holds an Ed25519 public key. last_seen_at is the
-- last heartbeat of its runner; advertised is what the runner offered when it connected
-- (JSON: capabilities, tools, workspaces). A revoked device keeps its row (revoked_at set).
ALTER TABLE devices ADD COLUMN public_key TEXT;
ALTER TABLE devices ADD COLUMN enroll_code_sha256 TEXT;
ALTER TABLE devices ADD COLUMN enroll_expires_at TEXT;
ALTER TABLE devices ADD COLUMN enrolled_at TEXT;
ALTER TABLE devices ADD COLUMN revoked_at TEXT;
ALTER TABLE devices ADD COLUMN last_seen_at TEXT;
ALTER TABLE devices ADD COLUMN advertised TEXT;
CREATE UNIQUE INDEX devices_enroll_code ON devices(enroll_code_sha256);
