-- Skills (issue 20, docs/api.md "Skills"): a skill's private runtime. private_tools is a JSON
-- array of the tool ids private to the skill (never in a main run's exposure; `not_public`
-- with reason `skill_private` there); allowed_public a JSON array of the public tool ids its
-- sub-runs may also see (["*"] = every public tool). A run with skill_id is the skill's
-- sub-run. Number 0027: 0026 is kept for the run hash chain of the verifiable-runs work.
CREATE TABLE skills (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    name          TEXT NOT NULL,
    description   TEXT NOT NULL,
    private_tools TEXT NOT NULL,
    allowed_public TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    UNIQUE (owner_id, name)
);
ALTER TABLE runs ADD COLUMN skill_id TEXT REFERENCES skills(id);
