-- +goose Up
-- Whom an attempt's end charges (internal/store/accounting.go): a worker
-- that vanishes while running an attempt no longer uses up one of the
-- task's max_attempts; the task counts it in lost instead, against a
-- separate, generous bound (max_lost).
ALTER TABLE tasks ADD COLUMN lost integer NOT NULL DEFAULT 0,
    ADD COLUMN max_lost integer NOT NULL DEFAULT 10;

-- When the lease reaper last swept (one row). A sweep that comes long
-- after the one before (the database could not be written, no replica
-- ran, the leader changed) first gives every running attempt a fresh
-- lease: leases that lapsed meanwhile are the server's fault, not the
-- workers'.
CREATE TABLE lease_sweeps (
    id  integer PRIMARY KEY CHECK (id = 1),
    at  timestamptz NOT NULL
);

-- +goose Down
DROP TABLE lease_sweeps;
ALTER TABLE tasks DROP COLUMN lost, DROP COLUMN max_lost;
