-- dagrun schema, version 3: schedules.
--
-- One row per schedule of a workflow, keyed by its position in the
-- workflow's schedule: list. fingerprint is the engine's hash of the
-- schedule's cron, zone and input: when the entry at a position changes,
-- its row starts over from the change. last_tick is the latest tick
-- handled (fired or skipped), or the registration time before the first:
-- a tick fires only when it is after it, and firing advances it in the
-- transaction that creates the instance, so two schedulers cannot both
-- start one tick.
CREATE TABLE schedules (
    workflow         TEXT NOT NULL,
    position         INTEGER NOT NULL,
    fingerprint      TEXT NOT NULL,
    last_tick        INTEGER NOT NULL,
    paused           INTEGER NOT NULL DEFAULT 0,
    last_instance_id TEXT NOT NULL DEFAULT '',
    fired            INTEGER NOT NULL DEFAULT 0,
    skipped          INTEGER NOT NULL DEFAULT 0,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (workflow, position)
) WITHOUT ROWID;
