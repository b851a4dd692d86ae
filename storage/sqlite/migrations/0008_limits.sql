-- dagrun schema, version 8: concurrency limits.
--
-- Limits are decided when state changes, never by the claim, whose index
-- walk stays as it was: a ready step that may not run yet is held, that is
-- pending with run_after 253370764800000000 (year 9999, storage.HeldUntil), which
-- no claim reaches. A step holds a slot of its limits while it is pending
-- and not held, or running; triggers hold a step that becomes ready
-- without a free slot, and release the oldest held ones (by id, that is
-- creation order) when a slot frees, whatever path finished the step or
-- instance. SQLite has one writer at a time, so counting the slots inside
-- the triggers is exact.

-- Workflow-level limit: concurrency_key is the evaluated key (NULL: not
-- limited). held: the instance is not admitted; its steps carry
-- held_by_instance until it is.
ALTER TABLE instances ADD COLUMN concurrency_key TEXT;
ALTER TABLE instances ADD COLUMN concurrency_limit INTEGER NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
CREATE INDEX instances_concurrency ON instances (workflow, concurrency_key, held, id)
    WHERE concurrency_key IS NOT NULL AND finished_at IS NULL;

-- Step-level limit (per workflow, step name and key value), the instance's
-- admission, and whether the step's queue has a limit (kept up to date by
-- SetQueueLimit; never on a forEach step's own row, which runs no handler).
ALTER TABLE steps ADD COLUMN concurrency_key TEXT;
ALTER TABLE steps ADD COLUMN concurrency_limit INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN held_by_instance INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN queue_limited INTEGER NOT NULL DEFAULT 0;
-- Only limited steps are in these, so unlimited ones never maintain them.
CREATE INDEX steps_concurrency ON steps (workflow, name, concurrency_key, run_after)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'running');
CREATE INDEX steps_queue_limited ON steps (queue, run_after)
    WHERE queue_limited = 1 AND status IN ('pending', 'running');

-- Queue limits, global. interval_us is the spacing a rate allows between
-- two starts; tat the earliest start the rate allows next (GCRA's
-- theoretical arrival time): a step made ready in a rated queue runs at
-- the later of its own run_after and tat, which moves on by interval_us.
CREATE TABLE queue_limits (
    queue       TEXT PRIMARY KEY,
    concurrency INTEGER NOT NULL DEFAULT 0,
    rate        INTEGER NOT NULL DEFAULT 0,
    per_us      INTEGER NOT NULL DEFAULT 0,
    interval_us INTEGER NOT NULL DEFAULT 0,
    tat         INTEGER NOT NULL DEFAULT 0,
    updated_at  INTEGER NOT NULL
) WITHOUT ROWID;

-- A step inserted ready (at creation, or an item) takes a slot or is held.
CREATE TRIGGER steps_limits_insert AFTER INSERT ON steps
WHEN NEW.concurrency_key IS NOT NULL OR NEW.held_by_instance = 1 OR EXISTS (SELECT 1 FROM queue_limits WHERE queue = NEW.queue)
BEGIN
    UPDATE steps SET queue_limited = 1 WHERE id = NEW.id AND (parent_id IS NOT NULL OR for_each = 0)
        AND EXISTS (SELECT 1 FROM queue_limits WHERE queue = NEW.queue);
    UPDATE steps SET run_after = 253370764800000000 WHERE id = NEW.id AND status = 'pending' AND NOT (
    steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND c.id <> steps.id) >= q.concurrency)));
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

-- A step made ready later (or re-armed by a retry) does the same. Every
-- statement that makes a step ready sets ready_at, and no claim does: the
-- triggers name the columns a claim never writes (ready_at, run_after,
-- finished_at), so a claim fires none of them.
CREATE TRIGGER steps_limits_ready AFTER UPDATE OF ready_at ON steps
WHEN NEW.status = 'pending' AND OLD.status NOT IN ('pending', 'running')
    AND (NEW.concurrency_key IS NOT NULL OR NEW.held_by_instance = 1 OR NEW.queue_limited = 1)
BEGIN
    UPDATE steps SET run_after = 253370764800000000 WHERE id = NEW.id AND status = 'pending' AND NOT (
    steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND c.id <> steps.id) >= q.concurrency)));
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

-- A retried, snoozed or released step keeps its slot, but its next start
-- counts against its queue's rate.
CREATE TRIGGER steps_limits_requeue AFTER UPDATE OF run_after ON steps
WHEN NEW.status = 'pending' AND OLD.status = 'running' AND NEW.queue_limited = 1
BEGIN
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

