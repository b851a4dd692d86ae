-- dagrun schema, version 14: step logs keyed by their step's row.
--
-- Each record named its step by (instance_id, step) as text, in the row
-- and again in step_logs_attempt: about 45 bytes of each index entry. A
-- worker finishing steps of many instances in one commit put its records'
-- entries at as many places in that index, so the commit wrote a page of
-- the index for every few records. Keyed by the step's row ID (the row of
-- the step itself, never of an item: rerunning a forEach step deletes its
-- items, not what they logged), an entry takes about 14 bytes, five times
-- as many share a page, and the records themselves are a third smaller.
-- The cascade from steps, from instances, still deletes them with their
-- instance.
CREATE TABLE step_logs_by_step (
    seq     INTEGER PRIMARY KEY,
    step_id INTEGER NOT NULL REFERENCES steps (id) ON DELETE CASCADE,
    item    INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    level   TEXT NOT NULL,
    message TEXT NOT NULL,
    attrs   TEXT
);
INSERT INTO step_logs_by_step (seq, step_id, item, attempt, at, level, message, attrs)
SELECT l.seq, s.id, l.item, l.attempt, l.at, l.level, l.message, l.attrs
FROM step_logs AS l JOIN steps AS s ON s.instance_id = l.instance_id AND s.item_index = -1 AND s.name = l.step
ORDER BY l.seq;
DROP TABLE step_logs;
ALTER TABLE step_logs_by_step RENAME TO step_logs;
CREATE INDEX step_logs_attempt ON step_logs (step_id, attempt, item, seq);
