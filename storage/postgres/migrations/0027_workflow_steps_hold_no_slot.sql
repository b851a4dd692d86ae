-- dagrun schema, version 27: workflow steps hold no queue slot.
--
-- A workflow step, and each item of a forEach one, runs no handler: it is
-- running, with no lease, while its child instance runs. Marked
-- queue_limited like a handler's step, it took a slot of its queue for
-- that long, so a child whose steps share the parent's queue waited for
-- ever on its own parent under a limit of 1 (and any limit of N once N
-- parents waited so). Such rows are no longer marked (the creation and
-- expansion statements and SetQueueLimit), the rows marked are unmarked,
-- an item the queue held is let go, and each limited queue releases the
-- held steps its freed slots make room for, as a finish would.

CREATE TEMP TABLE unlimited ON COMMIT DROP AS SELECT s.id FROM steps s
    WHERE s.queue_limited AND (s.child_workflow <> ''
        OR EXISTS (SELECT 1 FROM steps p WHERE p.id = s.parent_id AND p.child_workflow <> ''));

UPDATE steps SET queue_limited = false, rate_slot_due = false WHERE id IN (SELECT id FROM unlimited);

UPDATE steps SET run_after = coalesce(ready_at, now())
    WHERE id IN (SELECT id FROM unlimited) AND status = 'pending' AND run_after = '9999-01-01 00:00:00+00'
        AND NOT held_by_instance AND concurrency_key IS NULL;

SELECT limits_release_queue(queue, now()) FROM queue_limits WHERE concurrency > 0;
