-- +goose Up
-- A workflow that reaches a final state (done, failed, cancelled) is
-- announced on the channel cyclepool_finished with its id as the payload,
-- from whichever statement finished it (a completion batch, a failure, a
-- cancel, a lapsed lease), so that the server's long polls and event
-- streams answer at once instead of at their next look. The notification
-- is delivered when the transaction commits, so a listener never hears of
-- a state it cannot read yet.
-- +goose StatementBegin
CREATE FUNCTION cyclepool_workflow_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cyclepool_finished', NEW.id::text);
    RETURN NULL;
END
$$;
-- +goose StatementEnd
CREATE TRIGGER workflows_finished AFTER UPDATE OF state ON workflows
    FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION cyclepool_workflow_finished();

-- +goose Down
DROP TRIGGER workflows_finished ON workflows;
DROP FUNCTION cyclepool_workflow_finished();
