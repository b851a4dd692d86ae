-- dagrun schema, version 2: no foreign keys from steps and events.
--
-- A foreign-key check runs per inserted row and locks the referenced row
-- FOR KEY SHARE, which PostgreSQL writes to the heap and the WAL: creating
-- a four-step instance checked seven times, and every claim and finish
-- locked its instance again for the events it appended. Only the store
-- writes these tables, always in the instance's own transactions, and
-- prune deletes an instance's steps and events with it explicitly. Without
-- the checks a batch start is about a quarter faster. The definitions
-- reference went too: every start of a workflow key-share-locked the same
-- definitions row, a hot spot for concurrent starts, and definitions are
-- never deleted.
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_instance_id_fkey;
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_instance_id_fkey;
ALTER TABLE instances DROP CONSTRAINT IF EXISTS instances_definition_hash_fkey;
