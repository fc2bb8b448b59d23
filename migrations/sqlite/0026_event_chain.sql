-- The hash chain of each run's events (docs/verify.md); see the Postgres migration of the
-- same number. On SQLite the server computes the link hashes itself (one writer at a time),
-- so there is no SQL function and no chain_base.
ALTER TABLE events ADD COLUMN content_hash TEXT;
ALTER TABLE events ADD COLUMN prev_hash TEXT;
ALTER TABLE events ADD COLUMN hash TEXT;
ALTER TABLE runs ADD COLUMN last_hash TEXT;
ALTER TABLE runs ADD COLUMN chain_from BIGINT NOT NULL DEFAULT 1;
UPDATE runs SET chain_from = event_seq + 1;
