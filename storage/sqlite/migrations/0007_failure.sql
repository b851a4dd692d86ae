-- dagrun schema, version 7: workflow timeouts and onFailure steps.
--
-- An instance with a workflow timeout (timeout_us > 0) gets a deadline
-- when it starts; the worker pass that times out waits fails the running
-- instances whose deadline passed. Only running instances with a
-- deadline are in the index, so it stays small however many finished.
ALTER TABLE instances ADD COLUMN timeout_us INTEGER NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN deadline INTEGER;
CREATE INDEX instances_deadline ON instances (deadline) WHERE status = 'running' AND deadline IS NOT NULL;

-- An instance that failed while it has onFailure steps stays running,
-- failing, with its error and the step that failed it, until those steps
-- ended. on_failure marks those steps (and the items of such a step).
ALTER TABLE instances ADD COLUMN failing INTEGER NOT NULL DEFAULT 0;
ALTER TABLE instances ADD COLUMN failed_step TEXT NOT NULL DEFAULT '';
ALTER TABLE steps ADD COLUMN on_failure INTEGER NOT NULL DEFAULT 0;
