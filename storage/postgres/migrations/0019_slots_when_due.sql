-- dagrun schema, version 19: a step takes its concurrency slots when it
-- falls due.
--
-- A step held a slot of its key's limit and of its queue's while pending
-- and not held, so a delayed start an hour away held its slot for that
-- hour: with a limit of 1, every other step of the key or queue waited.
-- Now a step made ready before its time (run_after later than ready_at;
-- not a retry, which keeps the slot it ran in) takes no slot and is
-- marked slots_due; no count of a limit's slots counts it while it is
-- pending. The claim's promotion, when its time comes, clears the mark,
-- and steps_limits_due takes its slots then, or holds it until one frees,
-- as a step made ready at that moment would be; then its rate slot
-- (version 18). A mark left on a step held or released since is harmless:
-- the step is checked again when promoted, and counts once it runs.
ALTER TABLE steps ADD COLUMN slots_due boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION limits_key_room(s steps) RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT s.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = s.workflow AND k.name = s.name AND k.concurrency_key = s.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < '9999-01-01 00:00:00+00'
            AND (k.status = 'running' OR NOT k.slots_due) AND k.id <> s.id) < s.concurrency_limit
$$;

CREATE OR REPLACE FUNCTION limits_queue_room(s steps) RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT NOT s.queue_limited OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = s.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited AND c.queue = s.queue
            AND c.status IN ('pending', 'running') AND c.run_after < '9999-01-01 00:00:00+00'
            AND (c.status = 'running' OR NOT c.slots_due) AND c.id <> s.id) >= q.concurrency)
$$;

CREATE OR REPLACE FUNCTION limits_hold() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.slots_due := false;
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

-- limits_due: a step promoted when its time came takes the slots it is
-- due (held until one frees if none is), then its rate slot, staying
-- delayed (not promoted) until that slot when the rate is behind.
CREATE OR REPLACE FUNCTION limits_due() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    slot timestamptz;
BEGIN
    IF OLD.slots_due THEN
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

DROP TRIGGER steps_limits_due ON steps;
CREATE TRIGGER steps_limits_due BEFORE UPDATE OF rate_slot_due, slots_due ON steps FOR EACH ROW
WHEN ((OLD.rate_slot_due OR OLD.slots_due) AND NOT NEW.rate_slot_due AND NOT NEW.slots_due
    AND NEW.promoted AND NEW.status = 'pending')
EXECUTE FUNCTION limits_due();
