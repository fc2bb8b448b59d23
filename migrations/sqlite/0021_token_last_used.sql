-- When each bearer token was last used to authenticate a request (RFC 3339), recorded at
-- most once a minute per token and replica (src/store/users.rs), shown by GET /v1/tokens.
ALTER TABLE tokens ADD COLUMN last_used_at TEXT;
