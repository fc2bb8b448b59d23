-- The order of the execution queue between users (start-time fair queuing, see
-- `harness::fair`): each invocation gets a tag when it enters the queue (frozen without
-- approval, or granted), and queued invocations are claimed by tag, then id. Invocations
-- queued before this migration have tag 0 and are claimed first.
ALTER TABLE invocations ADD COLUMN queue_tag BIGINT NOT NULL DEFAULT 0;
DROP INDEX invocations_status;
CREATE INDEX invocations_status ON invocations(status, queue_tag, id);
