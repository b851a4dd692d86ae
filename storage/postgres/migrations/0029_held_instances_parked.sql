-- dagrun schema, version 29: a held instance that found its key full is
-- parked until a finish of its key.
--
-- An instance held by a workflow concurrency limit whose first steps do
-- not run a handler (they wait, or start a child) is deferred: the sweep
-- (StartDeferred) admits it once its time has come and its key has room.
-- The sweep, and the next wake every idle worker reads, found such
-- instances by walking every held one whose time had come and counting
-- its key's admitted instances for each: a backlog of 5,000 behind a full
-- key cost each sweep 2.3 s and each next wake a count per instance.
-- Yet once its time has come and its key is full, a held instance can
-- only be admitted by a finish of its key (limits_instance_release), never
-- by a time or a sweep.
--
-- Such an instance is now parked: it is created parked when it is held
-- because its key is full, and the sweep parks a held one whose time came
-- and whose key it found full, under the key's lock, as it would have
-- admitted it, with every other held instance of the key whose time came.
-- The sweep and the next wake read only instances not parked, through
-- instances_deferred, which leaves parked ones out (and paused ones, which
-- wait for a resume, not a time, and were walked as well); a finish of the
-- key admits parked ones whatever time it reads (a parked delayed
-- instance's run_after may still be ahead of a finishing worker's clock).
-- An instance admitted, or finished, is no longer parked.
ALTER TABLE instances ADD COLUMN parked boolean NOT NULL DEFAULT false;

DROP INDEX IF EXISTS instances_deferred;
CREATE INDEX instances_deferred ON instances (run_after) WHERE deferred AND finished_at IS NULL AND NOT parked AND NOT paused;

CREATE FUNCTION instances_unpark() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.parked := false;
    RETURN NEW;
END $$;

-- Named to fire after instances_limits_rearm, whose admission it sees.
CREATE TRIGGER instances_unpark BEFORE UPDATE ON instances FOR EACH ROW
WHEN (NEW.parked AND (NOT NEW.held OR NEW.finished_at IS NOT NULL))
EXECUTE FUNCTION instances_unpark();

CREATE OR REPLACE FUNCTION limits_admit_due(i text, at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    inst instances;
BEGIN
    SELECT * INTO inst FROM instances WHERE id = i;
    -- A parked instance waits for a finish of its key, which admits it.
    IF NOT FOUND OR NOT inst.held OR inst.parked OR inst.finished_at IS NOT NULL OR inst.run_after > at
            OR inst.concurrency_key IS NULL THEN
        RETURN;
    END IF;
    IF limits_admitted(inst.workflow, inst.concurrency_key) < inst.concurrency_limit THEN
        UPDATE instances SET held = false WHERE id = i AND held AND finished_at IS NULL;
    ELSE
        -- The key is full: so are its other held instances whose time has
        -- come parked, those another transaction has locked left for a
        -- later sweep, rather than waited for in no lock order.
        UPDATE instances SET parked = true WHERE id IN (
            SELECT id FROM instances WHERE workflow = inst.workflow AND concurrency_key = inst.concurrency_key
                AND finished_at IS NULL AND held AND NOT parked AND run_after <= at
            FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION limits_instance_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    h text;
    c steps;
    admitted bigint := limits_admitted(OLD.workflow, OLD.concurrency_key);
BEGIN
    FOR h IN SELECT i.id FROM instances i WHERE i.workflow = OLD.workflow AND i.concurrency_key = OLD.concurrency_key
            AND i.finished_at IS NULL AND i.held
            AND (i.parked OR i.run_after <= NEW.finished_at OR i.run_after <= i.created_at
                OR EXISTS (SELECT 1 FROM steps s WHERE s.instance_id = i.id AND s.status = 'pending'
                    AND s.run_after = '9999-01-01 00:00:00+00' AND NOT s.slots_due))
            ORDER BY i.priority DESC, i.id LOOP
        EXIT WHEN admitted >= OLD.concurrency_limit;
        UPDATE instances SET held = false WHERE id = h AND held AND finished_at IS NULL;
        CONTINUE WHEN NOT FOUND;
        admitted := admitted + 1;
        UPDATE steps SET held_by_instance = false WHERE instance_id = h AND held_by_instance;
        FOR c IN SELECT * FROM steps WHERE instance_id = h AND status = 'pending'
                AND run_after = '9999-01-01 00:00:00+00' ORDER BY id LOOP
            PERFORM limits_release_step(c, NEW.finished_at);
        END LOOP;
    END LOOP;
    RETURN NULL;
END $$;
