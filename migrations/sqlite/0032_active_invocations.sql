-- The status index holds only the invocations the harness and the approvals still act on
-- (awaiting approval, queued, running): a finished invocation leaves it. Before, it kept an
-- entry for every invocation ever made — on Postgres one for every version of a row, since
-- each status change is a new row version — so it grew with the history and every result
-- added an entry no query reads. The predicate is written as equalities joined by OR: SQLite
-- uses a partial index for a query whose WHERE has one of its terms (`status = 'queued'`),
-- Postgres proves it from either form.
DROP INDEX invocations_status;
CREATE INDEX invocations_status ON invocations(status, owner_id, queue_tag, id)
    WHERE status = 'awaiting_approval' OR status = 'queued' OR status = 'running';
