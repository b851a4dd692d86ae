-- dagrun schema, version 5: wait steps and signals.
--
-- A wait step is a step row with wait_signal set: made ready, it becomes
-- 'waiting' instead of 'pending', so no claim ever takes it, and gets a
-- deadline when it has a timeout. The worker pass that recovers expired
-- leases fails the waiting steps whose deadline passed.
ALTER TABLE steps ADD COLUMN wait_signal TEXT NOT NULL DEFAULT '';
ALTER TABLE steps ADD COLUMN wait_timeout_us INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN deadline INTEGER;
CREATE INDEX steps_waiting_deadline ON steps (deadline) WHERE status = 'waiting';

-- One signal per (instance, name): the primary key is what lets exactly
-- one of two racing senders store it. signal_id is the sender's optional
-- ID ('' for none), which makes a repeat a duplicate instead of a
-- conflict. A signal sent before its step waits stays undelivered until
-- the step becomes ready, which delivers it in the same transaction.
CREATE TABLE signals (
    instance_id TEXT NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    signal_id   TEXT NOT NULL DEFAULT '',
    payload     TEXT,
    delivered   INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (instance_id, name)
) WITHOUT ROWID;
