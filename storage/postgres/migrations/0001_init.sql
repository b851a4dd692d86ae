-- dagrun schema, version 1.
--
-- Statuses are plain text checked against the storage package's enums, so
-- the rows stay readable with psql. Inputs and outputs are json, not jsonb:
-- they are opaque payloads to the store, and json hands them back byte for
-- byte as they were written (key order, number spelling), as SQLite does.
-- Instance IDs are the caller's sortable strings: newest first is
-- ORDER BY id DESC.

CREATE TABLE definitions (
    hash       text PRIMARY KEY,
    workflow   text NOT NULL,
    source     bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE instances (
    id              text PRIMARY KEY,
    workflow        text NOT NULL,
    definition_hash text NOT NULL REFERENCES definitions (hash),
    status          text NOT NULL CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    input           json,
    output          json,
    error           text NOT NULL DEFAULT '',
    idempotency_key text,
    priority        integer NOT NULL DEFAULT 0,
    run_after       timestamptz NOT NULL,
    created_at      timestamptz NOT NULL,
    started_at      timestamptz,
    finished_at     timestamptz
);

-- One instance per (workflow, key); instances without a key are unconstrained.
CREATE UNIQUE INDEX instances_workflow_key ON instances (workflow, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
-- Listing newest first, optionally by workflow or status, pages on id.
CREATE INDEX instances_workflow_id ON instances (workflow, id);
-- Unfinished instances stay few however many finished ones pile up.
CREATE INDEX instances_unfinished ON instances (status, id)
    WHERE finished_at IS NULL;
-- Prune scans only finished instances, oldest first.
CREATE INDEX instances_finished_at ON instances (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TABLE steps (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance_id      text NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    position         integer NOT NULL,
    name             text NOT NULL,
    handler          text NOT NULL,
    queue            text NOT NULL,
    -- Copied from the instance so that claiming and stats need no join.
    workflow         text NOT NULL,
    depends_on       text[] NOT NULL DEFAULT '{}',
    status           text NOT NULL CHECK (status IN ('blocked', 'pending', 'running', 'completed', 'failed', 'skipped', 'cancelled')),
    attempts         integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL DEFAULT 1,
    backoff_us       bigint NOT NULL DEFAULT 0,
    max_backoff_us   bigint NOT NULL DEFAULT 0,
    timeout_us       bigint NOT NULL DEFAULT 0,
    fence            bigint NOT NULL DEFAULT 0,
    input            json,
    output           json,
    error            text NOT NULL DEFAULT '',
    priority         integer NOT NULL DEFAULT 0,
    -- NULL while blocked.
    run_after        timestamptz,
    ready_at         timestamptz,
    first_started_at timestamptz,
    started_at       timestamptz,
    finished_at      timestamptz,
    lease_until      timestamptz,
    worker_id        text NOT NULL DEFAULT '',
    -- Steps of one instance in definition order; also serves the cascade.
    UNIQUE (instance_id, position),
    UNIQUE (instance_id, name)
);

-- Claiming: only pending rows are indexed, so the indexes stay small and a
-- claim O(log n) however many finished steps the table holds. One index per
-- claim shape: all queues (walked in claim order), and by queue.
CREATE INDEX steps_ready ON steps (priority DESC, run_after, id)
    WHERE status = 'pending';
CREATE INDEX steps_ready_queue ON steps (queue, priority DESC, run_after, id)
    WHERE status = 'pending';
-- Lease recovery and stuck-step stats look only at running steps.
CREATE INDEX steps_running_lease ON steps (lease_until)
    WHERE status = 'running';

CREATE TABLE events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance_id text NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    step        text NOT NULL DEFAULT '',
    type        text NOT NULL,
    attempt     integer NOT NULL DEFAULT 0,
    message     text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL
);

CREATE INDEX events_instance_id ON events (instance_id, id);
