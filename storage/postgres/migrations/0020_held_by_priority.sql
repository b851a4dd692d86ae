-- dagrun schema, version 20: held work goes by priority.
--
-- A step or an instance that a concurrency limit or a queue's concurrency
-- holds was released oldest first, whatever its priority: an urgent
-- instance started behind a thousand routine ones of the same key waited
-- for all of them, though a ready step of it would have been claimed
-- first. Held steps and instances now go as ready steps are claimed:
-- highest priority first, then oldest (by id, that is creation order).
-- The indexes the releases read carry that order after the columns a
-- release fixes; the counts of a limit's slots read their prefixes as
-- before.
DROP INDEX IF EXISTS steps_concurrency;
CREATE INDEX steps_concurrency ON steps (workflow, name, concurrency_key, run_after, priority DESC, id)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'running');
DROP INDEX IF EXISTS steps_queue_limited;
CREATE INDEX steps_queue_limited ON steps (queue, run_after, priority DESC, id)
    WHERE queue_limited AND status IN ('pending', 'running');
DROP INDEX IF EXISTS instances_concurrency;
CREATE INDEX instances_concurrency ON instances (workflow, concurrency_key, held, priority DESC, id)
    WHERE concurrency_key IS NOT NULL AND finished_at IS NULL;

-- limits_release: a step that held a slot and finished frees it for the
-- held steps sharing its key or its queue, highest priority first.
CREATE OR REPLACE FUNCTION limits_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c steps;
    at timestamptz := coalesce(NEW.finished_at, now());
BEGIN
    PERFORM limits_lock_step(OLD);
    FOR c IN SELECT * FROM steps h WHERE h.status = 'pending' AND h.run_after = '9999-01-01 00:00:00+00'
            AND ((h.concurrency_key = OLD.concurrency_key AND h.workflow = OLD.workflow AND h.name = OLD.name)
                OR (OLD.queue_limited AND h.queue_limited AND h.queue = OLD.queue))
            ORDER BY h.priority DESC, h.id LOOP
        EXIT WHEN NOT ((OLD.concurrency_key IS NOT NULL AND limits_key_room(OLD))
            OR (OLD.queue_limited AND limits_queue_room(OLD)));
        PERFORM limits_release_step(c, at);
    END LOOP;
    RETURN NULL;
END $$;

-- limits_instance_release: an admitted instance that finishes admits the
-- held ones of its key whose time has come, highest priority first, and
-- releases their held steps that fit.
CREATE OR REPLACE FUNCTION limits_instance_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    h text;
    c steps;
    admitted bigint := limits_admitted(OLD.workflow, OLD.concurrency_key);
BEGIN
    FOR h IN SELECT id FROM instances WHERE workflow = OLD.workflow AND concurrency_key = OLD.concurrency_key
            AND finished_at IS NULL AND held AND run_after <= NEW.finished_at ORDER BY priority DESC, id LOOP
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

-- limits_release_queue releases the held steps of a queue that fit,
-- highest priority first, after its limits changed; it reads them by
-- steps_queue_limited (a queue's limits are cleared after its held steps
-- are released).
CREATE OR REPLACE FUNCTION limits_release_queue(q text, at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c steps;
BEGIN
    FOR c IN SELECT * FROM steps WHERE queue = q AND queue_limited AND status = 'pending'
            AND run_after = '9999-01-01 00:00:00+00' ORDER BY priority DESC, id LOOP
        PERFORM limits_release_step(c, at);
    END LOOP;
END $$;
