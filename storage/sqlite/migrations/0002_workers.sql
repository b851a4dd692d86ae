-- dagrun schema, version 2: worker presence.
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
