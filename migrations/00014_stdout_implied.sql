-- +goose Up
-- From this version on, a successful attempt's empty stdout is stored
-- without a task_outputs row: a done task without a stdout row has an
-- empty stdout (internal/store, implied). The schema does not change, but
-- replicas of earlier versions would take such a stdout for missing (a
-- dependent would fail, the status and results would lack it): this
-- migration marks the version before which they must be stopped
-- (docs/CLI.md), and its Down writes the rows they expect.
SELECT 1;

-- +goose Down
INSERT INTO task_outputs (task_id, name, data)
SELECT t.id, 'stdout', '' FROM tasks t
WHERE t.state = 'done' AND NOT EXISTS (SELECT 1 FROM task_outputs o WHERE o.task_id = t.id AND o.name = 'stdout');
