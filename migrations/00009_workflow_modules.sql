-- +goose Up
-- One foreign key checked per task instead of two. PostgreSQL checks a
-- foreign key row by row, with one lookup each: the COPY of a 20,000-task
-- workflow spent 150-230 ms checking tasks.workflow_id against workflows
-- and tasks.module_id against modules. A task now references the pair
-- (workflow, module) in workflow_modules, written once per module of a
-- workflow, whose own keys reference workflows and modules: the same
-- guarantees (every task's workflow and module exist; deleting a workflow
-- deletes its tasks; a module in use cannot be deleted), half the checks.
-- Replicas of earlier versions do not write workflow_modules: stop them
-- before this migration runs (docs/CLI.md, "Upgrading replicas").
CREATE TABLE workflow_modules (
    workflow_id uuid NOT NULL REFERENCES workflows ON DELETE CASCADE,
    module_id   text NOT NULL REFERENCES modules,
    PRIMARY KEY (workflow_id, module_id)
);
INSERT INTO workflow_modules (workflow_id, module_id) SELECT DISTINCT workflow_id, module_id FROM tasks;
ALTER TABLE tasks
    ADD CONSTRAINT tasks_workflow_module_fkey FOREIGN KEY (workflow_id, module_id) REFERENCES workflow_modules ON DELETE CASCADE,
    DROP CONSTRAINT tasks_workflow_id_fkey,
    DROP CONSTRAINT tasks_module_id_fkey;

-- +goose Down
ALTER TABLE tasks
    ADD CONSTRAINT tasks_workflow_id_fkey FOREIGN KEY (workflow_id) REFERENCES workflows ON DELETE CASCADE,
    ADD CONSTRAINT tasks_module_id_fkey FOREIGN KEY (module_id) REFERENCES modules,
    DROP CONSTRAINT tasks_workflow_module_fkey;
DROP TABLE workflow_modules;
