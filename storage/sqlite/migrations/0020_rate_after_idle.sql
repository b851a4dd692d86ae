-- dagrun schema, version 20: a rated queue's latest start, found at once.
--
-- A rate gives each step of its queue a start time (a slot) as the step
-- becomes ready. Steps that became ready while no worker of the queue ran
-- kept the slots that passed meanwhile, and all started together when a
-- worker came. A claim now gives such a queue's waiting steps their slots
-- again from its own time when two or more could start at once and
-- nothing of the queue started for longer than the rate's interval (or a
-- second, if that is longer); it asks this index for the queue's latest
-- start, one entry read however long the queue's history.
CREATE INDEX steps_rate_starts ON steps (queue, started_at)
    WHERE queue_limited = 1 AND started_at IS NOT NULL;
