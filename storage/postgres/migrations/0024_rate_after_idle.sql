-- dagrun schema, version 24: a rated queue that was idle starts from now.
--
-- A rate gives each step of its queue a start time (a slot) as the step
-- becomes ready. Steps that became ready while no worker of the queue ran
-- kept the slots that passed meanwhile, and all started together when a
-- worker came. promote_due, which a claim now calls also when a queue
-- has a rate, first gives such a queue's waiting steps their slots again
-- from its own time, interval apart in claim order, when two of its steps
-- or more could start now (ready, or due at their slots or at times of
-- their own) and nothing of the queue started for longer than the rate's
-- interval (or a second, if that is longer); the steps whose
-- own time has come (a delayed start, a retry's backoff) take theirs with
-- them, in claim order, rather than as they are promoted. A busy
-- queue's late claims keep their slots, so the rate holds on average under
-- load. The queue's latest start is one entry of steps_rate_starts.
--
-- The queue's lock is taken with the others of its kind, in order, before
-- any row; rows another transaction holds (a claim taking them now) keep
-- their slots rather than be waited for.
CREATE INDEX steps_rate_starts ON steps (queue, started_at)
    WHERE queue_limited AND started_at IS NOT NULL;

-- respace_queue gives queue q's ready steps start times its rate's
-- interval apart from at, in claim order, none before a step's own, and
-- leaves the rate's next start after the last: for a changed rate (the
-- store's SetQueueLimit) and for an idle rated queue (promote_due, with
-- with_due: the steps whose own time has come take their slot here too,
-- rather than as they are promoted). A promoted step given a later start
-- goes back among the delayed steps, where the next wake-up is read. Rows
-- another transaction holds (a claim taking them now) keep their slots
-- rather than be waited for.
CREATE FUNCTION respace_queue(q text, at timestamptz, with_due boolean) RETURNS void
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
    UPDATE queue_limits SET tat = next_start WHERE queue = q;
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
BEGIN
    batch := ARRAY(
        SELECT id FROM steps
        WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= at
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
    IF cardinality(batch) = 0 AND cardinality(idle) = 0 THEN
        RETURN 0;
    END IF;
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
    RETURN n;
END $$;