-- A step that held a slot and finished frees it: the oldest held step
-- sharing its key that now fits is released, then the oldest sharing its
-- queue. One row per statement: SQLite may check an UPDATE's WHERE for
-- every row before it changes any, so a count in it would not see the
-- rows released before.
CREATE TRIGGER steps_limits_release AFTER UPDATE OF finished_at ON steps
WHEN OLD.status IN ('pending', 'running') AND NEW.status NOT IN ('pending', 'running')
    AND OLD.run_after < 253370764800000000 AND (OLD.concurrency_key IS NOT NULL OR OLD.queue_limited = 1)
BEGIN
    UPDATE steps SET run_after = coalesce(NEW.finished_at, OLD.run_after) WHERE id = (
        SELECT h.id FROM steps h WHERE h.concurrency_key = OLD.concurrency_key AND h.workflow = OLD.workflow
            AND h.name = OLD.name AND h.status = 'pending' AND h.run_after = 253370764800000000
            AND h.held_by_instance = 0
    AND (h.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = h.workflow AND k.name = h.name AND k.concurrency_key = h.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND k.id <> h.id) < h.concurrency_limit)
    AND (h.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = h.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = h.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND c.id <> h.id) >= q.concurrency))
        ORDER BY h.id LIMIT 1);
    UPDATE steps SET run_after = coalesce(NEW.finished_at, OLD.run_after) WHERE id = (
        SELECT h.id FROM steps h WHERE OLD.queue_limited = 1 AND h.queue_limited = 1 AND h.queue = OLD.queue
            AND h.status = 'pending' AND h.run_after = 253370764800000000
            AND h.held_by_instance = 0
    AND (h.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = h.workflow AND k.name = h.name AND k.concurrency_key = h.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND k.id <> h.id) < h.concurrency_limit)
    AND (h.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = h.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = h.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND c.id <> h.id) >= q.concurrency))
        ORDER BY h.id LIMIT 1);
END;

-- A released step of a rated queue takes its start from the rate.
CREATE TRIGGER steps_limits_released AFTER UPDATE OF run_after ON steps
WHEN OLD.run_after = 253370764800000000 AND NEW.run_after < 253370764800000000 AND NEW.status = 'pending' AND NEW.queue_limited = 1
BEGIN
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

-- An admitted instance that finishes admits the oldest held ones of its
-- key, and releases their held steps that fit.
CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND OLD.held = 0
BEGIN
    UPDATE instances SET held = 0 WHERE id IN (
        SELECT h.id FROM instances h WHERE h.workflow = OLD.workflow AND h.concurrency_key = OLD.concurrency_key
            AND h.finished_at IS NULL AND h.held = 1
        ORDER BY h.id LIMIT max(0, OLD.concurrency_limit - (SELECT count(*) FROM (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0))));
    UPDATE steps SET held_by_instance = 0 WHERE held_by_instance = 1 AND instance_id IN (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0);
END;

-- A step of an instance just admitted is released if it fits; the trigger
-- runs row by row, each seeing the rows released before it.
CREATE TRIGGER steps_limits_admitted AFTER UPDATE OF held_by_instance ON steps
WHEN OLD.held_by_instance = 1 AND NEW.held_by_instance = 0 AND NEW.status = 'pending' AND NEW.run_after = 253370764800000000
BEGIN
    UPDATE steps SET run_after = NEW.ready_at WHERE id = NEW.id AND steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND c.id <> steps.id) >= q.concurrency));
END;

-- A finished instance retried is admitted again only if there is room.
CREATE TRIGGER instances_limits_rearm AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NOT NULL AND NEW.finished_at IS NULL AND NEW.concurrency_key IS NOT NULL
BEGIN
    UPDATE instances SET held = (SELECT count(*) FROM instances a WHERE a.workflow = NEW.workflow
        AND a.concurrency_key = NEW.concurrency_key AND a.finished_at IS NULL AND a.held = 0 AND a.id <> NEW.id) >= NEW.concurrency_limit
    WHERE id = NEW.id;
    UPDATE instances SET status = 'pending' WHERE id = NEW.id AND held = 1;
    UPDATE steps SET held_by_instance = (SELECT held FROM instances WHERE id = NEW.id) WHERE instance_id = NEW.id;
    -- Steps a retry made ready before this ran wait for the admission.
    UPDATE steps SET run_after = 253370764800000000
    WHERE instance_id = NEW.id AND status = 'pending' AND held_by_instance = 1;
END;
