-- dagrun schema, version 10: concurrency limits.
--
-- Limits are decided when state changes, never by the claim, whose index
-- walk stays as it was: a ready step that may not run yet is held, that is
-- pending with run_after 9999-01-01 (storage.HeldUntil), which no claim
-- reaches. A step holds a slot of its limits while it is pending and not
-- held, or running. Triggers hold a step that becomes ready without a free
-- slot, and release the oldest held ones (by id, that is creation order)
-- when a slot frees, whatever path finished the step or instance. Every
-- count of a limit's slots is taken under a transaction-scoped advisory
-- lock of that limit (its key, or its queue), after which each statement
-- of these VOLATILE functions sees what earlier holders committed: two
-- transactions never both take the last slot.
--
-- The functions run with the search_path of this migration (the store's
-- schema), whatever the caller's.

ALTER TABLE instances ADD COLUMN concurrency_key text;
ALTER TABLE instances ADD COLUMN concurrency_limit integer NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN held boolean NOT NULL DEFAULT false;
CREATE INDEX instances_concurrency ON instances (workflow, concurrency_key, held, id)
    WHERE concurrency_key IS NOT NULL AND finished_at IS NULL;

ALTER TABLE steps ADD COLUMN concurrency_key text;
ALTER TABLE steps ADD COLUMN concurrency_limit integer NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN held_by_instance boolean NOT NULL DEFAULT false;
ALTER TABLE steps ADD COLUMN queue_limited boolean NOT NULL DEFAULT false;
-- Only limited steps are in these, so unlimited ones never maintain them.
CREATE INDEX steps_concurrency ON steps (workflow, name, concurrency_key, run_after)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'running');
CREATE INDEX steps_queue_limited ON steps (queue, run_after)
    WHERE queue_limited AND status IN ('pending', 'running');

-- Queue limits, global. interval_us is the spacing a rate allows between
-- two starts; tat the earliest start the rate allows next (GCRA's
-- theoretical arrival time), moved on under this row's lock.
CREATE TABLE queue_limits (
    queue       text PRIMARY KEY,
    concurrency integer NOT NULL DEFAULT 0,
    rate        integer NOT NULL DEFAULT 0,
    per_us      bigint NOT NULL DEFAULT 0,
    interval_us bigint NOT NULL DEFAULT 0,
    tat         timestamptz NOT NULL DEFAULT 'epoch',
    updated_at  timestamptz NOT NULL
);

CREATE FUNCTION limits_lock(kind text, a text, b text, c text) RETURNS void
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(
        current_schema() || chr(31) || kind || chr(31) || a || chr(31) || b || chr(31) || c, 0))
$$;

-- limits_admitted locks a workflow-level key and counts its admitted
-- unfinished instances.
CREATE FUNCTION limits_admitted(wf text, k text) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM limits_lock('i', wf, k, '');
    RETURN (SELECT count(*) FROM instances
        WHERE workflow = wf AND concurrency_key = k AND finished_at IS NULL AND NOT held);
END $$;

-- limits_lock_step locks the limits of a step, its key before its queue.
CREATE FUNCTION limits_lock_step(s steps) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF s.concurrency_key IS NOT NULL THEN
        PERFORM limits_lock('k', s.workflow, s.name, s.concurrency_key);
    END IF;
    IF s.queue_limited THEN
        PERFORM limits_lock('q', s.queue, '', '');
    END IF;
END $$;

-- limits_key_room / limits_queue_room: a slot of the step's key, of its
-- queue, is free (the step itself not counted).
CREATE FUNCTION limits_key_room(s steps) RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT s.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = s.workflow AND k.name = s.name AND k.concurrency_key = s.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < '9999-01-01 00:00:00+00' AND k.id <> s.id) < s.concurrency_limit
$$;

CREATE FUNCTION limits_queue_room(s steps) RETURNS boolean
LANGUAGE sql SET search_path FROM CURRENT AS $$
    SELECT NOT s.queue_limited OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = s.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited AND c.queue = s.queue
            AND c.status IN ('pending', 'running') AND c.run_after < '9999-01-01 00:00:00+00' AND c.id <> s.id) >= q.concurrency)
$$;

CREATE FUNCTION limits_fits(s steps) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RETURN NOT s.held_by_instance AND limits_key_room(s) AND limits_queue_room(s);
END $$;

-- limits_rate_slot takes the queue's next start at or after base.
CREATE FUNCTION limits_rate_slot(q text, base timestamptz) RETURNS timestamptz
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    slot timestamptz;
BEGIN
    UPDATE queue_limits SET tat = greatest(tat, base) + interval_us * interval '1 microsecond'
    WHERE queue = q AND interval_us > 0
    RETURNING tat - interval_us * interval '1 microsecond' INTO slot;
    RETURN coalesce(slot, base);
END $$;

-- limits_hold: a step becoming ready takes a slot or is held; a step
-- made ready again after running keeps its slot. Either start counts
-- against its queue's rate.
CREATE FUNCTION limits_hold() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' OR OLD.status <> 'running' THEN
        PERFORM limits_lock_step(NEW);
        IF NOT limits_fits(NEW) THEN
            NEW.run_after := '9999-01-01 00:00:00+00';
            RETURN NEW;
        END IF;
    END IF;
    IF NEW.queue_limited THEN
        NEW.run_after := limits_rate_slot(NEW.queue, NEW.run_after);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER steps_limits_insert BEFORE INSERT ON steps FOR EACH ROW
