-- dagrun schema, version 4: items of forEach steps.
--
-- An item is a step-like row: claimed, leased, retried, fenced, recovered
-- and cancelled by the very statements that handle steps. parent_id is the
-- row of its forEach step and item_index its position in the list; a step
-- has parent_id NULL and item_index -1. An item copies its step's
-- instance, position, name, handler, queue, priority and retry policy.
ALTER TABLE steps ADD COLUMN parent_id INTEGER;
ALTER TABLE steps ADD COLUMN item_index INTEGER NOT NULL DEFAULT -1;
-- On a forEach step and copied to its items, so that a claim reads them
-- from the item's own index entry.
ALTER TABLE steps ADD COLUMN for_each INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN item_concurrency INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN continue_on_error INTEGER NOT NULL DEFAULT 0;

-- An instance's steps in definition order are the entries with item_index
-- -1: a lookup that never reads its items, however many there are. The
-- leading instance_id still serves the cascade from instances.
DROP INDEX steps_instance;
CREATE UNIQUE INDEX steps_instance ON steps (instance_id, item_index, position);
-- A step's items in index order (paging, the output array), and by status
-- (counts, the concurrency cap, whether any is unfinished). Steps are not
-- in them, so a step's writes do not touch them.
CREATE UNIQUE INDEX steps_items ON steps (parent_id, item_index) WHERE parent_id IS NOT NULL;
CREATE INDEX steps_items_status ON steps (parent_id, status, item_index, run_after) WHERE parent_id IS NOT NULL;

-- The claim's pick reads the concurrency cap, and what checking it needs,
-- from the ready index, so that a step's claim stays index-only
-- (item_concurrency is 0 on every step).
DROP INDEX steps_ready;
DROP INDEX steps_ready_queue;
CREATE INDEX steps_ready ON steps (priority DESC, run_after, id, handler, item_concurrency, parent_id, item_index) WHERE status = 'pending';
CREATE INDEX steps_ready_queue ON steps (queue, priority DESC, run_after, id, handler, item_concurrency, parent_id, item_index) WHERE status = 'pending';
