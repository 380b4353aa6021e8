-- +goose Up
-- The attempts the lease reaper ended, by worker, for a day
-- (store.expireSQL). The reaper judges which of a silent worker's
-- attempts may have run by their rank among those the worker held: still
-- running, or ended by an earlier pass of the same silence. Without the
-- latter, the attempts left for a later pass (a lease that lapsed a
-- moment later, a pass limit reached) moved up into the ranks that may
-- have run, and were charged. A table of its own, written by the reaper
-- alone: an index on attempts by worker would cost every claim an entry,
-- and one that named their state every completion its update in place.
CREATE TABLE lapsed_attempts (
    worker_id   uuid NOT NULL,
    attempt_id  bigint NOT NULL,
    ended_at    timestamptz NOT NULL,
    PRIMARY KEY (worker_id, attempt_id)
);
CREATE INDEX lapsed_attempts_ended ON lapsed_attempts (ended_at);

-- +goose Down
DROP TABLE lapsed_attempts;
