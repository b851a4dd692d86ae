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
-- Pending items under a concurrency cap, which a claim takes apart from
-- the rest (see capped claims).
CREATE INDEX steps_ready_capped ON steps (parent_id) WHERE status = 'pending' AND item_concurrency > 0;
