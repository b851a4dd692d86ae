-- dagrun schema, version 25: claims that pass over ready steps no handler
-- of theirs runs.
--
-- A worker claims only steps of the handlers it has. Its claim walked the
-- ready index in claim order and passed over the steps of other handlers
-- one entry at a time, so every claim of every worker read all the ready
-- steps of a handler no running worker had (a binary not deployed yet, a
-- pool of workers for one handler that fell behind) that came before its
-- own. This index orders each handler's ready steps apart; a claim that
-- finds such steps ahead of its own reads its handlers' heads through it
-- instead (see pickByHandler). It holds only its order's columns: every
-- transition writes its entries, and few claims read it (a claim of one
-- queue reads the queue of each entry from its row).
CREATE INDEX steps_ready_handler ON steps (handler, priority DESC, run_after, id)
    WHERE status = 'pending' AND item_concurrency = 0 AND (promoted = 1 OR run_after <= ready_at);
