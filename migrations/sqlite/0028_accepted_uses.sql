-- Learning from use (issue 20, docs/architecture.md "Learning from use"): a user's accepted
-- evidence is read most recently accepted first, and retention deletes the removed turns'
-- task vectors from the embedding cache by key alone.
CREATE INDEX evidence_accepted ON evidence(owner_id, accepted_at) WHERE accepted = 1;
CREATE INDEX tool_embeddings_text ON tool_embeddings(text_sha256);
