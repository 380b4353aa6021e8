-- +goose Up
-- A failure a volunteer reports is evidence, not a verdict
-- (internal/store/accounting.go, docs/WORKFLOW.md):
-- - tasks.avoid lists the volunteers that failed, lost or broke the
--   rules of an attempt of the task: none of them gets the task again;
-- - tasks.failed_by lists the volunteers whose failures of the task
--   counted: a task fails for good only when two distinct workers failed
--   it (or one of the operator's own);
-- - workers.strikes counts, decaying by half every half hour, the
--   worker's failures that another worker's result disproved and its
--   results the server refused: a worker with many strikes and few
--   results gets fewer tasks, then none for a while (sched.Standing);
-- - workers.operator marks a connection that presented an operator key
--   (operator_keys): the operator's own machines, whose failures are
--   verdicts as before.
ALTER TABLE tasks ADD COLUMN avoid uuid[], ADD COLUMN failed_by uuid[];
ALTER TABLE workers ADD COLUMN operator boolean NOT NULL DEFAULT false,
    ADD COLUMN strikes double precision NOT NULL DEFAULT 0,
    ADD COLUMN strikes_at timestamptz;

CREATE TABLE operator_keys (
    key_hash    bytea PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE operator_keys;
ALTER TABLE workers DROP COLUMN operator, DROP COLUMN strikes, DROP COLUMN strikes_at;
ALTER TABLE tasks DROP COLUMN avoid, DROP COLUMN failed_by;
