-- Token scopes: what each bearer token may do, its scope names separated by one space
-- (`plan`, `approve`, `manage`; src/auth.rs). Tokens made before this hold all three, as do
-- the tokens made with a user. `parent_token_id` is the token that made this one through
-- POST /v1/tokens (null for a user's first token and for tokens made before this): revoking
-- a token revokes the tokens it made, and theirs (src/store/cache.rs).
ALTER TABLE tokens ADD COLUMN scopes TEXT NOT NULL DEFAULT 'plan approve manage';
ALTER TABLE tokens ADD COLUMN parent_token_id TEXT;
CREATE INDEX tokens_parent ON tokens (parent_token_id);
