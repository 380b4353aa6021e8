-- +goose Up
-- The dispatch queue is read owner by owner, so that one owner's backlog
-- does not hold back another owner's work (store.candidatesSQL: the
-- dispatcher takes the tasks of the owners with the fewest attempts
-- running first). tasks_ready becomes (owner_id, sort_key, id): the same
-- partial index, one key column more, so a ready task still costs one
-- index entry. owner_id never changes, so a completion stays a HOT update.
--
-- Existing rows get owner 0 at once (a default needs no rewrite); the
-- tasks that may still run get their workflow's owner. A finished task
-- that re-verification sets back to blocked takes its owner then
-- (store.verify.go).
ALTER TABLE tasks ADD COLUMN owner_id bigint NOT NULL DEFAULT 0;
UPDATE tasks t SET owner_id = w.owner_id FROM workflows w
WHERE w.id = t.workflow_id AND t.state IN ('blocked', 'ready', 'running');
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (owner_id, sort_key, id) WHERE pending > 0 AND sort_key IS NOT NULL;

-- +goose Down
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (sort_key, id) WHERE pending > 0 AND sort_key IS NOT NULL;
ALTER TABLE tasks DROP COLUMN owner_id;
