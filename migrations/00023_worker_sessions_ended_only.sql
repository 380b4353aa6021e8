-- +goose Up
-- worker_sessions_ended held the open connections too (disconnected_at
-- NULL), and with statistics that said few were open PostgreSQL read
-- every open connection through it to close one worker's (a hello's
-- registration, a worker gone): 36,000 rows, 4 ms a hello with 36,000
-- volunteers. It now holds only the ended ones, which are all it is for
-- (pruning, the dashboard's last hour); the open ones are found by worker
-- through worker_sessions_open.
DROP INDEX worker_sessions_ended;
CREATE INDEX worker_sessions_ended ON worker_sessions (disconnected_at) WHERE disconnected_at IS NOT NULL;

-- +goose Down
DROP INDEX worker_sessions_ended;
CREATE INDEX worker_sessions_ended ON worker_sessions (disconnected_at);
