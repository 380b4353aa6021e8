-- +goose Up
-- Re-checking results accepted without a quorum (adaptive replication) when
-- their worker later loses a quorum (docs/WORKFLOW.md, "Result
-- verification").

-- disputed: the task's result was accepted alone from a worker that later
-- lost a quorum, after its workflow had finished, so it could not be
-- re-checked.
ALTER TABLE tasks ADD COLUMN disputed boolean NOT NULL DEFAULT false;

-- superseded: the attempt ran on inputs that a re-check overturned; its
-- task was reset, so it neither counts as a replica nor excludes its worker.
ALTER TABLE attempts ADD COLUMN superseded boolean NOT NULL DEFAULT false;

-- The results accepted alone, looked up by worker when it loses a quorum.
CREATE INDEX attempts_unverified ON attempts (worker_id) WHERE verdict = 'unverified';

-- +goose Down
DROP INDEX attempts_unverified;
ALTER TABLE attempts DROP COLUMN superseded;
ALTER TABLE tasks DROP COLUMN disputed;
