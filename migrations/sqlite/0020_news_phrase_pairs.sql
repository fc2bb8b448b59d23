-- Nothing on SQLite: FTS5 indexes positions and answers phrases from its index (the
-- Postgres side of 0020 adds the adjacent-pair index its GIN index lacks).
SELECT 1;
