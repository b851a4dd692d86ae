-- dagrun schema, version 23: a finish takes its instance's workflow key
-- before its step's limits.
--
-- Starting an instance under a workflow-level key locks the key (to count
-- what it admits) and then, as its first steps are inserted, their
-- queues' and keys' limits. A finish that freed a step's limits
-- (limits_release) took them first, and the key after them when the same
-- transaction finished the instance (limits_instance_release): a start
-- and a finish of the same key deadlocked, again and again when starts
-- and finishes ran side by side, until one of them outlived the store's
-- retries. limits_release now takes the workflow key of the step's
-- instance first, as every other path does (migration 22's order: 'i',
-- then 'q', then 'k'). A finish of steps of instances under several
-- workflow keys has taken them all by then, sorted, as it locked the
-- instances (lockInstancesSQL in plan.go); this covers a step finished
-- by a statement that locked no instance first.
CREATE OR REPLACE FUNCTION limits_release() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    c steps;
    at timestamptz := coalesce(NEW.finished_at, now());
    queue_full boolean;
    inst instances;
BEGIN
    SELECT * INTO inst FROM instances WHERE id = OLD.instance_id AND concurrency_key IS NOT NULL AND NOT held;
    IF FOUND THEN
        PERFORM limits_lock('i', inst.workflow, inst.concurrency_key, '');
    END IF;
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
