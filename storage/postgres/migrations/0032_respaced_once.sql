-- dagrun schema, version 32: an idle rated queue is respaced once a spell.
--
-- A claim that finds a rated queue idle (two or more late steps, no start
-- for longer than the rate's interval or a second) gives its late steps
-- slots again from now (respace_queue, from promote_due). A claimer that
-- could take only a later one (a following start, bound to its instance)
-- found the queue idle again at its step's slot, since the steps before it
-- still had not started, and its slot moved on at each of its claims, for
-- ever. respaced_at is when the last such respace was: the queue is idle
-- again only once a step has started since. Both functions are restated
-- whole; only those lines changed.
ALTER TABLE queue_limits ADD COLUMN respaced_at timestamptz;

CREATE OR REPLACE FUNCTION respace_queue(q text, at timestamptz, with_due boolean) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    r record;
    step interval;
    next_start timestamptz := at;
    first timestamptz;
BEGIN
    SELECT interval_us * interval '1 microsecond' INTO step FROM queue_limits WHERE queue = q;
    IF step IS NULL OR step <= interval '0' THEN
        RETURN;
    END IF;
    FOR r IN
        SELECT id, run_after FROM steps
        WHERE queue = q AND queue_limited AND status = 'pending' AND (NOT rate_slot_due OR with_due AND run_after <= at)
            AND run_after < '9999-01-01 00:00:00+00'
        ORDER BY priority DESC, run_after, id
        FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        first := greatest(r.run_after, next_start);
        next_start := first + step;
        UPDATE steps SET run_after = first, promoted = promoted AND first <= at, rate_slot_due = false WHERE id = r.id;
    END LOOP;
    UPDATE queue_limits SET tat = next_start, respaced_at = CASE WHEN with_due THEN at ELSE respaced_at END WHERE queue = q;
END $$;

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
            AND (q.respaced_at IS NULL OR q.respaced_at <= (SELECT max(x.started_at) FROM steps x
                WHERE x.queue = q.queue AND x.queue_limited AND x.started_at IS NOT NULL))
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
