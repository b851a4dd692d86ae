-- dagrun schema, version 20: an instance that starts later is admitted
-- under its workflow's concurrency limit when its time comes.
--
-- An instance was admitted (or held) as it was created, so one started
-- with a delay of an hour held its key's slot for that hour, and with a
-- limit of 1 every other instance of the key waited. Now it is created
-- held, taking no slot (storage.Admit). Its first steps wait for their
-- time out of the claim indexes (version 19); when the claim's promotion
-- finds one due, limits_due admits the instance if its key has a free
-- slot, and the step then takes its own slots. An instance that found no
-- slot stays held, and the next admitted instance of its key to finish
-- admits the oldest held ones that are due, as before, never one whose
-- time has not come.
--
-- limits_due runs in a BEFORE trigger of the promotion, which must not
-- change other rows of steps the same statement may promote: it changes
-- the instance's row, and the other steps of the instance, still marked
-- held_by_instance, read the instance's own flag when they are promoted
-- or made ready (limits_hold).

CREATE FUNCTION limits_admit_due(i text, at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    inst instances;
BEGIN
    SELECT * INTO inst FROM instances WHERE id = i;
    IF NOT FOUND OR NOT inst.held OR inst.finished_at IS NOT NULL OR inst.run_after > at
            OR inst.concurrency_key IS NULL THEN
        RETURN;
    END IF;
    IF limits_admitted(inst.workflow, inst.concurrency_key) < inst.concurrency_limit THEN
        UPDATE instances SET held = false WHERE id = i AND held AND finished_at IS NULL;
    END IF;
END $$;

-- limits_instance_held reads whether a step's instance waits for
-- admission; a step whose instance the statement creating it has not
-- written yet keeps what its creation said.
CREATE FUNCTION limits_instance_held(s steps) RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT coalesce((SELECT held FROM instances WHERE id = s.instance_id AND finished_at IS NULL), s.held_by_instance)
$$;

CREATE OR REPLACE FUNCTION limits_hold() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.slots_due := false;
    IF NEW.held_by_instance THEN
        NEW.held_by_instance := limits_instance_held(NEW);
    END IF;
    IF TG_OP = 'INSERT' OR OLD.status <> 'running' THEN
        IF coalesce(NEW.run_after > NEW.ready_at, false) THEN
            NEW.slots_due := true;
            NEW.rate_slot_due := NEW.queue_limited;
            RETURN NEW;
        END IF;
        PERFORM limits_lock_step(NEW);
        IF NOT limits_fits(NEW) THEN
            NEW.run_after := '9999-01-01 00:00:00+00';
            NEW.rate_slot_due := false;
            RETURN NEW;
        END IF;
    END IF;
    NEW.rate_slot_due := NEW.queue_limited AND coalesce(NEW.run_after > NEW.ready_at, false);
    IF NEW.queue_limited AND NOT NEW.rate_slot_due THEN
        NEW.run_after := limits_rate_slot(NEW.queue, NEW.run_after);
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION limits_due() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    slot timestamptz;
BEGIN
    IF OLD.slots_due THEN
        IF NEW.held_by_instance THEN
            PERFORM limits_admit_due(NEW.instance_id, NEW.run_after);
            NEW.held_by_instance := limits_instance_held(NEW);
        END IF;
        PERFORM limits_lock_step(NEW);
        IF NOT limits_fits(NEW) THEN
            NEW.run_after := '9999-01-01 00:00:00+00';
            NEW.promoted := false;
            RETURN NEW;
        END IF;
    END IF;
    IF OLD.rate_slot_due AND NEW.queue_limited THEN
        slot := limits_rate_slot(NEW.queue, NEW.run_after);
        IF slot > NEW.run_after THEN
            NEW.run_after := slot;
            NEW.promoted := false;
        END IF;
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION limits_instance_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    h text;
    c steps;
    admitted bigint := limits_admitted(OLD.workflow, OLD.concurrency_key);
BEGIN
    FOR h IN SELECT id FROM instances WHERE workflow = OLD.workflow AND concurrency_key = OLD.concurrency_key
            AND finished_at IS NULL AND held AND run_after <= NEW.finished_at ORDER BY id LOOP
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
