-- dagrun schema, version 26: a held instance whose time has come is
-- admitted by the next finish of its key, whatever time that finish reads.
--
-- limits_instance_release admitted the held instances of the key with
-- run_after <= NEW.finished_at: due by the finishing transaction's clock.
-- That clock is read as the transaction begins, and may be another
-- machine's: an instance created under a full key while the finish ran,
-- or by a process whose clock is ahead, has a later run_after, was passed
-- over, and stayed held until the next finish of its key, which might
-- never come (its step waited at run_after 9999 for a release, and no
-- promotion looks at it). Now an instance is due also when it was never
-- delayed (run_after is its creation time), or when one of its steps is
-- parked for a slot after its delayed start fell due (a promotion that
-- found the key full: run_after 9999, no longer slots_due). A delayed
-- instance whose time has not come by any of those is still left for the
-- promotion of its first step.
CREATE OR REPLACE FUNCTION limits_instance_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    h text;
    c steps;
    admitted bigint := limits_admitted(OLD.workflow, OLD.concurrency_key);
BEGIN
    FOR h IN SELECT i.id FROM instances i WHERE i.workflow = OLD.workflow AND i.concurrency_key = OLD.concurrency_key
            AND i.finished_at IS NULL AND i.held
            AND (i.run_after <= NEW.finished_at OR i.run_after <= i.created_at
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
