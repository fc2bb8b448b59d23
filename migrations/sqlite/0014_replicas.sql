-- replicas: the servers sharing this database. Each keeps its own row's heartbeat; a
-- replica whose heartbeat is older than the dead-after limit is declared dead by another
-- (one UPDATE decides), and its running terminal sessions become lost.
CREATE TABLE replicas (
    node_id       TEXT PRIMARY KEY,
    process_id    TEXT NOT NULL,
    address       TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('alive', 'dead')),
    started_at    TEXT NOT NULL,
    heartbeat_at  TEXT NOT NULL
);
