-- +goose Up
-- The dashboard's volunteers page counts each connected worker's
-- successful attempts every few seconds; without an index on the worker
-- that was a scan of all attempts per worker. Attempts enter this index once,
-- when they succeed (that update is not a HOT update anyway: it leaves the
-- attempts_running index).
CREATE INDEX attempts_succeeded_worker ON attempts (worker_id) WHERE state = 'succeeded';

-- +goose Down
DROP INDEX attempts_succeeded_worker;
