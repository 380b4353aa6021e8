-- +goose Up
CREATE TABLE owners (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    token_hash  bytea NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Modules are content-addressed: id is "sha256:<hex>" of body.
CREATE TABLE modules (
    id          text PRIMARY KEY,
    size        integer NOT NULL,
    imports     text[] NOT NULL,
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Which owners pushed which module; an owner may only use modules it pushed.
CREATE TABLE owner_modules (
    owner_id    bigint NOT NULL REFERENCES owners ON DELETE CASCADE,
    module_id   text NOT NULL REFERENCES modules,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_id, module_id)
);

CREATE TABLE workflows (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    owner_id     bigint NOT NULL REFERENCES owners,
    name         text NOT NULL,
    priority     text NOT NULL CHECK (priority IN ('interactive', 'batch')),
    state        text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed', 'cancelled')),
    task_count   integer NOT NULL,
    tasks_left   integer NOT NULL,   -- tasks not yet in a terminal state
    tasks_failed integer NOT NULL DEFAULT 0,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX workflows_owner ON workflows (owner_id, created_at DESC);

CREATE TABLE tasks (
    id             bigserial PRIMARY KEY,
    workflow_id    uuid NOT NULL REFERENCES workflows ON DELETE CASCADE,
    name           text NOT NULL,
    module_id      text NOT NULL REFERENCES modules,
    args           text[] NOT NULL,
    stdin          bytea,            -- inline stdin; stdin from a task is a task_inputs row named ''
    priority       text NOT NULL,
    state          text NOT NULL CHECK (state IN ('blocked', 'ready', 'running', 'done', 'failed', 'upstream_failed', 'cancelled')),
    deps_left      integer NOT NULL, -- distinct upstream tasks not yet done
    -- Dispatch order among ready tasks: the time the task became ready, minus
    -- a head start for interactive work. A batch task that has waited longer
    -- than the head start overtakes new interactive tasks (ageing).
    sort_key       timestamptz,
    attempts       integer NOT NULL DEFAULT 0,
    max_attempts   integer NOT NULL,
    timeout_ms     bigint NOT NULL,
    memory_pages   integer NOT NULL,
    output_bytes   bigint NOT NULL,
    log_bytes      bigint NOT NULL,
    ckpt_ms        bigint NOT NULL,
    seed           bigint NOT NULL,
    checkpoint     bytea,
    checkpoint_seq integer NOT NULL DEFAULT 0, -- checkpoints saved over all attempts
    checkpoint_at  timestamptz,
    error          text NOT NULL DEFAULT '',
    started_at     timestamptz,
    finished_at    timestamptz,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workflow_id, name)
);
CREATE INDEX tasks_ready ON tasks (sort_key, id) WHERE state = 'ready';
CREATE INDEX tasks_active ON tasks (state) WHERE state IN ('blocked', 'ready', 'running');

-- Edges of the DAG: task_id reads output of from_task as file name (or as
-- stdin when name is '').
CREATE TABLE task_inputs (
    task_id    bigint NOT NULL REFERENCES tasks ON DELETE CASCADE,
    name       text NOT NULL,
    from_task  bigint NOT NULL REFERENCES tasks ON DELETE CASCADE,
    output     text NOT NULL,
    PRIMARY KEY (task_id, name)
);
CREATE INDEX task_inputs_from ON task_inputs (from_task);

CREATE TABLE task_outputs (
    task_id  bigint NOT NULL REFERENCES tasks ON DELETE CASCADE,
    name     text NOT NULL,
    data     bytea NOT NULL,
    PRIMARY KEY (task_id, name)
);

CREATE TABLE workers (
    id            uuid PRIMARY KEY,
    token_hash    bytea NOT NULL,
    kind          text NOT NULL,
    slots         integer NOT NULL,
    volunteer     text NOT NULL DEFAULT '',
    device        jsonb NOT NULL DEFAULT '{}',
    replica       text NOT NULL DEFAULT '',
    connected     boolean NOT NULL DEFAULT true,
    connected_at  timestamptz NOT NULL DEFAULT now(),
    last_seen     timestamptz NOT NULL DEFAULT now(),
    tasks_lost    bigint NOT NULL DEFAULT 0  -- attempts lost to lapsed leases (tasks done and failed are counted from attempts)
);
CREATE INDEX workers_connected ON workers (connected) WHERE connected;

CREATE TABLE attempts (
    id            bigserial PRIMARY KEY,
    task_id       bigint NOT NULL REFERENCES tasks ON DELETE CASCADE,
    worker_id     uuid NOT NULL,
    state         text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'succeeded', 'failed', 'lost', 'cancelled')),
    lease_until   timestamptz NOT NULL,
    progress      real NOT NULL DEFAULT 0,
    restored_seq  integer NOT NULL DEFAULT 0, -- checkpoint_seq the attempt started from
    reason        text NOT NULL DEFAULT '',
    log           bytea,
    started_at    timestamptz NOT NULL DEFAULT now(),
    ended_at      timestamptz
);
-- Not on lease_until: renewals (every heartbeat) then stay HOT updates.
CREATE INDEX attempts_running ON attempts (id) WHERE state = 'running';
ALTER TABLE attempts SET (fillfactor = 80);
CREATE INDEX attempts_task ON attempts (task_id);

-- Leader rows with a TTL: one replica at a time runs maintenance.
CREATE TABLE leaders (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- +goose Down
DROP TABLE leaders, attempts, workers, task_outputs, task_inputs, tasks, workflows, owner_modules, modules, owners;
