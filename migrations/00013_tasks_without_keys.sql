-- +goose Up
-- A submission wrote every task and every edge through foreign keys
-- checked row by row, with a lookup and a row lock each: tasks against
-- workflow_modules, edges (task_inputs) against tasks twice. Writing a
-- 20,000-task workflow took 196 ms with them and 111 without, a chain of
-- 20,000 tasks 410 ms and 135. The store writes tasks only in the statement that
-- writes the workflow and its workflow_modules from the same tasks, and
-- edges only between tasks it has just written (docs/RATIONALE.md, "Why
-- have tasks, edges, attempts and outputs no foreign keys?"); a
-- module in use still cannot be deleted (workflow_modules keeps its keys).
-- What the keys still did, cascading the delete of a workflow to its tasks
-- and of a task to its edges, statement triggers now do, as migration
-- 00010 did for attempts and outputs.
ALTER TABLE tasks DROP CONSTRAINT tasks_workflow_module_fkey;
ALTER TABLE task_inputs DROP CONSTRAINT task_inputs_task_id_fkey, DROP CONSTRAINT task_inputs_from_task_fkey;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cyclepool_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM running_attempts r USING attempts a, gone g WHERE a.task_id = g.id AND r.attempt_id = a.id;
    DELETE FROM attempts a USING gone g WHERE a.task_id = g.id;
    DELETE FROM task_outputs o USING gone g WHERE o.task_id = g.id;
    DELETE FROM task_inputs i USING gone g WHERE i.task_id = g.id;
    DELETE FROM task_inputs i USING gone g WHERE i.from_task = g.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION cyclepool_workflows_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tasks t USING gone g WHERE t.workflow_id = g.id;
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER workflows_deleted AFTER DELETE ON workflows REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION cyclepool_workflows_deleted();

-- +goose Down
DROP TRIGGER workflows_deleted ON workflows;
DROP FUNCTION cyclepool_workflows_deleted();
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
-- Rows the keys would refuse (only hand-written SQL makes them): tasks
-- first, then the edges they leave behind.
DELETE FROM tasks t WHERE NOT EXISTS (SELECT 1 FROM workflow_modules m WHERE m.workflow_id = t.workflow_id AND m.module_id = t.module_id);
DELETE FROM task_inputs i WHERE NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = i.task_id)
    OR NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = i.from_task);
ALTER TABLE task_inputs
    ADD CONSTRAINT task_inputs_task_id_fkey FOREIGN KEY (task_id) REFERENCES tasks ON DELETE CASCADE,
    ADD CONSTRAINT task_inputs_from_task_fkey FOREIGN KEY (from_task) REFERENCES tasks ON DELETE CASCADE;
ALTER TABLE tasks
    ADD CONSTRAINT tasks_workflow_module_fkey FOREIGN KEY (workflow_id, module_id) REFERENCES workflow_modules ON DELETE CASCADE;
