-- +goose Up
-- When each replica's process started (store.StartReplica): a worker that
-- connected before its replica's latest start was connected to a process
-- that has since died or stopped, and its attempts get the same time to
-- come back as those of a replica that fell silent (store.SweepLeases),
-- even when the replica came back under its name at once.
-- A row written by TouchReplica alone (an older replica) has no known
-- start: -infinity, which no worker's connection precedes.
ALTER TABLE replicas ADD COLUMN started timestamptz NOT NULL DEFAULT '-infinity';

-- +goose Down
ALTER TABLE replicas DROP COLUMN started;
