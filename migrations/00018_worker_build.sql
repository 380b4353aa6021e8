-- +goose Up
-- The build a worker said it runs (hello.build), for the workers' list:
-- a worker of another build than the server's shows there.
ALTER TABLE workers ADD COLUMN build text NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE workers DROP COLUMN build;
