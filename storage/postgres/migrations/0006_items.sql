-- dagrun schema, version 6: items of forEach steps.
--
-- An item is a step-like row: claimed, leased, retried, fenced, recovered
-- and cancelled by the very statements that handle steps. parent_id is the
-- row of its forEach step and item_index its position in the list; a step
-- has parent_id NULL and item_index -1. An item copies its step's
-- instance, position, name, handler, queue, priority and retry policy.
ALTER TABLE steps ADD COLUMN parent_id bigint;
ALTER TABLE steps ADD COLUMN item_index integer NOT NULL DEFAULT -1;
ALTER TABLE steps ADD COLUMN for_each boolean NOT NULL DEFAULT false;
ALTER TABLE steps ADD COLUMN item_concurrency integer NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN continue_on_error boolean NOT NULL DEFAULT false;

-- An instance's steps in definition order are the entries with item_index
-- -1: a lookup that never reads its items, however many there are. The
-- leading instance_id still serves prune's delete.
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_instance_id_position_key;
CREATE UNIQUE INDEX steps_instance ON steps (instance_id, item_index, position);
-- A step's items in index order (paging, the output array), and by status
-- (counts, the concurrency cap, whether any is unfinished).
CREATE UNIQUE INDEX steps_items ON steps (parent_id, item_index) WHERE parent_id IS NOT NULL;
CREATE INDEX steps_items_status ON steps (parent_id, status, item_index) WHERE parent_id IS NOT NULL;
-- Claims take pending items under a concurrency cap apart from the rest,
-- locking their forEach step first: they have a partial index of their
-- own, and the claims' indexes leave them out. With the cap in the
-- predicate, the planner knows every entry of the claims' indexes passes
-- a claim's item_concurrency = 0 (a filter on its own made it estimate
-- few matches, and claims past unserved steps ran 15% slower).
CREATE INDEX steps_ready_capped ON steps (parent_id) WHERE status = 'pending' AND item_concurrency > 0;
DROP INDEX steps_ready;
DROP INDEX steps_ready_queue;
CREATE INDEX steps_ready ON steps (priority DESC, run_after, id) WHERE status = 'pending' AND item_concurrency = 0;
CREATE INDEX steps_ready_queue ON steps (queue, priority DESC, run_after, id) WHERE status = 'pending' AND item_concurrency = 0;
