-- dagrun schema, version 18: a rated queue's steps take their start slot
-- when they fall due.
--
-- A step made ready in a rated queue took the later of its run_after and
-- the rate's next start (tat), and moved tat on past it. A delayed start,
-- a retry's backoff or a snooze an hour away thus moved tat an hour on,
-- and every step of the queue made ready after it waited that hour.
--
-- Now a step that is not due when it is made ready (run_after later than
-- ready_at) keeps its own time and is marked rate_slot_due. The claim's
-- promotion, when that time comes, clears the mark, and steps_limits_due
-- takes the step's slot then: the step runs at once if the rate allows,
-- else it waits out of the claim indexes until the rate's next start. So
-- tat only ever moves for steps that are due, in the order they fall due.
--
-- steps_limits_due runs after the promotion locked the step, and takes
-- the queue's row of queue_limits: the reverse of SetQueueLimit's order.
-- A deadlock between the two is possible, rare, and retried by both.
ALTER TABLE steps ADD COLUMN rate_slot_due boolean NOT NULL DEFAULT false;

CREATE OR REPLACE FUNCTION limits_hold() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.status <> 'running' THEN
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

-- limits_due: a step promoted when its time came takes its rate slot, and
-- stays delayed (not promoted) until that slot when the rate is behind.
CREATE FUNCTION limits_due() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    slot timestamptz;
BEGIN
    slot := limits_rate_slot(NEW.queue, NEW.run_after);
    IF slot > NEW.run_after THEN
        NEW.run_after := slot;
        NEW.promoted := false;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER steps_limits_due BEFORE UPDATE OF rate_slot_due ON steps FOR EACH ROW
WHEN (OLD.rate_slot_due AND NOT NEW.rate_slot_due AND NEW.promoted AND NEW.queue_limited AND NEW.status = 'pending')
EXECUTE FUNCTION limits_due();
