-- dagrun schema, version 23: workflow steps hold no queue slot.
--
-- A workflow step, and each item of a forEach one, runs no handler: it is
-- running, with no lease, while its child instance runs. Marked
-- queue_limited like a handler's step, it took a slot of its queue for
-- that long, so a child whose steps share the parent's queue waited for
-- ever on its own parent under a limit of 1 (and any limit of N once N
-- parents waited so). Such rows are no longer marked (steps_limits_insert
-- here, SetQueueLimit in limits.go), the rows marked are unmarked, an item
-- the queue held is let go, and the held steps of a limited queue that the
-- freed slots make room for are released, in release order.

DROP TRIGGER IF EXISTS steps_limits_insert;

CREATE TRIGGER steps_limits_insert AFTER INSERT ON steps
WHEN NEW.concurrency_key IS NOT NULL OR NEW.held_by_instance = 1 OR EXISTS (SELECT 1 FROM queue_limits WHERE queue = NEW.queue)
BEGIN
    UPDATE steps SET queue_limited = 1 WHERE id = NEW.id AND (parent_id IS NOT NULL OR for_each = 0)
        AND child_workflow = '' AND NOT EXISTS (SELECT 1 FROM steps p WHERE p.id = NEW.parent_id AND p.child_workflow <> '')
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

-- The workflow steps and the items of forEach workflow steps.
CREATE TEMP TABLE unlimited AS SELECT s.id FROM steps s
    WHERE s.queue_limited = 1 AND (s.child_workflow <> ''
        OR EXISTS (SELECT 1 FROM steps p WHERE p.id = s.parent_id AND p.child_workflow <> ''));
UPDATE steps SET queue_limited = 0, rate_slot_due = 0 WHERE id IN (SELECT id FROM unlimited);
UPDATE steps SET run_after = coalesce(ready_at, CAST(unixepoch('subsec') * 1000000 AS INTEGER))
    WHERE id IN (SELECT id FROM unlimited) AND status = 'pending' AND run_after = 253370764800000000
        AND held_by_instance = 0 AND concurrency_key IS NULL;
DROP TABLE unlimited;

-- Released as a finish in the queue would release them: highest priority
-- first, then oldest, as many as the queue has room for. Steps under a
-- concurrency key or a held instance wait for the finish that frees them.
UPDATE steps SET run_after = CAST(unixepoch('subsec') * 1000000 AS INTEGER) WHERE id IN (
    SELECT h.id FROM (
        SELECT id, queue, row_number() OVER (PARTITION BY queue ORDER BY priority DESC, id) AS turn FROM steps
        WHERE queue_limited = 1 AND status = 'pending' AND run_after = 253370764800000000
            AND held_by_instance = 0 AND concurrency_key IS NULL
    ) h JOIN queue_limits q ON q.queue = h.queue AND q.concurrency > 0
    WHERE h.turn <= q.concurrency - (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = q.queue
        AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0)));
