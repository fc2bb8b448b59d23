-- Embedding vectors of tool texts, the cache behind dense and hybrid Tool Exposure ranking.
-- A row is keyed by the model that computed it (model_id names a vector space, e.g.
-- `local:all-MiniLM-L6-v2-int8@8199be6f699a`) and the lowercase hex SHA-256 of the tool
-- text (crate::exposure::tool_text), so a tool is embedded once per model and text: a
-- restart, another replica or a re-registration with the same text reuses the row, and a
-- changed text gets a new one. `vector` is standard base64 of `dim` little-endian IEEE-754
-- f32 values, L2-normalised. Rows are never updated; stale ones are harmless.
CREATE TABLE tool_embeddings (
    model_id     TEXT NOT NULL,
    text_sha256  TEXT NOT NULL,
    dim          INTEGER NOT NULL,
    vector       TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    PRIMARY KEY (model_id, text_sha256)
);
