-- +goose Up
-- The server's own bound on how long an attempt may be held
-- (docs/RATIONALE.md, "Why does the server end an attempt at its wall
-- time on its own clock?"). timeout_ms is the task's wall time, copied
-- by the claim that makes the attempt (the attempt's own row, so that a
-- renewal, on every heartbeat, needs no join with tasks). deadline is set
-- by the first renewal (heartbeat, checkpoint, hello) at which the
-- attempt may be running, to that moment plus timeout_ms and the server's
-- grace; no renewal extends lease_until past it, so a worker that
-- heartbeats an attempt and never ends it loses it to the lease reaper.
-- NULL: not yet judged running (it waits in its worker's queue).
-- Neither is indexed: renewals stay HOT updates.
ALTER TABLE attempts ADD COLUMN timeout_ms bigint, ADD COLUMN deadline timestamptz;
-- The attempts running now get their task's wall time too.
UPDATE attempts a SET timeout_ms = t.timeout_ms
FROM running_attempts r, tasks t
WHERE a.id = r.attempt_id AND a.state = 'running' AND t.id = a.task_id;

-- +goose Down
ALTER TABLE attempts DROP COLUMN deadline, DROP COLUMN timeout_ms;
