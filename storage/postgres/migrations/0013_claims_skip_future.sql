-- dagrun schema, version 13: claims that never walk past future steps.
--
-- A pending step whose run_after was later than its ready_at when it was
-- made pending (a delayed start, a retry backoff, a snooze) cannot run yet.
-- It stays out of the claim indexes, in steps_delayed, until a claim finds
-- its time has come and sets promoted; the claim clears promoted when it
-- takes the step. Claims walk the ready indexes in claim order, so
-- however many steps wait for their time at a higher priority, a claim
-- reads only steps it may take.
ALTER TABLE steps ADD COLUMN promoted boolean NOT NULL DEFAULT false;
-- A pending step without ready_at would sit in neither index.
UPDATE steps SET promoted = true WHERE status = 'pending' AND ready_at IS NULL;
DROP INDEX steps_ready;
DROP INDEX steps_ready_queue;
CREATE INDEX steps_ready ON steps (priority DESC, run_after, id)
    WHERE status = 'pending' AND item_concurrency = 0 AND (promoted OR run_after <= ready_at);
CREATE INDEX steps_ready_queue ON steps (queue, priority DESC, run_after, id)
    WHERE status = 'pending' AND item_concurrency = 0 AND (promoted OR run_after <= ready_at);
CREATE INDEX steps_delayed ON steps (run_after)
    WHERE status = 'pending' AND NOT promoted AND run_after > ready_at;
