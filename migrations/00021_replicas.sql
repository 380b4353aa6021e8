-- +goose Up
-- Each replica says every few seconds that it is alive, once for all the
-- workers connected to it (store.TouchReplica), instead of updating every
-- one of its workers' rows: with tens of thousands of volunteers, those
-- updates were most of PostgreSQL's work for idle workers. A connected
-- worker counts as seen when its replica last was (store.Workers), and the
-- workers of a replica silent for long are marked disconnected
-- (store.ForgetReplicaWorkers).
CREATE TABLE replicas (
    name  text PRIMARY KEY,
    seen  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE replicas;
