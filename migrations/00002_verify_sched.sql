-- +goose Up
-- Result verification (replicas and quorum), worker reputation and the
-- run time averages of longest-first scheduling.

-- A workflow's verification: replicas started per task and identical
-- results needed (1 and 1: no verification).
ALTER TABLE workflows
    ADD COLUMN replicas integer NOT NULL DEFAULT 1,
    ADD COLUMN quorum   integer NOT NULL DEFAULT 1;

-- pending: replicas of the task waiting to be claimed (a ready task has
-- pending > 0; a claim takes one per worker). replicas, quorum and
-- max_replicas copy the workflow's verification; result_hash is the
-- accepted hash of a verified task.
ALTER TABLE tasks
    ADD COLUMN pending      integer NOT NULL DEFAULT 1,
    ADD COLUMN replicas     integer NOT NULL DEFAULT 1,
    ADD COLUMN quorum       integer NOT NULL DEFAULT 1,
    ADD COLUMN max_replicas integer NOT NULL DEFAULT 1,
    ADD COLUMN result_hash  text;

-- result_hash: sha256 of a replicated attempt's outputs; verdict: whether
-- it agreed with the accepted quorum ('unverified': accepted alone from a
-- trusted worker); ckpt_ms: the checkpoint interval the attempt was given.
ALTER TABLE attempts
    ADD COLUMN result_hash text,
    ADD COLUMN verdict     text CHECK (verdict IN ('valid', 'invalid', 'unverified')),
    ADD COLUMN ckpt_ms     bigint;

-- Outputs of replicas of a task not yet verified; those of the quorum are
-- copied to task_outputs when it is reached, and all are deleted.
CREATE TABLE attempt_outputs (
    attempt_id  bigint NOT NULL REFERENCES attempts ON DELETE CASCADE,
    name        text NOT NULL,
    data        bytea NOT NULL,
    PRIMARY KEY (attempt_id, name)
);

-- Reputation: results that agreed with (valid) or lost (invalid) a quorum,
-- and the number of valid results since the last invalid one.
ALTER TABLE workers
    ADD COLUMN results_valid   bigint  NOT NULL DEFAULT 0,
    ADD COLUMN results_invalid bigint  NOT NULL DEFAULT 0,
    ADD COLUMN valid_streak    integer NOT NULL DEFAULT 0,
    ADD COLUMN attempts        bigint  NOT NULL DEFAULT 0; -- attempts given (for the loss ratio of the stability class)

-- Average run time per (module, task name), from successful attempts, for
-- longest-first ordering and the checkpoint optimum.
CREATE TABLE runtime_stats (
    module_id  text NOT NULL,
    name       text NOT NULL,
    runs       bigint NOT NULL,
    mean_ms    double precision NOT NULL,
    PRIMARY KEY (module_id, name)
);

-- +goose Down
DROP TABLE runtime_stats, attempt_outputs;
ALTER TABLE workers DROP COLUMN results_valid, DROP COLUMN results_invalid, DROP COLUMN valid_streak, DROP COLUMN attempts;
ALTER TABLE attempts DROP COLUMN result_hash, DROP COLUMN verdict, DROP COLUMN ckpt_ms;
ALTER TABLE tasks DROP COLUMN pending, DROP COLUMN replicas, DROP COLUMN quorum, DROP COLUMN max_replicas, DROP COLUMN result_hash;
ALTER TABLE workflows DROP COLUMN replicas, DROP COLUMN quorum;
