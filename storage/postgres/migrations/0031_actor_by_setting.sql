-- dagrun schema, version 31: an operation's actor on every event it writes.
--
-- An operation by hand (a cancel, a retry, a pause, a signal) stamped the
-- events of the instance it named with its actor, after writing them. The
-- instances it changed with that one went unstamped: the descendants a
-- cancel or a pause reaches, the parent whose step a cancelled child
-- fails. Its transaction now sets dagrun.actor first, and every event
-- written in it takes that as its actor.
ALTER TABLE events ALTER COLUMN actor SET DEFAULT coalesce(current_setting('dagrun.actor', true), '');
