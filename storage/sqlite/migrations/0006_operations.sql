-- dagrun schema, version 6: operations on instances.
--
-- paused holds back the claims of an instance's steps: while it is set,
-- its pending steps' run_after is moved far into the future (see
-- storage.PauseShiftMicros), so that claims skip them with the test they
-- make anyway. It is meaningful only while the instance is unfinished.
ALTER TABLE instances ADD COLUMN paused INTEGER NOT NULL DEFAULT 0;
-- actor names who did an operation by hand ("cli", or an API token's
-- name); '' for what the engine did on its own.
ALTER TABLE events ADD COLUMN actor TEXT NOT NULL DEFAULT '';
