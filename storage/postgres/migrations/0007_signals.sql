-- dagrun schema, version 7: wait steps and signals.
--
-- A wait step is a step row with wait_signal set: made ready, it becomes
-- 'waiting' instead of 'pending', so no claim ever takes it, and gets a
-- deadline when it has a timeout. The worker pass that recovers expired
-- leases fails the waiting steps whose deadline passed.
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_status_check;
ALTER TABLE steps ADD CONSTRAINT steps_status_check
    CHECK (status IN ('blocked', 'pending', 'running', 'waiting', 'completed', 'failed', 'skipped', 'cancelled'));
ALTER TABLE steps ADD COLUMN wait_signal text NOT NULL DEFAULT '';
ALTER TABLE steps ADD COLUMN wait_timeout_us bigint NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN deadline timestamptz;
CREATE INDEX steps_waiting_deadline ON steps (deadline) WHERE status = 'waiting';

-- One signal per (instance, name): senders lock the instance row first,
-- and the primary key keeps a second row out whatever happens. signal_id
-- is the sender's optional ID ('' for none), which makes a repeat a
-- duplicate instead of a conflict. A signal sent before its step waits
-- stays undelivered until the step becomes ready, which delivers it in
-- the same transaction.
CREATE TABLE signals (
    instance_id text NOT NULL,
    name        text NOT NULL,
    signal_id   text NOT NULL DEFAULT '',
    payload     json,
    delivered   boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (instance_id, name)
);
