-- dagrun schema, version 17: limits are taken when work falls due.
--
-- A step or instance that starts later (a delayed start, a retry's
-- backoff, a snooze) took its limits as it was made ready: its rate slot
-- moved the queue's next start (tat) past its own time, it held its slot
-- of its key's and its queue's concurrency, and a delayed instance held
-- its workflow key from creation. One start an hour away held back every
-- step or instance sharing the limit for that hour. Now:
--
-- * A step made ready before its time (run_after later than ready_at)
--   keeps its own time and is marked rate_slot_due (it takes no rate slot)
--   and, unless it is a retry, which keeps the slot it ran in, slots_due
--   (it holds no concurrency slot: no count of a limit's slots counts a
--   pending step so marked). The claim's promotion, when its time comes,
--   clears the marks, and steps_limits_due admits its instance if that
--   waits for its time (below), takes its slots or holds it until one
--   frees, then takes its rate slot, staying delayed until that slot when
--   the rate is behind. A mark left on a step held or released since is
--   harmless: the step is checked again when promoted, and counts once it
--   runs.
-- * An instance that starts later is created held (storage.Admit), taking
--   no slot of its workflow key; it is admitted as its first step is
--   promoted if the key has room, else by the next finish of its key, which
--   admits the oldest held instances that are due, never one whose time
--   has not come.
--
-- SQLite has no functions: the triggers of version 8 that count slots or
-- take rate slots are rewritten whole, with the marks set first, the
-- count leaving out pending marked steps, and the rate slot taken only by
-- a step that is due.
ALTER TABLE steps ADD COLUMN rate_slot_due INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN slots_due INTEGER NOT NULL DEFAULT 0;

DROP TRIGGER IF EXISTS steps_limits_insert;
DROP TRIGGER IF EXISTS steps_limits_ready;
DROP TRIGGER IF EXISTS steps_limits_requeue;
DROP TRIGGER IF EXISTS steps_limits_release;
DROP TRIGGER IF EXISTS steps_limits_admitted;
DROP TRIGGER IF EXISTS steps_limits_due;
DROP TRIGGER IF EXISTS instances_limits_release;

CREATE TRIGGER steps_limits_insert AFTER INSERT ON steps
WHEN NEW.concurrency_key IS NOT NULL OR NEW.held_by_instance = 1 OR EXISTS (SELECT 1 FROM queue_limits WHERE queue = NEW.queue)
BEGIN
    UPDATE steps SET queue_limited = 1 WHERE id = NEW.id AND (parent_id IS NOT NULL OR for_each = 0)
        AND EXISTS (SELECT 1 FROM queue_limits WHERE queue = NEW.queue);
    UPDATE steps SET slots_due = coalesce(status = 'pending' AND run_after > ready_at AND run_after < 253370764800000000, 0)
    WHERE id = NEW.id;
    UPDATE steps SET run_after = 253370764800000000 WHERE id = NEW.id AND status = 'pending' AND slots_due = 0 AND NOT (
    steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> steps.id) >= q.concurrency)));
    UPDATE steps SET rate_slot_due = coalesce(status = 'pending' AND queue_limited = 1 AND run_after > ready_at AND run_after < 253370764800000000, 0)
    WHERE id = NEW.id;
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

CREATE TRIGGER steps_limits_ready AFTER UPDATE OF ready_at ON steps
WHEN NEW.status = 'pending' AND OLD.status NOT IN ('pending', 'running')
    AND (NEW.concurrency_key IS NOT NULL OR NEW.held_by_instance = 1 OR NEW.queue_limited = 1)
BEGIN
    UPDATE steps SET slots_due = coalesce(status = 'pending' AND run_after > ready_at AND run_after < 253370764800000000, 0)
    WHERE id = NEW.id;
    UPDATE steps SET run_after = 253370764800000000 WHERE id = NEW.id AND status = 'pending' AND slots_due = 0 AND NOT (
    steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> steps.id) >= q.concurrency)));
    UPDATE steps SET rate_slot_due = coalesce(status = 'pending' AND queue_limited = 1 AND run_after > ready_at AND run_after < 253370764800000000, 0)
    WHERE id = NEW.id;
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

