-- dagrun schema, version 23: an UPDATE of no instance counts nothing.
--
-- The instance counts' triggers (migration 14) run once per statement,
-- also for a statement that changed no row, and most UPDATEs of instances
-- change none: a claim's start of the instances of the steps it took finds
-- them running already but for an instance's first step. Each ran the
-- counting INSERT over empty transition tables, planning and executing it
-- for nothing. count_instances now returns at once when an UPDATE changed
-- no row; what it counts is unchanged.
CREATE OR REPLACE FUNCTION count_instances() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO instance_counts AS c (workflow, status, shard, n)
        SELECT workflow, status, pg_backend_pid(), count(*) FROM new_rows GROUP BY workflow, status
        ON CONFLICT (workflow, status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO instance_counts AS c (workflow, status, shard, n)
        SELECT workflow, status, pg_backend_pid(), -count(*) FROM old_rows GROUP BY workflow, status
        ON CONFLICT (workflow, status, shard) DO UPDATE SET n = c.n + excluded.n;
    ELSIF EXISTS (SELECT FROM new_rows) THEN
        INSERT INTO instance_counts AS c (workflow, status, shard, n)
        SELECT workflow, status, pg_backend_pid(), sum(d) FROM (
            SELECT workflow, status, 1 AS d FROM new_rows
            UNION ALL
            SELECT workflow, status, -1 FROM old_rows) x
        GROUP BY workflow, status HAVING sum(d) <> 0
        ON CONFLICT (workflow, status, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END $$;
