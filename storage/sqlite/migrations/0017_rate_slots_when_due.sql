-- dagrun schema, version 17: a rated queue's steps take their start slot
-- when they fall due.
--
-- A step made ready in a rated queue took the later of its run_after and
-- the rate's next start (tat), and moved tat on past it. A delayed start,
-- a retry's backoff or a snooze an hour away thus moved tat an hour on,
-- and every step of the queue made ready after it waited that hour.
--
-- Now a step that is not due when it is made ready (run_after later than
-- ready_at) keeps its own time and is marked rate_slot_due. The claim's
-- promotion, when that time comes, clears the mark, and steps_limits_due
-- takes the step's slot then: the step runs at once if the rate allows,
-- else it waits out of the claim indexes until the rate's next start. So
-- tat only ever moves for steps that are due, in the order they fall due.
-- The triggers that make steps ready are those of version 8 with the mark
-- set first and the slot taken only by a step that is due.
ALTER TABLE steps ADD COLUMN rate_slot_due INTEGER NOT NULL DEFAULT 0;

DROP TRIGGER IF EXISTS steps_limits_insert;
DROP TRIGGER IF EXISTS steps_limits_ready;
DROP TRIGGER IF EXISTS steps_limits_requeue;

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
    UPDATE steps SET run_after = 253370764800000000 WHERE id = NEW.id AND status = 'pending' AND NOT (
    steps.held_by_instance = 0
    AND (steps.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = steps.workflow AND k.name = steps.name AND k.concurrency_key = steps.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND k.id <> steps.id) < steps.concurrency_limit)
    AND (steps.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = steps.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = steps.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND c.id <> steps.id) >= q.concurrency)));
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
    UPDATE steps SET rate_slot_due = coalesce(status = 'pending' AND queue_limited = 1 AND run_after > ready_at AND run_after < 253370764800000000, 0)
    WHERE id = NEW.id;
    UPDATE steps SET run_after = max(run_after, (SELECT tat FROM queue_limits q WHERE q.queue = NEW.queue))
    WHERE id = NEW.id AND status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = NEW.queue AND q.interval_us > 0);
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0 AND (SELECT status = 'pending' AND queue_limited = 1 AND rate_slot_due = 0 AND run_after < 253370764800000000 FROM steps WHERE id = NEW.id);
END;

-- A step promoted when its time came takes its slot of its queue's rate,
-- and stays delayed (not promoted) until that slot when the rate is
-- behind. Both columns are set from the row as it was (tat against its
-- own run_after), then tat moves on past the slot.
CREATE TRIGGER steps_limits_due AFTER UPDATE OF rate_slot_due ON steps
WHEN OLD.rate_slot_due = 1 AND NEW.rate_slot_due = 0 AND NEW.promoted = 1 AND NEW.queue_limited = 1 AND NEW.status = 'pending'
BEGIN
    UPDATE steps SET
        promoted = (SELECT q.tat <= steps.run_after FROM queue_limits q WHERE q.queue = steps.queue AND q.interval_us > 0) IS NOT 0,
        run_after = max(run_after, coalesce((SELECT q.tat FROM queue_limits q WHERE q.queue = steps.queue AND q.interval_us > 0), run_after))
    WHERE id = NEW.id;
    UPDATE queue_limits SET tat = (SELECT run_after FROM steps WHERE id = NEW.id) + interval_us
    WHERE queue = NEW.queue AND interval_us > 0;
END;
