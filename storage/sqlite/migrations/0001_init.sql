-- dagrun schema, version 1.
--
-- Times are INTEGER unix microseconds: compact, fast to compare and sort,
-- and the same precision as Postgres timestamptz. IDs of instances are the
-- caller's sortable strings, so "newest first" is ORDER BY id DESC.

CREATE TABLE definitions (
    hash     TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    source   BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE instances (
    id              TEXT PRIMARY KEY,
    workflow        TEXT NOT NULL,
    definition_hash TEXT NOT NULL REFERENCES definitions (hash),
    status          TEXT NOT NULL,
    input           TEXT,
    output          TEXT,
    error           TEXT NOT NULL DEFAULT '',
    idem_key        TEXT,
    priority        INTEGER NOT NULL DEFAULT 0,
    run_after       INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    started_at      INTEGER,
    finished_at     INTEGER
);

-- Idempotent starts: one instance per (workflow, key) when a key is given.
CREATE UNIQUE INDEX instances_idem_key ON instances (workflow, idem_key) WHERE idem_key IS NOT NULL;
-- ListInstances by workflow, newest first.
CREATE INDEX instances_workflow ON instances (workflow, id);
-- Unfinished instances stay few however many finished ones pile up.
CREATE INDEX instances_unfinished ON instances (status, id) WHERE finished_at IS NULL;
-- Prune walks finished instances by age.
CREATE INDEX instances_finished ON instances (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE steps (
    id               INTEGER PRIMARY KEY,
    instance_id      TEXT NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    position         INTEGER NOT NULL,
    name             TEXT NOT NULL,
    handler          TEXT NOT NULL,
    queue            TEXT NOT NULL,
    -- Copied from the instance so that claiming needs no join.
    workflow         TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    depends_on       TEXT NOT NULL DEFAULT '[]', -- JSON array of step names
    status           TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    backoff_us       INTEGER NOT NULL DEFAULT 0,
    max_backoff_us   INTEGER NOT NULL DEFAULT 0,
    timeout_us       INTEGER NOT NULL DEFAULT 0,
    fence            INTEGER NOT NULL DEFAULT 0,
    input            TEXT,
    output           TEXT,
    error            TEXT NOT NULL DEFAULT '',
    run_after        INTEGER NOT NULL DEFAULT 0,
    ready_at         INTEGER,
    first_started_at INTEGER,
    started_at       INTEGER,
    finished_at      INTEGER,
    lease_until      INTEGER,
    worker_id        TEXT NOT NULL DEFAULT ''
);

-- Steps of one instance in definition order; also serves the FK cascade.
CREATE UNIQUE INDEX steps_instance ON steps (instance_id, position);
-- Claiming: only ready rows are indexed, so the index stays small however
-- many finished steps exist. One index per claim shape: all queues, and a
-- queue filter.
CREATE INDEX steps_ready ON steps (priority DESC, run_after, id) WHERE status = 'pending';
CREATE INDEX steps_ready_queue ON steps (queue, priority DESC, run_after, id) WHERE status = 'pending';
-- Recovering expired leases and counting stuck steps.
CREATE INDEX steps_running_lease ON steps (lease_until) WHERE status = 'running';

CREATE TABLE events (
    id          INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    step        TEXT NOT NULL DEFAULT '',
    type        TEXT NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 0,
    message     TEXT NOT NULL DEFAULT '',
    at          INTEGER NOT NULL
);

CREATE INDEX events_instance ON events (instance_id, id);
