-- +goose Up
-- Outputs uploaded over HTTP (docs/PROTOCOL.md, "Outputs over HTTP"): a
-- worker streams each large output of an attempt it holds into a blob
-- before its result, which names them. output_uploads records which
-- attempt uploaded which blob under which name, so that a result can name
-- only what its own attempt uploaded (never another owner's blob); rows
-- of attempts no longer running are collected with the blobs. The empty
-- name is the attempt's latest checkpoint (SaveCheckpoint).
CREATE TABLE output_uploads (
    attempt_id  bigint NOT NULL,
    name        text NOT NULL,
    blob_id     text NOT NULL REFERENCES blobs,
    size        bigint NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (attempt_id, name)
);
CREATE INDEX output_uploads_blob ON output_uploads (blob_id);

-- The upload of an output names its attempt: it is not one of the owner's
-- own uploads, whose number at once is bounded (store.MaxBlobUploads).
ALTER TABLE blob_uploads ADD COLUMN attempt_id bigint;

-- An output stored as a blob: data is empty and blob_id names it.
ALTER TABLE task_outputs ADD COLUMN blob_id text REFERENCES blobs;
CREATE INDEX task_outputs_blob ON task_outputs (blob_id) WHERE blob_id IS NOT NULL;

-- A checkpoint uploaded over HTTP (an output_uploads row of its attempt
-- with the empty name, which no output has): the task's latest checkpoint
-- is then this blob rather than the bytes of checkpoint.
ALTER TABLE tasks ADD COLUMN checkpoint_blob text REFERENCES blobs;
CREATE INDEX tasks_checkpoint_blob ON tasks (checkpoint_blob) WHERE checkpoint_blob IS NOT NULL;

-- +goose Down
DROP INDEX tasks_checkpoint_blob;
ALTER TABLE tasks DROP COLUMN checkpoint_blob;
DROP INDEX task_outputs_blob;
ALTER TABLE task_outputs DROP COLUMN blob_id;
DROP TABLE output_uploads;
ALTER TABLE blob_uploads DROP COLUMN attempt_id;
