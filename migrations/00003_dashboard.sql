-- +goose Up
-- What the owners' dashboard plots over the last hour: connections of
-- workers (a worker keeps its id across reconnections, so workers alone
-- keep only the latest one) and tasks done per minute.

-- One row per connection of a worker; disconnected_at is NULL while it
-- lasts. Rows older than a day are pruned when workers connect.
CREATE TABLE worker_sessions (
    id               bigserial PRIMARY KEY,
    worker_id        uuid NOT NULL,
    connected_at     timestamptz NOT NULL DEFAULT now(),
    disconnected_at  timestamptz
);
CREATE INDEX worker_sessions_open ON worker_sessions (worker_id) WHERE disconnected_at IS NULL;
CREATE INDEX worker_sessions_ended ON worker_sessions (disconnected_at);

-- Tasks done per minute: only done tasks enter this index, once each.
CREATE INDEX tasks_done_at ON tasks (finished_at) WHERE state = 'done';

-- +goose Down
DROP INDEX tasks_done_at;
DROP TABLE worker_sessions;
