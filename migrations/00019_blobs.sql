-- +goose Up
-- Data blobs: the files and archives an owner's tasks read (docs/DATA.md).
-- Content-addressed like modules ("sha256:<hex>" of the bytes) and kept
-- in chunks, so that neither an upload nor a download holds a blob whole
-- in memory. An upload writes its chunks under a key from blob_uploads in
-- small transactions (one long transaction would hold back vacuum on the
-- busy tables for as long as a slow client uploads), and the blob becomes
-- visible only when its blobs row is written, after the hash is checked.
-- Chunks whose key has neither a blobs nor a blob_uploads row are garbage.
CREATE SEQUENCE blob_keys;

CREATE TABLE blob_uploads (
    key         bigint PRIMARY KEY,
    owner_id    bigint NOT NULL REFERENCES owners ON DELETE CASCADE,
    touched_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE blobs (
    id          text PRIMARY KEY,
    key         bigint NOT NULL UNIQUE,
    size        bigint NOT NULL,
    chunk_bytes integer NOT NULL,
    -- archive: the bytes were checked as a safe tar archive at upload (no
    -- absolute, escaping or special entries), so tasks may mount them as
    -- a directory tree.
    archive     boolean NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE blob_chunks (
    blob_key    bigint NOT NULL,
    seq         integer NOT NULL,
    data        bytea NOT NULL,
    PRIMARY KEY (blob_key, seq)
);
-- Stored out of line and not compressed: data files are mostly compressed
-- already, and reads then copy the bytes without inflating them.
ALTER TABLE blob_chunks ALTER COLUMN data SET STORAGE EXTERNAL;

-- Which owners pushed which blob, under which file name. Another owner's
-- blob answers exactly as an absent one.
CREATE TABLE owner_blobs (
    owner_id    bigint NOT NULL REFERENCES owners ON DELETE CASCADE,
    blob_id     text NOT NULL REFERENCES blobs,
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_id, blob_id)
);

-- Which workflows read which blob: a blob is kept while a workflow reads
-- it, even when its owner removed it from the list.
CREATE TABLE workflow_blobs (
    workflow_id uuid NOT NULL REFERENCES workflows ON DELETE CASCADE,
    blob_id     text NOT NULL REFERENCES blobs,
    PRIMARY KEY (workflow_id, blob_id)
);
CREATE INDEX workflow_blobs_blob ON workflow_blobs (blob_id);

-- A task's environment and file system beyond /in and /out: the
-- protocol.Setup of its assignments, as JSON (NULL for most tasks).
ALTER TABLE tasks ADD COLUMN setup jsonb;

-- The file name a module was pushed with, for the owner's lists.
ALTER TABLE owner_modules ADD COLUMN name text NOT NULL DEFAULT '';

-- Secrets every replica shares, made by the first replica that needs one.
CREATE TABLE secrets (
    name        text PRIMARY KEY,
    value       bytea NOT NULL
);

-- +goose Down
ALTER TABLE owner_modules DROP COLUMN name;
ALTER TABLE tasks DROP COLUMN setup;
DROP TABLE secrets, workflow_blobs, owner_blobs, blob_chunks, blobs, blob_uploads;
DROP SEQUENCE blob_keys;
