-- dagrun schema, version 5: schedules.
--
-- One row per schedule of a workflow, keyed by its position in the
-- workflow's schedule: list. fingerprint is the engine's hash of the
-- schedule's cron, zone and input: when the entry at a position changes,
-- its row starts over from the change. last_tick is the latest tick
-- handled (fired or skipped), or the registration time before the first:
-- a tick fires only when it is after it, and firing advances it in the
-- transaction that creates the instance, under the row's lock, so two
-- schedulers cannot both start one tick.
CREATE TABLE schedules (
    workflow         text NOT NULL,
    position         integer NOT NULL,
    fingerprint      text NOT NULL,
    last_tick        timestamptz NOT NULL,
    paused           boolean NOT NULL DEFAULT false,
    last_instance_id text NOT NULL DEFAULT '',
    fired            bigint NOT NULL DEFAULT 0,
    skipped          bigint NOT NULL DEFAULT 0,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (workflow, position)
);
