-- dagrun schema, version 19: deferred starts.
--
-- An instance created with a delayed start or under a workflow
-- concurrency limit may not start yet. A first step that runs a handler
-- waits for its claim, which waits for the delay and the slot; a first
-- wait step would begin waiting, and a first workflow step start its
-- child, in the creating transaction. The plan leaves those steps blocked
-- and the instance is marked deferred; StartDeferred admits it (when it
-- waits for its time and its key has room) and plans it again once it may
-- start, and clears the mark.
ALTER TABLE instances ADD COLUMN deferred boolean NOT NULL DEFAULT false;
CREATE INDEX instances_deferred ON instances (run_after) WHERE deferred AND finished_at IS NULL;