WHEN (NEW.status = 'pending' AND (NEW.concurrency_key IS NOT NULL OR NEW.held_by_instance OR NEW.queue_limited))
EXECUTE FUNCTION limits_hold();

-- Every statement that makes a step ready sets ready_at or run_after, and
-- no claim does: the triggers name columns a claim never writes, so a
-- claim fires none of them.
CREATE TRIGGER steps_limits_ready BEFORE UPDATE OF ready_at, run_after ON steps FOR EACH ROW
WHEN (NEW.status = 'pending' AND OLD.status <> 'pending'
    AND (NEW.concurrency_key IS NOT NULL OR NEW.held_by_instance OR NEW.queue_limited))
EXECUTE FUNCTION limits_hold();

-- limits_release_step releases a held step if it fits, its start at.
CREATE FUNCTION limits_release_step(c steps, at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM limits_lock_step(c);
    IF limits_fits(c) THEN
        UPDATE steps SET run_after = CASE WHEN c.queue_limited THEN limits_rate_slot(c.queue, at) ELSE at END
        WHERE id = c.id AND status = 'pending' AND run_after = '9999-01-01 00:00:00+00';
    END IF;
END $$;

-- limits_release: a step that held a slot and finished frees it for the
-- oldest held steps sharing its key or its queue.
CREATE FUNCTION limits_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c steps;
    at timestamptz := coalesce(NEW.finished_at, now());
BEGIN
    PERFORM limits_lock_step(OLD);
    FOR c IN SELECT * FROM steps h WHERE h.status = 'pending' AND h.run_after = '9999-01-01 00:00:00+00'
            AND ((h.concurrency_key = OLD.concurrency_key AND h.workflow = OLD.workflow AND h.name = OLD.name)
                OR (OLD.queue_limited AND h.queue_limited AND h.queue = OLD.queue))
            ORDER BY h.id LOOP
        EXIT WHEN NOT ((OLD.concurrency_key IS NOT NULL AND limits_key_room(OLD))
            OR (OLD.queue_limited AND limits_queue_room(OLD)));
        PERFORM limits_release_step(c, at);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER steps_limits_release AFTER UPDATE OF finished_at ON steps FOR EACH ROW
WHEN (OLD.status IN ('pending', 'running') AND NEW.status NOT IN ('pending', 'running')
    AND OLD.run_after < '9999-01-01 00:00:00+00' AND (OLD.concurrency_key IS NOT NULL OR OLD.queue_limited))
EXECUTE FUNCTION limits_release();

-- limits_instance_release: an admitted instance that finishes admits the
-- oldest held ones of its key and releases their held steps that fit.
CREATE FUNCTION limits_instance_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    h text;
    c steps;
    admitted bigint := limits_admitted(OLD.workflow, OLD.concurrency_key);
BEGIN
    FOR h IN SELECT id FROM instances WHERE workflow = OLD.workflow AND concurrency_key = OLD.concurrency_key
            AND finished_at IS NULL AND held ORDER BY id LOOP
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

CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances FOR EACH ROW
WHEN (OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND NOT OLD.held)
EXECUTE FUNCTION limits_instance_release();

-- A finished instance retried is admitted again only if there is room;
-- its steps follow at the end of the statement (a retry re-arms them in
-- the same statement, and a BEFORE trigger must not touch those rows).
CREATE FUNCTION limits_instance_rearm() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.held := limits_admitted(NEW.workflow, NEW.concurrency_key) >= NEW.concurrency_limit;
    IF NEW.held THEN
        NEW.status := 'pending';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER instances_limits_rearm BEFORE UPDATE OF finished_at ON instances FOR EACH ROW
WHEN (OLD.finished_at IS NOT NULL AND NEW.finished_at IS NULL AND NEW.concurrency_key IS NOT NULL)
EXECUTE FUNCTION limits_instance_rearm();

CREATE FUNCTION limits_instance_rearmed() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE steps SET held_by_instance = NEW.held WHERE instance_id = NEW.id AND held_by_instance <> NEW.held;
    IF NEW.held THEN
        UPDATE steps SET run_after = '9999-01-01 00:00:00+00' WHERE instance_id = NEW.id AND status = 'pending';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER instances_limits_rearmed AFTER UPDATE OF finished_at ON instances FOR EACH ROW
WHEN (OLD.finished_at IS NOT NULL AND NEW.finished_at IS NULL AND NEW.concurrency_key IS NOT NULL)
EXECUTE FUNCTION limits_instance_rearmed();

-- limits_release_queue releases the held steps of a queue that fit, oldest
-- first, after its limits changed.
CREATE FUNCTION limits_release_queue(q text, at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c steps;
BEGIN
    FOR c IN SELECT * FROM steps WHERE queue = q AND status = 'pending'
            AND run_after = '9999-01-01 00:00:00+00' ORDER BY id LOOP
        PERFORM limits_release_step(c, at);
    END LOOP;
END $$;
