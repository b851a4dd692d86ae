-- dagrun schema, version 18: limits are taken when work falls due.
--
-- A step or instance that starts later (a delayed start, a retry's
-- backoff, a snooze) took its limits as it was made ready: its rate slot
-- moved the queue's next start (tat) past its own time, it held its slot
-- of its key's and its queue's concurrency, and a delayed instance held
-- its workflow key from creation. One start an hour away held back every
-- step or instance sharing the limit for that hour. Now:
--
-- * A step made ready before its time (run_after later than ready_at)
--   keeps its own time and is marked rate_slot_due (it takes no rate slot)
--   and, unless it is a retry, which keeps the slot it ran in, slots_due
--   (it holds no concurrency slot: no count of a limit's slots counts a
--   pending step so marked). The claim's promotion, when its time comes,
--   clears the marks, and limits_due admits its instance if that waits for
--   its time (below), takes its slots or holds it until one frees, then
--   takes its rate slot, staying delayed until that slot when the rate is
--   behind. A mark left on a step held or released since is harmless: the
--   step is checked again when promoted, and counts once it runs.
-- * An instance that starts later is created held (storage.Admit), taking
--   no slot of its workflow key; it is admitted as its first step is
--   promoted if the key has room, else by the next finish of its key, which
--   admits the oldest held instances that are due, never one whose time
--   has not come.
--
-- limits_due runs in a BEFORE trigger of the promotion, which must not
-- change other rows of steps the same statement may promote: it changes
-- the instance's row, and the other steps of the instance, still marked
-- held_by_instance, read the instance's own flag when they are promoted
-- or made ready (limits_hold). It locks the step's row before its limits'
-- advisory locks and the queue's row of queue_limits, the reverse of
-- SetQueueLimit's order: a deadlock between the two is possible, rare,
-- and retried by both.
ALTER TABLE steps ADD COLUMN rate_slot_due boolean NOT NULL DEFAULT false;
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

-- limits_due: a step promoted when its time came (see above).
CREATE FUNCTION limits_due() RETURNS trigger
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

CREATE TRIGGER steps_limits_due BEFORE UPDATE OF rate_slot_due, slots_due ON steps FOR EACH ROW
WHEN ((OLD.rate_slot_due OR OLD.slots_due) AND NOT NEW.rate_slot_due AND NOT NEW.slots_due
    AND NEW.promoted AND NEW.status = 'pending')
EXECUTE FUNCTION limits_due();

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
