-- dagrun schema, version 25: a transaction tells its store which queues'
-- held steps it released.
--
-- The limits' triggers release held steps (a finished step frees its
-- key's or its queue's slot, a finished instance admits the next of its
-- key) inside the statement that finishes, where the store's own
-- bookkeeping of the steps it made ready does not see them: a worker
-- whose last claim found nothing was told of nothing, and the released
-- step waited for its next poll. limits_release_step now also adds the
-- released step's queue, one line each, to the transaction's setting
-- dagrun.released, which the store reads before it commits (txState in
-- store.go) and then treats those queues as made ready.
CREATE OR REPLACE FUNCTION limits_release_step(c steps, at timestamptz) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    told text;
BEGIN
    PERFORM limits_lock_step(c);
    IF limits_fits(c) THEN
        UPDATE steps SET run_after = CASE WHEN c.queue_limited THEN limits_rate_slot(c.queue, at) ELSE at END
        WHERE id = c.id AND status = 'pending' AND run_after = '9999-01-01 00:00:00+00';
        IF FOUND THEN
            told := coalesce(current_setting('dagrun.released', true), '');
            IF strpos(E'\n' || told, E'\n' || c.queue || E'\n') = 0 THEN
                PERFORM set_config('dagrun.released', told || c.queue || E'\n', true);
            END IF;
        END IF;
    END IF;
END $$;
