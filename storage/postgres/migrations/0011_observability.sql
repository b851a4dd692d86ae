-- dagrun schema, version 11: trace context and step logs.
--
-- traceparent is the W3C traceparent of the instance's span, chosen when
-- it starts; trace_caller the span ID of the caller's span it is a child
-- of. Both NULL when tracing is off.
ALTER TABLE instances ADD COLUMN traceparent text;
ALTER TABLE instances ADD COLUMN trace_caller text;

-- What handlers logged, per attempt. seq grows with every record stored,
-- so a reader follows a step with "seq > the last it saw". The engine
-- keeps each attempt's records bounded, dropping the oldest. Like steps
-- and events, no foreign key: prune deletes an instance's logs with it.
CREATE TABLE step_logs (
    seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    instance_id text NOT NULL,
    step        text NOT NULL,
    item        int NOT NULL,
    attempt     int NOT NULL,
    at          timestamptz NOT NULL,
    level       text NOT NULL,
    message     text NOT NULL,
    attrs       json
);
CREATE INDEX step_logs_step ON step_logs (instance_id, step, seq);
CREATE INDEX step_logs_attempt ON step_logs (instance_id, step, attempt, item, seq);
