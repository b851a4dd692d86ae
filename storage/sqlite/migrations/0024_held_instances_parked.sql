-- dagrun schema, version 24: a held instance that found its key full is
-- parked until a finish of its key.
--
-- An instance held by a workflow concurrency limit whose first steps do
-- not run a handler (they wait, or start a child) is deferred: the sweep
-- (StartDeferred) admits it once its time has come and its key has room.
-- The sweep, and the next wake every idle worker reads, found such
-- instances by walking every held one whose time had come and counting
-- its key's admitted instances for each: with 20,000 held behind a full
-- key a next wake took 53 ms. Yet once its time has come and its key is
-- full, a held instance can only be admitted by a finish of its key
-- (instances_limits_release), never by a time or a sweep.
--
-- Such an instance is now parked: it is created parked when it is held
-- because its key is full, and the sweep parks a held one whose time came
-- and whose key it found full, with every other held instance of the key
-- whose time came. The sweep and the next wake read only instances not
-- parked, through instances_deferred, which leaves parked ones out (and
-- paused ones, which wait for a resume, not a time, and were walked as
-- well); a finish of the key admits parked ones whatever time it reads (a
-- parked delayed instance's run_after may still be ahead of a finishing
-- process's clock). An instance admitted, or finished, is no longer
-- parked.
ALTER TABLE instances ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;

DROP INDEX IF EXISTS instances_deferred;
CREATE INDEX instances_deferred ON instances (run_after) WHERE deferred = 1 AND finished_at IS NULL AND parked = 0 AND paused = 0;

CREATE TRIGGER instances_unpark AFTER UPDATE OF held, finished_at ON instances
WHEN NEW.parked = 1 AND (NEW.held = 0 OR NEW.finished_at IS NOT NULL)
BEGIN
    UPDATE instances SET parked = 0 WHERE id = NEW.id;
END;

DROP TRIGGER IF EXISTS instances_limits_release;
CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND OLD.held = 0
BEGIN
    UPDATE instances SET held = 0 WHERE id IN (
        SELECT h.id FROM instances h WHERE h.workflow = OLD.workflow AND h.concurrency_key = OLD.concurrency_key
            AND h.finished_at IS NULL AND h.held = 1
            AND (h.parked = 1 OR h.run_after <= NEW.finished_at OR h.run_after <= h.created_at
                OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = h.id AND s.status = 'pending'
                    AND s.run_after = 253370764800000000 AND s.slots_due = 0))
        ORDER BY h.priority DESC, h.id LIMIT max(0, OLD.concurrency_limit - (SELECT count(*) FROM (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0))));
    UPDATE steps SET held_by_instance = 0 WHERE held_by_instance = 1 AND instance_id IN (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0);
END;
