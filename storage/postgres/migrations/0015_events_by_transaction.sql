-- dagrun schema, version 15: a follower reads an instance's new events by
-- the transaction that wrote them.
--
-- A transaction takes its events' IDs when it inserts them, not when it
-- commits, so the events of another transaction with greater IDs may
-- become visible first: a follower resuming after the greatest ID it saw
-- would miss the late ones for good. Each event now records the ID of its
-- (top-level) transaction, which is what a snapshot lists. Every event a
-- snapshot cannot see has a tx at or above the snapshot's xmin, so a
-- follower keeps its last snapshot and reads, through this index, the
-- events of transactions from that xmin on that the snapshot did not see:
-- exactly those that became visible since, each once, however long the
-- history. Events written before this version have no tx: they all
-- committed before it (the ALTER waited for their transactions).
ALTER TABLE events ADD COLUMN tx xid8;
ALTER TABLE events ALTER COLUMN tx SET DEFAULT pg_current_xact_id();
CREATE INDEX events_instance_tx ON events (instance_id, tx);
