-- dagrun schema, version 12: instance counts kept as instances change.
--
-- Stats (and so every /metrics scrape) reads how many instances each
-- workflow has in each status from instance_counts instead of counting
-- every instance: a read whose cost does not grow with history. The
-- triggers keep it exact in the very transaction that inserts an
-- instance, changes its status or deletes it, whichever statement does
-- it; SQLite has one writer at a time, so one row per (workflow, status)
-- is never contended.
CREATE TABLE instance_counts (
    workflow TEXT NOT NULL,
    status   TEXT NOT NULL,
    n        INTEGER NOT NULL,
    PRIMARY KEY (workflow, status)
) WITHOUT ROWID;

INSERT INTO instance_counts (workflow, status, n)
SELECT workflow, status, count(*) FROM instances GROUP BY workflow, status;

CREATE TRIGGER instances_count_insert AFTER INSERT ON instances BEGIN
    INSERT INTO instance_counts (workflow, status, n) VALUES (new.workflow, new.status, 1)
        ON CONFLICT (workflow, status) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER instances_count_update AFTER UPDATE OF status ON instances
WHEN old.status IS NOT new.status BEGIN
    UPDATE instance_counts SET n = n - 1 WHERE workflow = old.workflow AND status = old.status;
    INSERT INTO instance_counts (workflow, status, n) VALUES (new.workflow, new.status, 1)
        ON CONFLICT (workflow, status) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER instances_count_delete AFTER DELETE ON instances BEGIN
    UPDATE instance_counts SET n = n - 1 WHERE workflow = old.workflow AND status = old.status;
END;
