-- +goose Up
-- Every claim inserts an attempt and every completion an output row; the
-- foreign keys of both to tasks ran a row-by-row check that also locked the
-- task row (a WAL record each), 7 to 10 µs of PostgreSQL CPU per task, the
-- largest single item of a no-op task's claim and completion
-- (docs/RATIONALE.md, "Why have tasks, edges, attempts and outputs no
-- foreign keys?"). The store writes these rows only from task rows it
-- has just read in the same statement (an attempt from the locked task, an
-- output joined with its running task), so the keys guarded nothing the
-- statements do not. What they still did, cascading the delete of a task
-- (a workflow's delete cascades to its tasks), a statement trigger does.
ALTER TABLE attempts DROP CONSTRAINT attempts_task_id_fkey;
ALTER TABLE task_outputs DROP CONSTRAINT task_outputs_task_id_fkey;

-- +goose StatementBegin
CREATE FUNCTION cyclepool_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM attempts a USING gone g WHERE a.task_id = g.id;
    DELETE FROM task_outputs o USING gone g WHERE o.task_id = g.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER tasks_deleted AFTER DELETE ON tasks REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION cyclepool_tasks_deleted();

-- +goose Down
DROP TRIGGER tasks_deleted ON tasks;
DROP FUNCTION cyclepool_tasks_deleted();
DELETE FROM attempts a WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = a.task_id);
DELETE FROM task_outputs o WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = o.task_id);
ALTER TABLE attempts ADD CONSTRAINT attempts_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks ON DELETE CASCADE;
ALTER TABLE task_outputs ADD CONSTRAINT task_outputs_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks ON DELETE CASCADE;
