-- Search: web search provider connections (per user; deployment-wide ones come from the
-- server's flags and environment and are not stored), and the News Hub: feed sources, their
-- collected items, and a full-text index over the items (FTS5 here, tsvector on Postgres).
-- Times are RFC 3339 UTC text with millisecond precision, as in 0001.

-- A user's connection to a web search provider (`searxng`, `brave`, `tavily`). The credential
-- is either absent (`none`), encrypted at rest (`encrypted`: base64 of the 24-byte
-- XChaCha20-Poly1305 nonce followed by the ciphertext and tag, bound to the row id as
-- associated data; `credential_key_id` names the key that sealed it), or the name of a server
-- environment variable (`env`). The API never returns the credential.
CREATE TABLE search_connections (
    id                     TEXT PRIMARY KEY,
    owner_id               TEXT NOT NULL REFERENCES users(id),
    provider               TEXT NOT NULL,
    name                   TEXT NOT NULL,
    base_url               TEXT NOT NULL,
    credential_kind        TEXT NOT NULL,
    credential_ciphertext  TEXT,
    credential_key_id      TEXT,
    credential_env         TEXT,
    enabled                INTEGER NOT NULL DEFAULT 1,
    created_at             TEXT NOT NULL,
    updated_at             TEXT NOT NULL
);
CREATE INDEX search_connections_owner ON search_connections(owner_id, id);

-- A feed (RSS 2.0, Atom or JSON Feed) the collector fetches every `interval_secs`.
-- owner_id NULL = deployment-wide (added by an admin), visible to every user.
-- `next_fetch_at` doubles as the claim: a collector owns a fetch when its compare-and-set
-- moved `next_fetch_at` from the value it read to its lease end. `etag` and
-- `last_modified` are the validators of the last 200 answer (conditional GET);
-- `failures` counts consecutive failed fetches (the backoff exponent); `last_error` is a
-- JSON document `{code, message, status?}` describing the most recent failure (kept after
-- later successes: compare `last_error_at` with `last_success_at`); `last_fetch` is a JSON
-- document describing the most recent completed fetch (status, entries, inserted, updated,
-- unchanged, truncated, bytes, duration_ms).
CREATE TABLE news_sources (
    id               TEXT PRIMARY KEY,
    owner_id         TEXT REFERENCES users(id),
    name             TEXT NOT NULL,
    url              TEXT NOT NULL,
    paused           INTEGER NOT NULL DEFAULT 0,
    interval_secs    INTEGER NOT NULL,
    next_fetch_at    TEXT NOT NULL,
    etag             TEXT,
    last_modified    TEXT,
    failures         INTEGER NOT NULL DEFAULT 0,
    last_fetch_at    TEXT,
    last_success_at  TEXT,
    last_error       TEXT,
    last_error_at    TEXT,
    last_fetch       TEXT,
    item_count       INTEGER NOT NULL DEFAULT 0,
    feed_title       TEXT,
    feed_format      TEXT,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL
);
CREATE UNIQUE INDEX news_sources_owner_url ON news_sources(owner_id, url) WHERE owner_id IS NOT NULL;
CREATE UNIQUE INDEX news_sources_shared_url ON news_sources(url) WHERE owner_id IS NULL;
CREATE INDEX news_sources_due ON news_sources(paused, next_fetch_at);
CREATE INDEX news_sources_owner ON news_sources(owner_id, id);

-- One collected item. `dedup_key` is `guid:<GUID>`, else `url:<canonical URL>`, else
-- `title:<SHA-256 of the title>`; (source_id, dedup_key) is unique, so a changed item is
-- updated in place (`changed_at`, `content_sha256`), never duplicated. `effective_at` is
-- `published_at` when the feed gave one, else `collected_at` (what since/until and time
-- sorting use). `n` is the integer key the FTS5 index refers to (an INTEGER PRIMARY KEY
-- keeps it stable across VACUUM).
CREATE TABLE news_items (
    n               INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    source_id       TEXT NOT NULL REFERENCES news_sources(id) ON DELETE CASCADE,
    dedup_key       TEXT NOT NULL,
    guid            TEXT,
    url             TEXT,
    title           TEXT NOT NULL,
    summary         TEXT NOT NULL,
    content         TEXT NOT NULL,
    author          TEXT,
    published_at    TEXT,
    collected_at    TEXT NOT NULL,
    changed_at      TEXT NOT NULL,
    effective_at    TEXT NOT NULL,
    content_sha256  TEXT NOT NULL,
    UNIQUE (source_id, dedup_key)
);
CREATE INDEX news_items_source_time ON news_items(source_id, effective_at);
CREATE INDEX news_items_time ON news_items(effective_at);

-- Full-text index over title, summary and content: an external-content FTS5 table (the
-- text lives once, in news_items), Porter stemming over Unicode 6.1 tokens with diacritics
-- folded, kept in step by the triggers below.
CREATE VIRTUAL TABLE news_items_fts USING fts5(
    title, summary, content,
    content = 'news_items', content_rowid = 'n',
    tokenize = 'porter unicode61 remove_diacritics 2'
);

CREATE TRIGGER news_items_fts_insert AFTER INSERT ON news_items BEGIN
    INSERT INTO news_items_fts(rowid, title, summary, content) VALUES (new.n, new.title, new.summary, new.content);
END;

CREATE TRIGGER news_items_fts_delete AFTER DELETE ON news_items BEGIN
    INSERT INTO news_items_fts(news_items_fts, rowid, title, summary, content)
        VALUES ('delete', old.n, old.title, old.summary, old.content);
END;

CREATE TRIGGER news_items_fts_update AFTER UPDATE OF title, summary, content ON news_items BEGIN
    INSERT INTO news_items_fts(news_items_fts, rowid, title, summary, content)
        VALUES ('delete', old.n, old.title, old.summary, old.content);
    INSERT INTO news_items_fts(rowid, title, summary, content) VALUES (new.n, new.title, new.summary, new.content);
END;
