-- dagrun schema, version 2: worker presence, and handler in the ready
-- indexes.
--
-- Each running worker announces itself (and renews the announcement) with
-- the handlers it registered and the queues it serves, so that stats can
-- name the ready steps no live worker can run. handlers and queues are
-- JSON arrays of names; an empty queues array means every queue. Rows of
-- workers that stopped without removing themselves are deleted by the
-- next announcement of any worker.
CREATE TABLE workers (
    id         TEXT PRIMARY KEY,
    handlers   TEXT NOT NULL DEFAULT '[]',
    queues     TEXT NOT NULL DEFAULT '[]',
    started_at INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL
) WITHOUT ROWID;

-- Claims name the worker's handlers: with handler as the last column of
-- the ready indexes, the claim's pick reads only the index, as it did
-- before it filtered by handler, instead of each candidate's table row
-- (measured: claims about a third faster). Rebuilding them reads the steps
-- table once, at the upgrade.
DROP INDEX steps_ready;
DROP INDEX steps_ready_queue;
CREATE INDEX steps_ready ON steps (priority DESC, run_after, id, handler) WHERE status = 'pending';
CREATE INDEX steps_ready_queue ON steps (queue, priority DESC, run_after, id, handler) WHERE status = 'pending';
