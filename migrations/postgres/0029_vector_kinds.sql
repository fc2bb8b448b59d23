-- What each cached vector was computed from: `tool` (a tool's text) or `task` (a user's past
-- task, learning from use). Rows cached before this migration have no kind. The embedding
-- worker deletes its model's tool vectors and rows of no kind that no indexed tool's text
-- uses and that are older than an hour, so tools that keep changing their descriptions do
-- not grow this table without end (a past task's vector of no kind is embedded again at its
-- user's next history load); task vectors go with their turns (retention).
ALTER TABLE tool_embeddings ADD COLUMN kind TEXT CHECK (kind IN ('tool', 'task'));
