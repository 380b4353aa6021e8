-- +goose Up
-- An attempt's end (succeeded, failed, lost, cancelled) becomes a HOT
-- update, as a task's completion did in 00011: attempts_running and
-- attempts_succeeded_worker named the state in their predicates, so every
-- completion added an entry to each of attempts_pkey, attempts_task and
-- attempts_succeeded_worker.
-- - running_attempts lists the attempts that may be running: a claim adds
--   its attempts, and the lease reaper, which reads it (joined with
--   attempts, whose state is the truth), deletes those that ended.
-- - worker_results counts each worker's successful attempts (the
--   dashboard's "tasks done"), which every replica adds its completions
--   to every few seconds.
-- The table keeps room on each page (fillfactor 50) for the end of the
-- attempts a page holds, and for their lease renewals.
CREATE TABLE running_attempts (
    attempt_id bigint PRIMARY KEY
);
INSERT INTO running_attempts (attempt_id) SELECT id FROM attempts WHERE state = 'running';

CREATE TABLE worker_results (
    worker_id  uuid PRIMARY KEY REFERENCES workers ON DELETE CASCADE,
    succeeded  bigint NOT NULL
);
INSERT INTO worker_results (worker_id, succeeded)
SELECT a.worker_id, count(*) FROM attempts a JOIN workers w ON w.id = a.worker_id WHERE a.state = 'succeeded' GROUP BY a.worker_id;

DROP INDEX attempts_running;
DROP INDEX attempts_succeeded_worker;
ALTER TABLE attempts SET (fillfactor = 50);

-- A deleted task's attempts leave running_attempts with them.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cyclepool_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM running_attempts r USING attempts a, gone g WHERE a.task_id = g.id AND r.attempt_id = a.id;
    DELETE FROM attempts a USING gone g WHERE a.task_id = g.id;
    DELETE FROM task_outputs o USING gone g WHERE o.task_id = g.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cyclepool_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM attempts a USING gone g WHERE a.task_id = g.id;
    DELETE FROM task_outputs o USING gone g WHERE o.task_id = g.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
ALTER TABLE attempts SET (fillfactor = 80);
CREATE INDEX attempts_succeeded_worker ON attempts (worker_id) WHERE state = 'succeeded';
CREATE INDEX attempts_running ON attempts (id) WHERE state = 'running';
DROP TABLE worker_results;
DROP TABLE running_attempts;
