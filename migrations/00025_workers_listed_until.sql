-- +goose Up
-- The lease that a worker's latest hello gave the attempts it listed,
-- when the worker said the list was complete (hello.running_complete: a
-- reconnection of the same process, nothing left off). An attempt
-- assigned before that hello whose lease is still shorter was not listed:
-- its assignment never reached the worker (a socket that died with the
-- frame in it, a replica that died before sending it), and the lease
-- reaper ends it charged to nobody (store.expireSQL). NULL: the reaper
-- judges by rank alone. A column of the worker's row, which the hello
-- writes anyway: finding the unlisted attempts at the hello itself would
-- need an index on attempts by worker, an entry for every claim.
ALTER TABLE workers ADD COLUMN listed_until timestamptz;

-- +goose Down
ALTER TABLE workers DROP COLUMN listed_until;
