-- dagrun schema, version 9: trace context and step logs.
--
-- traceparent is the W3C traceparent of the instance's span, chosen when
-- it starts; trace_caller the span ID of the caller's span it is a child
-- of. Both NULL when tracing is off.
ALTER TABLE instances ADD COLUMN traceparent TEXT;
ALTER TABLE instances ADD COLUMN trace_caller TEXT;

-- What handlers logged, per attempt. seq is the rowid: it grows with every
-- record stored, so a reader follows a step with "seq > the last it saw".
-- The engine keeps each attempt's records bounded, dropping the oldest.
CREATE TABLE step_logs (
    seq         INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL REFERENCES instances (id) ON DELETE CASCADE,
    step        TEXT NOT NULL,
    item        INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    level       TEXT NOT NULL,
    message     TEXT NOT NULL,
    attrs       TEXT
);
CREATE INDEX step_logs_step ON step_logs (instance_id, step, seq);
CREATE INDEX step_logs_attempt ON step_logs (instance_id, step, attempt, item, seq);
