-- +goose Up
-- A task's completion (state 'done') becomes a HOT update: written in place
-- on its page, with no new entry in any index of tasks. Until now every
-- completion added an entry to each of tasks_pkey, the (workflow_id, name)
-- key and tasks_done_at, because three partial indexes named the state in
-- their predicates. In the dispatch benchmark the completion's update then
-- wrote 4.8 WAL records per task; HOT, it writes one, in half the time.
--
-- So no index of tasks names the state any more:
-- - tasks_ready, the dispatch queue, holds the tasks with replicas left to
--   claim (pending > 0) that have been ready (sort_key set). Every ready
--   task is in it (the check below), and every task that leaves the queue
--   for good has pending set to 0. Readers test the state as well.
-- - tasks_active went: the counts by state of the metrics read the tasks
--   of running workflows instead (workflows_running).
-- - tasks_done_at went: the tasks done per minute (the dashboard's
--   activity) are counted in tasks_done_minutes, which every replica adds
--   its completions to every few seconds.
-- The table keeps room on each page (fillfactor 50) for the claim's new
-- row version and then the completion's in place.
ALTER TABLE tasks ADD CONSTRAINT tasks_ready_queued
    CHECK (state <> 'ready' OR (pending > 0 AND sort_key IS NOT NULL)) NOT VALID;
ALTER TABLE tasks VALIDATE CONSTRAINT tasks_ready_queued;
UPDATE tasks SET pending = 0 WHERE pending > 0 AND state NOT IN ('blocked', 'ready');
-- Earlier versions reset tasks to blocked without clearing sort_key.
UPDATE tasks SET sort_key = NULL WHERE state = 'blocked' AND sort_key IS NOT NULL;

CREATE TABLE tasks_done_minutes (
    minute  timestamptz PRIMARY KEY,
    n       bigint NOT NULL
);
INSERT INTO tasks_done_minutes (minute, n)
SELECT date_trunc('minute', finished_at), count(*) FROM tasks
WHERE state = 'done' AND finished_at >= now() - interval '1 day' GROUP BY 1;

DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (sort_key, id) WHERE pending > 0 AND sort_key IS NOT NULL;
DROP INDEX tasks_active;
DROP INDEX tasks_done_at;
CREATE INDEX workflows_running ON workflows (id) WHERE state = 'running';
ALTER TABLE tasks SET (fillfactor = 50);

-- +goose Down
ALTER TABLE tasks RESET (fillfactor);
DROP INDEX workflows_running;
CREATE INDEX tasks_done_at ON tasks (finished_at) WHERE state = 'done';
CREATE INDEX tasks_active ON tasks (state) WHERE state IN ('blocked', 'ready', 'running');
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (sort_key, id) WHERE state = 'ready';
DROP TABLE tasks_done_minutes;
ALTER TABLE tasks DROP CONSTRAINT tasks_ready_queued;
