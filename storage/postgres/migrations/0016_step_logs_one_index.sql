-- dagrun schema, version 16: one index on step_logs instead of two.
--
-- Readers select an instance's records, with or without one step, in seq
-- order; trims select one attempt's. step_logs_attempt serves all three
-- (its instance_id, step prefix), so step_logs_step only cost every record
-- one more index insert, in the transaction that finishes the step.
DROP INDEX step_logs_step;