CREATE TRIGGER steps_limits_requeue AFTER UPDATE OF run_after ON steps
WHEN NEW.status = 'pending' AND OLD.status = 'running' AND NEW.queue_limited = 1
BEGIN
    UPDATE steps SET slots_due = 0 WHERE id = NEW.id AND slots_due = 1;
    UPDATE steps SET rate_slot_due = coalesce(status = 'pending' AND queue_limited = 1 AND run_after > ready_at AND run_after < 253370764800000000, 0)
    WHERE id = NEW.id;
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

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
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> h.id) < h.concurrency_limit)
    AND (h.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = h.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = h.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> h.id) >= q.concurrency))
        ORDER BY h.id LIMIT 1);
    UPDATE steps SET run_after = coalesce(NEW.finished_at, OLD.run_after) WHERE id = (
        SELECT h.id FROM steps h WHERE OLD.queue_limited = 1 AND h.queue_limited = 1 AND h.queue = OLD.queue
            AND h.status = 'pending' AND h.run_after = 253370764800000000
            AND h.held_by_instance = 0
    AND (h.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = h.workflow AND k.name = h.name AND k.concurrency_key = h.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> h.id) < h.concurrency_limit)
    AND (h.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = h.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = h.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> h.id) >= q.concurrency))
        ORDER BY h.id LIMIT 1);
END;

CREATE TRIGGER steps_limits_admitted AFTER UPDATE OF held_by_instance ON steps
WHEN OLD.held_by_instance = 1 AND NEW.held_by_instance = 0 AND NEW.status = 'pending' AND NEW.run_after = 253370764800000000
BEGIN
    UPDATE steps SET run_after = NEW.ready_at WHERE id = NEW.id AND steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> steps.id) >= q.concurrency));
END;

-- A step promoted when its time came admits its instance if that waits
-- for its time and its key has room, takes the slots it is due (or is
-- held until one frees), then its slot of its queue's rate, staying
-- delayed (not promoted) until that slot when the rate is behind. Each
-- statement reads the rows as the one before left them.
CREATE TRIGGER steps_limits_due AFTER UPDATE OF rate_slot_due, slots_due ON steps
WHEN (OLD.rate_slot_due = 1 OR OLD.slots_due = 1) AND NEW.rate_slot_due = 0 AND NEW.slots_due = 0
    AND NEW.promoted = 1 AND NEW.status = 'pending'
BEGIN
    UPDATE instances SET held = 0 WHERE id = NEW.instance_id AND OLD.slots_due = 1 AND held = 1 AND finished_at IS NULL
        AND concurrency_key IS NOT NULL AND run_after <= NEW.run_after
        AND (SELECT count(*) FROM instances a WHERE a.workflow = instances.workflow AND a.concurrency_key = instances.concurrency_key
            AND a.finished_at IS NULL AND a.held = 0) < instances.concurrency_limit;
    UPDATE steps SET held_by_instance = 0 WHERE instance_id = NEW.instance_id AND held_by_instance = 1
        AND (SELECT held FROM instances WHERE id = NEW.instance_id) = 0;
    UPDATE steps SET run_after = 253370764800000000, promoted = 0 WHERE id = NEW.id AND OLD.slots_due = 1 AND NOT (
    steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> steps.id) >= q.concurrency)));
    UPDATE steps SET
        promoted = (SELECT q.tat <= steps.run_after FROM queue_limits q WHERE q.queue = steps.queue AND q.interval_us > 0) IS NOT 0,
        run_after = max(run_after, coalesce((SELECT q.tat FROM queue_limits q WHERE q.queue = steps.queue AND q.interval_us > 0), run_after))
    WHERE id = NEW.id AND OLD.rate_slot_due = 1 AND queue_limited = 1 AND run_after < 253370764800000000;
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND OLD.rate_slot_due = 1
        AND (SELECT queue_limited = 1 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

-- An admitted instance that finishes admits the oldest held ones of its
-- key whose time has come, and releases their held steps that fit.
CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND OLD.held = 0
BEGIN
    UPDATE instances SET held = 0 WHERE id IN (
        SELECT h.id FROM instances h WHERE h.workflow = OLD.workflow AND h.concurrency_key = OLD.concurrency_key
            AND h.finished_at IS NULL AND h.held = 1 AND h.run_after <= NEW.finished_at
        ORDER BY h.id LIMIT max(0, OLD.concurrency_limit - (SELECT count(*) FROM (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0))));
    UPDATE steps SET held_by_instance = 0 WHERE held_by_instance = 1 AND instance_id IN (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0);
END;
