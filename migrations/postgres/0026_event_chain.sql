-- The hash chain of each run's events (docs/verify.md). Every event stores the hash of its
-- content (computed by the server: SHA-256 of the RFC 8785 form of {created_at, data, run_id,
-- type}), the hash of the run's previous chained event and its own link hash. The run keeps
-- the hash of its last event (last_hash) beside its event counter, updated by the same
-- statement that hands out the event ids, so the previous hash is read under the per-run
-- ordering that assigns the sequence. chain_base (Postgres only; unused on SQLite, where the
-- single writer computes the links itself) is the last_hash before the latest append, what
-- the append's first event links to: an UPDATE's RETURNING sees only new values. chain_from
-- is the first event id that is chained: runs made before this migration keep their older
-- events unchained.
ALTER TABLE events ADD COLUMN content_hash TEXT;
ALTER TABLE events ADD COLUMN prev_hash TEXT;
ALTER TABLE events ADD COLUMN hash TEXT;
ALTER TABLE runs ADD COLUMN last_hash TEXT;
ALTER TABLE runs ADD COLUMN chain_base TEXT;
ALTER TABLE runs ADD COLUMN chain_from BIGINT NOT NULL DEFAULT 1;
UPDATE runs SET chain_from = event_seq + 1;

-- The link hashes of events first_seq, first_seq + 1, … with content hashes `contents`,
-- after the event whose hash is `prev` (NULL: none, the genesis of 64 zeros):
-- hash = sha256('mira-event-v1' LF prev LF seq LF content_hash), lowercase hex — the same
-- bytes as mira_core::chain::event_link.
CREATE FUNCTION mira_event_chain(prev TEXT, first_seq BIGINT, contents TEXT[]) RETURNS TEXT[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    h TEXT := COALESCE(prev, repeat('0', 64));
    out TEXT[] := '{}';
BEGIN
    FOR i IN 1 .. COALESCE(array_length(contents, 1), 0) LOOP
        h := encode(sha256(convert_to('mira-event-v1' || chr(10) || h || chr(10) || (first_seq + i - 1)::TEXT
                                      || chr(10) || contents[i], 'UTF8')), 'hex');
        out := out || h;
    END LOOP;
    RETURN out;
END
$$;
