-- dagrun schema, version 4: worker presence.
--
-- Each running worker announces itself (and renews the announcement) with
-- the handlers it registered and the queues it serves, so that stats can
-- name the ready steps no live worker can run. An empty queues array means
-- every queue. Rows of workers that stopped without removing themselves
-- are deleted by the next announcement of any worker.
CREATE TABLE workers (
    id         text PRIMARY KEY,
    handlers   text[] NOT NULL DEFAULT '{}',
    queues     text[] NOT NULL DEFAULT '{}',
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL
);
