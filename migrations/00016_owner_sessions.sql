-- +goose Up
-- The dashboard's sessions are signed cookies that carry their owner's
-- session generation when they were made; signing out increments it, which
-- ends every session of that owner on every replica (web/app).
ALTER TABLE owners ADD COLUMN session_gen bigint NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE owners DROP COLUMN session_gen;
