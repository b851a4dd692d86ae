-- dagrun schema, version 14: instance counts kept as instances change.
--
-- Stats (and so every /metrics scrape) sums instance_counts instead of
-- counting every instance: a read whose cost does not grow with history.
-- Statement-level triggers keep it exact in the very transaction that
-- inserts instances, changes their status or deletes them, whichever
-- statement does it, with one upsert per (workflow, status) a statement
-- changed, not per instance.
--
-- Each server process (shard = pg_backend_pid()) writes rows of its own:
-- a connection runs one transaction at a time, so no two transactions
-- ever update the same row, and counting costs no lock wait and no
-- deadlock however many workers change instances at once. Shard 0 holds
-- what Stats folds in from the rows of processes that are gone.
CREATE TABLE instance_counts (
    workflow text NOT NULL,
    status   text NOT NULL,
    shard    integer NOT NULL,
    n        bigint NOT NULL,
    PRIMARY KEY (workflow, status, shard)
);

INSERT INTO instance_counts (workflow, status, shard, n)
SELECT workflow, status, 0, count(*) FROM instances GROUP BY workflow, status;

-- search_path is fixed to this schema, where the function finds
-- instance_counts, whatever the calling session's search_path.
CREATE FUNCTION count_instances() RETURNS trigger LANGUAGE plpgsql
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
    ELSE
        INSERT INTO instance_counts AS c (workflow, status, shard, n)
        SELECT workflow, status, pg_backend_pid(), sum(d) FROM (
            SELECT workflow, status, 1 AS d FROM new_rows
            UNION ALL
            SELECT workflow, status, -1 FROM old_rows) x
        GROUP BY workflow, status HAVING sum(d) <> 0
        ON CONFLICT (workflow, status, shard) DO UPDATE SET n = c.n + excluded.n;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER instances_count_insert AFTER INSERT ON instances
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_instances();
CREATE TRIGGER instances_count_update AFTER UPDATE ON instances
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_instances();
CREATE TRIGGER instances_count_delete AFTER DELETE ON instances
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION count_instances();
