-- User connections of the dynamic capabilities (issue 18, docs/api.md "Connections"): a
-- GitHub account, a mail account… One row per connection. owner_id NULL = shared (made by an
-- admin, usable by every user). settings_json holds the kind's validated, non-secret settings;
-- the credential is a JSON object sealed with the server's secret box (key
-- credential_key_id, associated data = the connection id), never stored in the clear.
-- check_json is the last check's report (account, access per permission), checked_at when
-- it ran, next_check_at when the periodic check is due (a replica claims a due check by
-- moving it forward with a compare-and-set, so one replica checks), rate_limited_until the
-- end of a rate limit a call or check ran into.
CREATE TABLE connections (
    id                    TEXT PRIMARY KEY,
    owner_id              TEXT REFERENCES users(id) ON DELETE CASCADE,
    kind                  TEXT NOT NULL,
    name                  TEXT NOT NULL,
    settings_json         TEXT NOT NULL,
    credential_ciphertext TEXT NOT NULL,
    credential_key_id     TEXT NOT NULL,
    enabled               INTEGER NOT NULL,
    check_json            TEXT,
    checked_at            TEXT,
    next_check_at         TEXT NOT NULL,
    rate_limited_until    TEXT,
    created_at            TEXT NOT NULL,
    updated_at            TEXT NOT NULL
);
CREATE INDEX connections_owner ON connections(owner_id, kind);
