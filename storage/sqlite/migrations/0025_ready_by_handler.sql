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
-- instead (see pickByHandler). The columns after id are the claim's
-- filters, so that it reads no table row.
CREATE INDEX steps_ready_handler ON steps (handler, priority DESC, run_after, id, item_concurrency, queue, instance_id, promoted, ready_at)
    WHERE status = 'pending' AND (promoted = 1 OR run_after <= ready_at);
