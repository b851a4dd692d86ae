-- dagrun schema, version 21: delayed work that falls due together goes by
-- priority.
--
-- A claim promotes the delayed steps whose time has come (a delayed start,
-- a retry's backoff, a snooze), and a step under limits takes its slots as
-- it is promoted, or is held (limits_due, migration 18). The promotion was
-- one UPDATE of the batch, whose rows PostgreSQL visits in no set order, so
-- of the steps that fell due together the first visited took a free slot,
-- whatever its priority. promote_due promotes the batch, still chosen
-- earliest first and bounded, one step at a time in claim order: highest
-- priority, then earliest, then oldest.
CREATE FUNCTION promote_due(at timestamptz) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    due bigint;
    n integer := 0;
BEGIN
    FOR due IN
        SELECT d.id FROM (
            SELECT id, priority, run_after FROM steps
            WHERE status = 'pending' AND NOT promoted AND run_after > ready_at AND run_after <= at
            ORDER BY run_after LIMIT 1000
            FOR NO KEY UPDATE SKIP LOCKED
        ) d
        ORDER BY d.priority DESC, d.run_after, d.id
    LOOP
        UPDATE steps SET promoted = true, rate_slot_due = false, slots_due = false WHERE id = due;
        n := n + 1;
    END LOOP;
    RETURN n;
END $$;
