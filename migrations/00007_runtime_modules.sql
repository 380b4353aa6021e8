-- +goose Up
-- Run time averages per module, over all of its task names. runtime_stats
-- keeps from now on only the names whose own average differs notably from
-- their module's (see store.FlushRuntimeStats): a workflow of 20,000
-- distinct names of similar run time no longer writes 20,000 rows, and the
-- dispatcher no longer reloads them every few seconds.
CREATE TABLE runtime_modules (
    module_id  text PRIMARY KEY,
    runs       bigint NOT NULL,
    mean_ms    double precision NOT NULL
);
INSERT INTO runtime_modules (module_id, runs, mean_ms)
SELECT module_id, sum(runs), sum(mean_ms * runs) / sum(runs) FROM runtime_stats GROUP BY module_id;

-- +goose Down
DROP TABLE runtime_modules;
