-- dagrun schema, version 11: claims that never walk past future steps.
--
-- A pending step whose run_after was later than its ready_at when it was
-- made pending (a delayed start, a retry backoff, a snooze) cannot run yet.
-- It stays out of the claim indexes, in steps_delayed, until a claim finds
-- its time has come and sets promoted; the claim clears promoted when it
-- takes the step. Claims walk the ready indexes in claim order, so
-- however many steps wait for their time at a higher priority, a claim
-- reads only steps it may take. promoted and ready_at are in the claim
-- indexes so that a claim tells a ready step without reading its row.
ALTER TABLE steps ADD COLUMN promoted INTEGER NOT NULL DEFAULT 0;
-- A pending step without ready_at would sit in neither index.
UPDATE steps SET promoted = 1 WHERE status = 'pending' AND ready_at IS NULL;
DROP INDEX steps_ready;
DROP INDEX steps_ready_queue;
CREATE INDEX steps_ready ON steps (priority DESC, run_after, id, handler, item_concurrency, parent_id, item_index, promoted, ready_at)
    WHERE status = 'pending' AND (promoted = 1 OR run_after <= ready_at);
CREATE INDEX steps_ready_queue ON steps (queue, priority DESC, run_after, id, handler, item_concurrency, parent_id, item_index, promoted, ready_at)
    WHERE status = 'pending' AND (promoted = 1 OR run_after <= ready_at);
CREATE INDEX steps_delayed ON steps (run_after, queue, handler)
    WHERE status = 'pending' AND promoted = 0 AND run_after > ready_at;
