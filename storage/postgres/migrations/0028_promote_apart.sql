-- dagrun schema, version 28: claims promote due steps apart.
--
-- While delayed steps are due, every claim promotes a batch of them into
-- the claim indexes (promote_due), and every claim read the same batch:
-- up to 1,000 of the earliest, unlocked, then locked one at a time,
-- skipping the rows other claims held. When many fell due at once, each
-- worker's claim walked the whole batch again, so a fleet of 40 workers
-- visited each due step about 40 times: it drained 4,000 instances whose
-- first steps fell due together at half the rate of 2 workers, spending
-- twice the CPU per instance.
--
-- A due step under no limit (an unlimited queue, no concurrency key, an
-- instance not held) takes no slot and no lock of a limit as it is
-- promoted, so the order of its lock does not matter: such steps are now
-- locked as they are read, SKIP LOCKED, 1,000 at most as before, so concurrent
-- claims take different ones, and promoted in one UPDATE. Steps under
-- limits are promoted as before (read unlocked, their limits' locks taken
-- in lock order, then their rows in claim order), and first: the free
-- rows are locked after every lock of a limit, never before one. The
-- steps under limits are read through an index of their own: read through
-- steps_delayed, every claim walked all the free due steps before them.
CREATE INDEX steps_delayed_limited ON steps (run_after)
    WHERE status = 'pending' AND NOT promoted AND run_after > ready_at
        AND (queue_limited OR concurrency_key IS NOT NULL OR held_by_instance);

CREATE OR REPLACE FUNCTION promote_due(at timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    batch bigint[];
    idle text[];
    l record;
    idle_queue text;
    due bigint;
    n integer := 0;
    promoted_free integer;
BEGIN
    batch := ARRAY(
        SELECT id FROM steps
        WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= at
            AND (queue_limited OR concurrency_key IS NOT NULL OR held_by_instance)
        ORDER BY run_after LIMIT 1000);
    idle := ARRAY(
        SELECT q.queue FROM queue_limits q
        WHERE q.interval_us > 0
            AND (SELECT count(*) FROM (SELECT FROM steps s WHERE s.queue = q.queue AND s.queue_limited
                AND s.status = 'pending' AND s.run_after <= at LIMIT 2) late) = 2
            AND coalesce((SELECT max(x.started_at) FROM steps x
                WHERE x.queue = q.queue AND x.queue_limited AND x.started_at IS NOT NULL), 'epoch')
                < at - greatest(q.interval_us, 1000000) * interval '1 microsecond'
        ORDER BY 1);
    IF cardinality(batch) > 0 OR cardinality(idle) > 0 THEN
        FOR l IN
            SELECT DISTINCT i.workflow, i.concurrency_key FROM steps s JOIN instances i ON i.id = s.instance_id
            WHERE s.id = ANY (batch) AND s.slots_due AND s.held_by_instance
                AND i.held AND i.concurrency_key IS NOT NULL
            ORDER BY 1, 2
        LOOP
            PERFORM limits_lock('i', l.workflow, l.concurrency_key, '');
        END LOOP;
        FOR l IN
            SELECT queue FROM steps WHERE id = ANY (batch) AND slots_due AND queue_limited
            UNION
            SELECT unnest(idle)
            ORDER BY 1
        LOOP
            PERFORM limits_lock('q', l.queue, '', '');
        END LOOP;
        FOR l IN
            SELECT DISTINCT workflow, name, concurrency_key FROM steps
            WHERE id = ANY (batch) AND slots_due AND concurrency_key IS NOT NULL
            ORDER BY 1, 2, 3
        LOOP
            PERFORM limits_lock('k', l.workflow, l.name, l.concurrency_key);
        END LOOP;
        FOREACH idle_queue IN ARRAY idle
        LOOP
            PERFORM respace_queue(idle_queue, at, true);
        END LOOP;
        -- The steps that were ready already and now start at once wait among
        -- the delayed ones too: promote them with the batch.
        IF cardinality(idle) > 0 THEN
            batch := batch || ARRAY(
                SELECT id FROM steps
                WHERE queue = ANY (idle) AND queue_limited AND status = 'pending' AND NOT promoted
                    AND run_after > ready_at AND run_after <= at AND NOT slots_due AND NOT (id = ANY (batch)));
        END IF;
        FOR due IN
            SELECT id FROM steps
            WHERE id = ANY (batch) AND status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= at
            ORDER BY priority DESC, run_after, id
            FOR NO KEY UPDATE SKIP LOCKED
        LOOP
            UPDATE steps SET promoted = true, rate_slot_due = false, slots_due = false WHERE id = due;
            n := n + 1;
        END LOOP;
    END IF;
    -- Due steps under no limit, after any limits' lock: locked as read,
    -- skipping those another claim is promoting.
    WITH free AS (
        SELECT id FROM steps
        WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= at
            AND NOT queue_limited AND concurrency_key IS NULL AND NOT held_by_instance
        ORDER BY run_after LIMIT 1000
        FOR NO KEY UPDATE SKIP LOCKED
    )
    UPDATE steps s SET promoted = true, rate_slot_due = false, slots_due = false
    FROM free WHERE s.id = free.id;
    GET DIAGNOSTICS promoted_free = ROW_COUNT;
    RETURN n + promoted_free;
END $$;
