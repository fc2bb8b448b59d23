-- News search, phrases: the GIN index over `news_items.search` knows which items hold a
-- lexeme but not where, so `"a b"` (`'a' <-> 'b'`) read every item holding both words
-- (thousands for two common words at 100k items) to check positions. `phrase_pairs` holds
-- the pairs of lexemes at adjacent positions of the item's vector, each hashed into one of
-- 2^20 keys, with a GIN index: a phrase's pairs (src/store/news_query.rs: phrase_pairs)
-- find the few candidates first and `@@` decides (a shared key only adds a candidate).
-- The column is computed from the same vectors as `search` (weights do not move
-- positions), so the pairs follow the positions `@@` reads.
CREATE FUNCTION news_pair_keys(v tsvector) RETURNS int4[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(pg_catalog.array_agg(DISTINCT pg_catalog.hashtext(a.lexeme || ' ' || b.lexeme) & 1048575), '{}')
    FROM (SELECT t.lexeme, pg_catalog.unnest(t.positions) AS p FROM pg_catalog.unnest(v) AS t) a
    JOIN (SELECT t.lexeme, pg_catalog.unnest(t.positions) AS p FROM pg_catalog.unnest(v) AS t) b
      ON b.p = a.p + 1
$$;

-- The keys of a query's pairs (a JSON array of "x y" strings): immutable, so a search
-- planned with its actual values gets them as a constant.
CREATE FUNCTION news_pair_hashes(pairs text) RETURNS int4[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(pg_catalog.array_agg(pg_catalog.hashtext(p) & 1048575), '{}')
    FROM pg_catalog.json_array_elements_text(pairs::pg_catalog.json) AS p
$$;

ALTER TABLE news_items ADD COLUMN phrase_pairs int4[] GENERATED ALWAYS AS (
    news_pair_keys(to_tsvector('english', title) || to_tsvector('english', summary) || to_tsvector('english', content))
) STORED;
CREATE INDEX news_items_pairs ON news_items USING GIN (phrase_pairs);
