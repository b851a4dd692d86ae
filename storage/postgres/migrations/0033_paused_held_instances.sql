-- dagrun schema, version 33: a paused held instance is not admitted.
--
-- A finish of an instance under a workflow concurrency limit admitted the
-- next held instances of its key, paused ones too. A paused one admitted
-- so kept the key's slot while nothing of it could run, and the others
-- waited behind it; its steps, put off by the pause, were not released
-- when it was admitted, nor by its resume, so it never ran and its key
-- stayed full for good. Paused instances are now passed over, as the
-- releases of steps pass over paused steps; a resume admits the instance
-- when its key has room (and releases its held steps that fit). The
-- function is restated whole; only the paused term is new.
CREATE OR REPLACE FUNCTION limits_instance_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    h text;
    c steps;
    admitted bigint := limits_admitted(OLD.workflow, OLD.concurrency_key);
BEGIN
    FOR h IN SELECT i.id FROM instances i WHERE i.workflow = OLD.workflow AND i.concurrency_key = OLD.concurrency_key
            AND i.finished_at IS NULL AND i.held AND NOT i.paused
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
