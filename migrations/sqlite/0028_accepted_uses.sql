-- Learning from use (issue 20, docs/architecture.md "Learning from use"): a user's accepted
-- evidence, most recently accepted first, is read when their past uses are loaded.
CREATE INDEX evidence_accepted ON evidence(owner_id, accepted_at) WHERE accepted = 1;
