-- dagrun schema, version 16: what a step logged before it completed is
-- kept with its completion.
--
-- A handler that logs one record per step cost chain4 7-9% of its
-- throughput, nearly all of it the record's row in step_logs and its
-- index entry (measured by leaving the insert out). Most steps finish
-- before the worker's next flush, so their records reach the store with
-- their completion, whose event is written anyway: the event now carries
-- them, as a JSON array of [at, level, message, attrs] in logs, the
-- first record's seq in log_seq and the next ones' following it. Records
-- written while a step runs, those of failures, retries and items, still
-- go to step_logs. Both take their seqs from log_seqs, whose one row
-- only grows, so a follower reading after a seq misses none of either.
ALTER TABLE events ADD COLUMN log_seq INTEGER;
ALTER TABLE events ADD COLUMN logs TEXT;
CREATE TABLE log_seqs (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL
);
INSERT INTO log_seqs (id, last) SELECT 1, coalesce(max(seq), 0) FROM step_logs;
