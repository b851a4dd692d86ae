-- dagrun schema, version 17: events keyed by (instance_id, id).
--
-- Every reader of events names one instance, and every writer inserts an
-- instance's events. With the key on id alone each event cost two index
-- inserts (events_pkey and events_instance_id), and a generic plan, which
-- PostgreSQL may choose by itself after five executions of a statement,
-- could serve "the events of instance $1 after ID $2" from events_pkey,
-- walking every other instance's later events to find a page. Keyed by
-- (instance_id, id), one index serves every reader and each event costs
-- one index insert fewer.
ALTER TABLE events DROP CONSTRAINT events_pkey;
DROP INDEX events_instance_id;
ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (instance_id, id);
