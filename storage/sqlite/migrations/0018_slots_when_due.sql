-- dagrun schema, version 18: a step takes its concurrency slots when it
-- falls due.
--
-- A step held a slot of its key's limit and of its queue's while pending
-- and not held, so a delayed start an hour away held its slot for that
-- hour: with a limit of 1, every other step of the key or queue waited.
-- Now a step made ready before its time (run_after later than ready_at;
-- not a retry, which keeps the slot it ran in) takes no slot and is
-- marked slots_due; no count of a limit's slots counts it while it is
-- pending. The claim's promotion, when its time comes, clears the mark,
-- and steps_limits_due takes its slots then, or holds it until one frees,
-- as a step made ready at that moment would be; then its rate slot
-- (version 17). A mark left on a step held or released since is harmless:
-- the step is checked again when promoted, and counts once it runs.
-- The triggers that count slots are those of versions 8 and 17 with that
-- count, and the mark set first.
ALTER TABLE steps ADD COLUMN slots_due INTEGER NOT NULL DEFAULT 0;

DROP TRIGGER IF EXISTS steps_limits_insert;
DROP TRIGGER IF EXISTS steps_limits_ready;
DROP TRIGGER IF EXISTS steps_limits_requeue;
DROP TRIGGER IF EXISTS steps_limits_release;
DROP TRIGGER IF EXISTS steps_limits_admitted;
DROP TRIGGER IF EXISTS steps_limits_due;

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

-- A step promoted when its time came takes the slots it is due, or is
-- held until one frees, then its slot of its queue's rate, staying delayed
-- (not promoted) until that slot when the rate is behind. Each statement
-- reads the row as the one before left it.
CREATE TRIGGER steps_limits_due AFTER UPDATE OF rate_slot_due, slots_due ON steps
WHEN (OLD.rate_slot_due = 1 OR OLD.slots_due = 1) AND NEW.rate_slot_due = 0 AND NEW.slots_due = 0
    AND NEW.promoted = 1 AND NEW.status = 'pending'
BEGIN
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
