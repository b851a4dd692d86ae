-- dagrun schema, version 19: an instance that starts later is admitted
-- under its workflow's concurrency limit when its time comes.
--
-- An instance was admitted (or held) as it was created, so one started
-- with a delay of an hour held its key's slot for that hour, and with a
-- limit of 1 every other instance of the key waited. Now it is created
-- held, taking no slot (storage.Admit). Its first steps wait for their
-- time out of the claim indexes (version 18); when the claim's promotion
-- finds one due, steps_limits_due admits the instance if its key has a
-- free slot, then the step takes its own slots. An instance that found
-- no slot stays held, and the next admitted instance of its key to finish
-- admits the oldest held ones that are due, as before, never one whose
-- time has not come. The two triggers are those of versions 18 and 8
-- with that added.
DROP TRIGGER IF EXISTS steps_limits_due;
DROP TRIGGER IF EXISTS instances_limits_release;

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

CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND OLD.held = 0
BEGIN
    UPDATE instances SET held = 0 WHERE id IN (
        SELECT h.id FROM instances h WHERE h.workflow = OLD.workflow AND h.concurrency_key = OLD.concurrency_key
            AND h.finished_at IS NULL AND h.held = 1 AND h.run_after <= NEW.finished_at
        ORDER BY h.id LIMIT max(0, OLD.concurrency_limit - (SELECT count(*) FROM (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0))));
    UPDATE steps SET held_by_instance = 0 WHERE held_by_instance = 1 AND instance_id IN (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0);
END;
