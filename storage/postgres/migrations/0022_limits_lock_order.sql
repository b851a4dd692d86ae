-- dagrun schema, version 22: limits' locks are taken in one order.
--
-- Every count of a limit's slots is taken under its advisory lock
-- (migration 10). The locks were taken in no common order, and claims and
-- finishes under limits deadlocked each other, the more the more workers
-- (measured: 75 to 207 deadlocks in a few seconds of 12 to 16 claimers):
--
-- * limits_lock_step took a step's key before its queue, while a finish
--   that freed a queue's slot walked the queue's held steps under the
--   queue's lock, taking each one's key after it;
-- * a claim's promotion locked its batch of due rows (SKIP LOCKED) and
--   then, one row at a time, the limits of each; a finish holding those
--   limits waited for a row the promotion had locked, to release it.
--
-- Locks are now taken workflow keys first ('i'), then queues ('q'), then
-- step keys ('k'), and promote_due takes every lock its batch needs,
-- sorted within each kind, before it locks any row. A transaction that
-- finishes steps has taken its instances' workflow keys, sorted, as it
-- locked the instances (lockInstancesSQL in plan.go), before a trigger
-- takes the steps' limits, and the key again when an instance finishes.
-- What still takes locks out of that order is rare and retried: a finish
-- whose held steps wait on another limited queue than its own, and a
-- finish that readies a step of another limited queue than its own.
CREATE OR REPLACE FUNCTION limits_lock_step(s steps) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF s.queue_limited THEN
        PERFORM limits_lock('q', s.queue, '', '');
    END IF;
    IF s.concurrency_key IS NOT NULL THEN
        PERFORM limits_lock('k', s.workflow, s.name, s.concurrency_key);
    END IF;
END $$;

-- promote_due: the batch of due steps (as in migration 21) is read first
-- without a lock, from steps_delayed; with none due, that one probe is
-- all. Then the limits its steps take as they are promoted (limits_due:
-- only steps marked slots_due count a slot) are locked in lock order, and
-- only then are the rows locked, skipping those another claim is
-- promoting, and promoted one at a time in claim order.
CREATE OR REPLACE FUNCTION promote_due(at timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    batch bigint[];
    l record;
    due bigint;
    n integer := 0;
BEGIN
    batch := ARRAY(
        SELECT id FROM steps
        WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= at
        ORDER BY run_after LIMIT 1000);
    IF cardinality(batch) = 0 THEN
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
        SELECT DISTINCT queue FROM steps WHERE id = ANY (batch) AND slots_due AND queue_limited ORDER BY 1
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

-- limits_release: a step that held a slot and finished frees it. It walked
-- the held steps sharing its key or its queue, highest priority first,
-- while either had room: with its key's slot free and its queue full, it
-- checked every held step of the queue, under the queue's lock, at every
-- finish. It now walks the queue's held steps only while the queue has
-- room, then its key's, highest priority first, while the key has room,
-- passing over those of its own queue once that is full.
CREATE OR REPLACE FUNCTION limits_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c steps;
    at timestamptz := coalesce(NEW.finished_at, now());
    queue_full boolean;
BEGIN
    PERFORM limits_lock_step(OLD);
    IF OLD.queue_limited AND EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = OLD.queue AND q.concurrency > 0) THEN
        FOR c IN SELECT * FROM steps h WHERE h.queue_limited AND h.queue = OLD.queue AND h.status = 'pending'
                AND h.run_after = '9999-01-01 00:00:00+00'
                ORDER BY h.priority DESC, h.id LOOP
            EXIT WHEN NOT limits_queue_room(OLD);
            PERFORM limits_release_step(c, at);
        END LOOP;
    END IF;
    IF OLD.concurrency_key IS NOT NULL THEN
        queue_full := OLD.queue_limited AND NOT limits_queue_room(OLD);
        FOR c IN SELECT * FROM steps h WHERE h.concurrency_key = OLD.concurrency_key AND h.workflow = OLD.workflow
                AND h.name = OLD.name AND h.status = 'pending' AND h.run_after = '9999-01-01 00:00:00+00'
                AND NOT (queue_full AND h.queue_limited AND h.queue = OLD.queue)
                ORDER BY h.priority DESC, h.id LOOP
            EXIT WHEN NOT limits_key_room(OLD);
            PERFORM limits_release_step(c, at);
        END LOOP;
    END IF;
    RETURN NULL;
END $$;
