-- +goose Up
-- Modules can be removed (store.RemoveModule), and deleting a workflow
-- deletes the modules nothing else holds (store.DeleteWorkflow): both
-- ask whether any owner lists a module or any workflow uses it, which the
-- primary keys (owner first, workflow first) cannot answer without a scan.
CREATE INDEX owner_modules_module ON owner_modules (module_id);
CREATE INDEX workflow_modules_module ON workflow_modules (module_id);

-- +goose Down
DROP INDEX workflow_modules_module;
DROP INDEX owner_modules_module;
