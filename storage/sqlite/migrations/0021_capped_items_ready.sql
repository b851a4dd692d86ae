-- The ready figures (Stats, the unserved handlers, /metrics) count a
-- capped forEach step's pending items only as far as its cap leaves room,
-- as a claim would take them: they read those items here, each step's in
-- item order, instead of walking the claim index a second time.
CREATE INDEX steps_capped_pending ON steps (parent_id, item_index, run_after) WHERE status = 'pending' AND item_concurrency > 0;
