-- The claim loop reads the execution queue per user (`Store::queue_head`): the users with
-- queued invocations by a skip scan, then each one's first calls by queue tag. So a user who
-- holds their share of the execution slots (`harness::share`) is passed over at the cost of
-- one index step, however long their backlog.
DROP INDEX invocations_status;
CREATE INDEX invocations_status ON invocations(status, owner_id, queue_tag, id);
