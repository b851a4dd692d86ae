-- dagrun schema, version 19: held work goes by priority.
--
-- A step or an instance that a concurrency limit or a queue's concurrency
-- holds was released oldest first, whatever its priority: an urgent
-- instance started behind a thousand routine ones of the same key waited
-- for all of them, though a ready step of it would have been claimed
-- first. Held steps and instances now go as ready steps are claimed:
-- highest priority first, then oldest (by id, that is creation order).
-- The indexes the releases read order their rows so, after the columns
-- a release fixes, so that picking the next held one reads one entry
-- however many wait; the counts of a limit's slots read their prefixes
-- as before. The release trigger's picks repeat the partial indexes'
-- status term (status IN ('pending', 'running')), which SQLite does not
-- infer from status = 'pending': without it they scanned the whole steps
-- table, history included, at every finish of a limited step.
DROP INDEX IF EXISTS steps_concurrency;
CREATE INDEX steps_concurrency ON steps (workflow, name, concurrency_key, run_after, priority DESC)
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'running');
DROP INDEX IF EXISTS steps_queue_limited;
CREATE INDEX steps_queue_limited ON steps (queue, run_after, priority DESC)
    WHERE queue_limited = 1 AND status IN ('pending', 'running');
DROP INDEX IF EXISTS instances_concurrency;
CREATE INDEX instances_concurrency ON instances (workflow, concurrency_key, held, priority DESC, id)
    WHERE concurrency_key IS NOT NULL AND finished_at IS NULL;

DROP TRIGGER IF EXISTS steps_limits_release;
DROP TRIGGER IF EXISTS instances_limits_release;

CREATE TRIGGER steps_limits_release AFTER UPDATE OF finished_at ON steps
WHEN OLD.status IN ('pending', 'running') AND NEW.status NOT IN ('pending', 'running')
    AND OLD.run_after < 253370764800000000 AND (OLD.concurrency_key IS NOT NULL OR OLD.queue_limited = 1)
BEGIN
    UPDATE steps SET run_after = coalesce(NEW.finished_at, OLD.run_after) WHERE id = (
        SELECT h.id FROM steps h WHERE h.concurrency_key = OLD.concurrency_key AND h.workflow = OLD.workflow
            AND h.name = OLD.name AND h.status = 'pending' AND h.status IN ('pending', 'running') AND h.run_after = 253370764800000000
            AND h.held_by_instance = 0
    AND (h.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = h.workflow AND k.name = h.name AND k.concurrency_key = h.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> h.id) < h.concurrency_limit)
    AND (h.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = h.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = h.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> h.id) >= q.concurrency))
        ORDER BY h.priority DESC, h.id LIMIT 1);
    UPDATE steps SET run_after = coalesce(NEW.finished_at, OLD.run_after) WHERE id = (
        SELECT h.id FROM steps h WHERE OLD.queue_limited = 1 AND h.queue_limited = 1 AND h.queue = OLD.queue
            AND h.status = 'pending' AND h.status IN ('pending', 'running') AND h.run_after = 253370764800000000
            AND h.held_by_instance = 0
    AND (h.concurrency_key IS NULL OR (SELECT count(*) FROM steps k
        WHERE k.workflow = h.workflow AND k.name = h.name AND k.concurrency_key = h.concurrency_key
            AND k.status IN ('pending', 'running') AND k.run_after < 253370764800000000 AND (k.status = 'running' OR k.slots_due = 0) AND k.id <> h.id) < h.concurrency_limit)
    AND (h.queue_limited = 0 OR NOT EXISTS (SELECT 1 FROM queue_limits q WHERE q.queue = h.queue AND q.concurrency > 0
        AND (SELECT count(*) FROM steps c WHERE c.queue_limited = 1 AND c.queue = h.queue
            AND c.status IN ('pending', 'running') AND c.run_after < 253370764800000000 AND (c.status = 'running' OR c.slots_due = 0) AND c.id <> h.id) >= q.concurrency))
        ORDER BY h.priority DESC, h.id LIMIT 1);
END;

-- An admitted instance that finishes admits the held ones of its key
-- whose time has come, highest priority first, then oldest, and releases
-- their held steps that fit.
CREATE TRIGGER instances_limits_release AFTER UPDATE OF finished_at ON instances
WHEN OLD.finished_at IS NULL AND NEW.finished_at IS NOT NULL AND OLD.concurrency_key IS NOT NULL AND OLD.held = 0
BEGIN
    UPDATE instances SET held = 0 WHERE id IN (
        SELECT h.id FROM instances h WHERE h.workflow = OLD.workflow AND h.concurrency_key = OLD.concurrency_key
            AND h.finished_at IS NULL AND h.held = 1 AND h.run_after <= NEW.finished_at
        ORDER BY h.priority DESC, h.id LIMIT max(0, OLD.concurrency_limit - (SELECT count(*) FROM (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0))));
    UPDATE steps SET held_by_instance = 0 WHERE held_by_instance = 1 AND instance_id IN (SELECT a.id FROM instances a WHERE a.workflow = OLD.workflow AND a.concurrency_key = OLD.concurrency_key AND a.finished_at IS NULL AND a.held = 0);
END;
