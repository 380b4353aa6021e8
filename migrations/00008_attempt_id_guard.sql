-- +goose Up
-- An unlogged table is emptied by every crash recovery of PostgreSQL (and
-- is empty on a promoted standby), and kept by a clean restart. Claims
-- commit without waiting for their WAL flush, so a crash can lose the last
-- ones and the attempt id sequence's advance with them; the store sees this
-- row gone and moves the sequence past every id it may have handed out
-- (store.guardAttemptIDs) before a new connection is used.
CREATE UNLOGGED TABLE attempt_id_guard (
    id integer PRIMARY KEY CHECK (id = 1)
);
-- Claims before this migration committed synchronously: nothing to move.
INSERT INTO attempt_id_guard VALUES (1);

-- +goose Down
DROP TABLE attempt_id_guard;
