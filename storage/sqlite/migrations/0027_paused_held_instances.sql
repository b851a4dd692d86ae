-- dagrun schema, version 27: a paused held instance is not admitted.
--
-- A finish of an instance under a workflow concurrency limit admitted the
-- next held instances of its key, paused ones too. A paused one admitted
-- so kept the key's slot while nothing of it could run, and the others
-- waited behind it; its steps, put off by the pause, were not released
-- when it was admitted, nor by its resume, so it never ran and its key
-- stayed full for good. Paused instances are now passed over, as the
-- releases of steps pass over paused steps; a resume admits the instance
-- when its key has room (and releases its held steps that fit). The
-- trigger is restated whole; only the paused term is new.
DROP TRIGGER IF EXISTS instances_limits_release;
CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND OLD.held = 0
BEGIN
    UPDATE instances SET held = 0 WHERE id IN (
        SELECT h.id FROM instances h WHERE h.workflow = OLD.workflow AND h.concurrency_key = OLD.concurrency_key
            AND h.finished_at IS NULL AND h.held = 1 AND h.paused = 0
            AND (h.parked = 1 OR h.run_after <= NEW.finished_at OR h.run_after <= h.created_at
                OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = h.id AND s.status = 'pending'
                    AND s.run_after = 253370764800000000 AND s.slots_due = 0))
        ORDER BY h.priority DESC, h.id LIMIT max(0, OLD.concurrency_limit - (SELECT count(*) FROM (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0))));
    UPDATE steps SET held_by_instance = 0 WHERE held_by_instance = 1 AND instance_id IN (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0);
END;
