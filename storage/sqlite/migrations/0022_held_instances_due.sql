-- A held instance whose time has come is admitted by the next finish of
-- its key, whatever time that finish reads.
--
-- instances_limits_release admitted the held instances of the key with
-- run_after <= NEW.finished_at: due by the finishing process's clock. A
-- process whose clock is behind the one that created a held instance
-- passed it over, and it stayed held until the next finish of its key,
-- which might never come. Now an instance is due also when it was never
-- delayed (run_after is its creation time), or when one of its steps is
-- parked for a slot after its delayed start fell due (a promotion that
-- found the key full). A delayed instance whose time has not come by any
-- of those is still left for the promotion of its first step.
DROP TRIGGER IF EXISTS instances_limits_release;
CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND OLD.held = 0
BEGIN
    UPDATE instances SET held = 0 WHERE id IN (
        SELECT h.id FROM instances h WHERE h.workflow = OLD.workflow AND h.concurrency_key = OLD.concurrency_key
            AND h.finished_at IS NULL AND h.held = 1
            AND (h.run_after <= NEW.finished_at OR h.run_after <= h.created_at
                OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = h.id AND s.status = 'pending'
                    AND s.run_after = 253370764800000000 AND s.slots_due = 0))
        ORDER BY h.priority DESC, h.id LIMIT max(0, OLD.concurrency_limit - (SELECT count(*) FROM (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0))));
    UPDATE steps SET held_by_instance = 0 WHERE held_by_instance = 1 AND instance_id IN (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0);
END;
