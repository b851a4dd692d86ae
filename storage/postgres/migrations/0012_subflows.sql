-- dagrun schema, version 12: child instances (workflow steps).
--
-- A child instance names the step that started it: parent_id, the
-- parent's step (by name) and, for a child of a forEach item, the item's
-- index (-1 otherwise). depth is 0 for a top-level instance. A workflow
-- step's row (or item) carries the child workflow's name and, once
-- started, its child's ID: running with no lease while the child runs, so
-- no claim and no lease recovery ever takes it.
ALTER TABLE instances ADD COLUMN parent_id text;
ALTER TABLE instances ADD COLUMN parent_step text NOT NULL DEFAULT '';
ALTER TABLE instances ADD COLUMN parent_item int NOT NULL DEFAULT -1;
ALTER TABLE instances ADD COLUMN depth int NOT NULL DEFAULT 0;
-- Children of an instance: cancel and retry cascades, list --parent, prune.
CREATE INDEX instances_parent ON instances (parent_id, id) WHERE parent_id IS NOT NULL;

ALTER TABLE steps ADD COLUMN child_workflow text NOT NULL DEFAULT '';
ALTER TABLE steps ADD COLUMN child_id text NOT NULL DEFAULT '';
