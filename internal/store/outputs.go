package store

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrNotHeld refuses an output upload for an attempt that is not running
// on the worker that sends it (it ended, lost its lease or is another
// worker's).
var ErrNotHeld = errors.New("the attempt is not running on this worker")

// ErrReplicated refuses an output upload for an attempt of a replicated
// task: results are compared by hash, so their outputs travel in the
// result frame.
var ErrReplicated = errors.New("the outputs of a replicated task travel in its result frame, not over HTTP")

// MaxAttemptUploads bounds the names one attempt may upload outputs under.
// A result lists each in its header (protocol.MaxHeaderBytes, 1 MiB), in
// at least 100 bytes (its name, blob id and size), so no result could name
// more; without the bound a worker holding one attempt could add rows
// without end, each an empty output under a new name.
const MaxAttemptUploads = (1 << 20) / 100

// OutputLimitError refuses an output upload that would take the outputs
// of its attempt past the task's limit, or past MaxAttemptUploads names.
type OutputLimitError struct {
	Limit int64 // the task's output_bytes (its memory for a checkpoint)
	Used  int64 // bytes the attempt uploaded under other names
	Size  int64 // bytes of this upload, or what arrived before it passed the limit
	// Checkpoint: the upload is a checkpoint, at most the task's memory.
	Checkpoint bool
	// Names, when not 0, is how many other names the attempt uploaded
	// outputs under: this upload, under a new one, would pass
	// MaxAttemptUploads.
	Names int
}

func (e *OutputLimitError) Error() string {
	if e.Names > 0 {
		return fmt.Sprintf("the attempt uploaded %d outputs already, the most one attempt may", e.Names)
	}
	if e.Checkpoint {
		return fmt.Sprintf("a checkpoint of %d bytes is larger than the task's memory limit of %d bytes", e.Size, e.Limit)
	}
	return fmt.Sprintf("output limit of %d bytes exceeded: the attempt uploaded %d bytes of other outputs and this one has %d",
		e.Limit, e.Used, e.Size)
}

// uploadLimitSQL is the bound of an upload ($3: its name) of attempt a of
// task t: the task's outputs together, or its memory for a checkpoint
// (the empty name). uploadedSQL is what counts towards it: the attempt's
// other outputs, nothing for a checkpoint (the latest replaces the last).
// otherNamesSQL is how many other names the attempt uploaded outputs
// under (MaxAttemptUploads), 0 for a checkpoint.
const (
	uploadLimitSQL = `CASE WHEN $3 = '' THEN t.memory_pages::bigint * 65536 ELSE t.output_bytes END`
	uploadedSQL    = `CASE WHEN $3 = '' THEN 0 ELSE coalesce((SELECT sum(size) FROM output_uploads WHERE attempt_id = a.id AND name <> $3 AND name <> ''), 0) END`
	otherNamesSQL  = `CASE WHEN $3 = '' THEN 0 ELSE (SELECT count(*) FROM output_uploads WHERE attempt_id = a.id AND name <> $3 AND name <> '') END`
)

// tooManyNames refuses an upload under a name that would take its attempt
// past MaxAttemptUploads, given the other names it uploaded (otherNamesSQL).
func tooManyNames(others int, name string) error {
	if name != "" && others >= MaxAttemptUploads {
		return &OutputLimitError{Names: others}
	}
	return nil
}

// OutputUpload streams one output of a running attempt into a blob
// (docs/PROTOCOL.md, "Outputs over HTTP"). Nothing of it is visible until
// Commit; Abort removes what it wrote.
type OutputUpload struct {
	*BlobUpload
	attempt int64
	name    string
}

// BeginOutputUpload starts the upload of output name of attempt, which
// must be running on worker; the empty name is a checkpoint of the attempt
// (SaveCheckpoint). It fails with ErrNotHeld, ErrReplicated, or
// an *OutputLimitError when expect (the size if known, else -1) would
// take the attempt's uploads past its task's output limit, or a new name
// past MaxAttemptUploads.
func (s *Store) BeginOutputUpload(ctx context.Context, attempt int64, worker, name string, expect int64) (*OutputUpload, error) {
	u := &OutputUpload{BlobUpload: &BlobUpload{s: s, h: sha256.New()}, attempt: attempt, name: name}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		var replicas, others int
		err := tx.QueryRow(ctx, `SELECT w.owner_id, `+uploadLimitSQL+`, t.max_replicas, `+uploadedSQL+`, `+otherNamesSQL+`
			FROM attempts a JOIN tasks t ON t.id = a.task_id JOIN workflows w ON w.id = t.workflow_id
			WHERE a.id = $1 AND a.worker_id = $2::uuid AND a.state = 'running'`,
			attempt, worker, name).Scan(&u.owner, &u.quota, &replicas, &u.used, &others)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotHeld
		}
		if err != nil {
			return err
		}
		if replicas > 1 {
			return ErrReplicated
		}
		if err := tooManyNames(others, name); err != nil {
			return err
		}
		if u.used+max(expect, 0) > u.quota {
			return &OutputLimitError{Limit: u.quota, Used: u.used, Size: expect, Checkpoint: name == ""}
		}
		return tx.QueryRow(ctx, `INSERT INTO blob_uploads (key, owner_id, attempt_id) VALUES (nextval('blob_keys'), $1, $2) RETURNING key`,
			u.owner, attempt).Scan(&u.key)
	})
	if err != nil {
		return nil, fmt.Errorf("begin upload of output %q of attempt %d: %w", name, attempt, err)
	}
	u.over = func(used, size int64) error {
		return &OutputLimitError{Limit: u.quota, Used: used, Size: size, Checkpoint: name == ""}
	}
	return u, nil
}

// Commit stores the output's blob and records it as output name of the
// attempt (replacing an earlier upload under that name), after checking
// again that the attempt is running on its worker and that its uploads
// fit the task's limit and MaxAttemptUploads. It returns the blob id.
func (u *OutputUpload) Commit(ctx context.Context, worker string) (string, error) {
	if err := u.finish(ctx); err != nil {
		u.Abort(ctx)
		return "", err
	}
	id := u.ID()
	err := u.s.tx(ctx, func(tx pgx.Tx) error {
		// The attempt's row orders concurrent uploads of one attempt. It is
		// locked first, in a statement of its own: one that waited for the
		// lock would count the attempt's uploads as they were before the
		// upload it waited for committed (READ COMMITTED).
		tag, err := tx.Exec(ctx, `SELECT 1 FROM attempts WHERE id = $1 AND worker_id = $2::uuid AND state = 'running' FOR UPDATE`,
			u.attempt, worker)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrNotHeld
		}
		var used, limit int64
		var others int
		err = tx.QueryRow(ctx, `SELECT `+uploadLimitSQL+`, `+uploadedSQL+`, `+otherNamesSQL+`
			FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE a.id = $1 AND a.worker_id = $2::uuid AND a.state = 'running'`,
			u.attempt, worker, u.name).Scan(&limit, &used, &others)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotHeld
		}
		if err != nil {
			return err
		}
		if err := tooManyNames(others, u.name); err != nil {
			return err
		}
		if used+u.size > limit {
			return &OutputLimitError{Limit: limit, Used: used, Size: u.size, Checkpoint: u.name == ""}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO blobs (id, key, size, chunk_bytes, archive) VALUES ($1, $2, $3, $4, false)
			ON CONFLICT (id) DO NOTHING`, id, u.key, u.size, BlobChunkBytes); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM blob_uploads WHERE key = $1`, u.key); err != nil {
			return err
		}
		// An upload under a name uploaded before replaces it: the bytes it
		// replaces go at once, when nothing else holds them.
		var old string
		if err := tx.QueryRow(ctx, `SELECT coalesce((SELECT blob_id FROM output_uploads WHERE attempt_id = $1 AND name = $2), '')`,
			u.attempt, u.name).Scan(&old); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO output_uploads (attempt_id, name, blob_id, size) VALUES ($1, $2, $3, $4)
			ON CONFLICT (attempt_id, name) DO UPDATE SET blob_id = excluded.blob_id, size = excluded.size, created_at = now()`,
			u.attempt, u.name, id, u.size); err != nil {
			return err
		}
		if old != "" && old != id {
			return dropUnusedBlobs(ctx, tx, []string{old})
		}
		return nil
	})
	if err != nil {
		u.Abort(ctx)
		return "", fmt.Errorf("store output %q of attempt %d: %w", u.name, u.attempt, err)
	}
	u.dropChunks(ctx) // the bytes were stored already: this upload's chunks are garbage
	return id, nil
}

// hasUploaded reports whether a completion names uploaded outputs.
func hasUploaded(c *Completion) bool {
	for _, o := range c.Outputs {
		if o.Blob != "" {
			return true
		}
	}
	return false
}

// resolveUploads checks the uploaded outputs that successes name against
// what their attempts uploaded (output_uploads) and takes their sizes from
// there: a result that names a blob its attempt did not upload under that
// name (another owner's, say) is refused.
func (s *Store) resolveUploads(ctx context.Context, cs []Completion) error {
	var ids []int64
	for i := range cs {
		if cs[i].OK && hasUploaded(&cs[i]) {
			ids = append(ids, cs[i].Attempt)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	type key struct {
		attempt int64
		name    string
	}
	type upload struct {
		blob string
		size int64
	}
	rows, err := s.pool.Query(ctx, `SELECT attempt_id, name, blob_id, size FROM output_uploads WHERE attempt_id = ANY($1)`, ids)
	if err != nil {
		return fmt.Errorf("read uploaded outputs: %w", err)
	}
	got := map[key]upload{}
	var k key
	var u upload
	if _, err := pgx.ForEachRow(rows, []any{&k.attempt, &k.name, &u.blob, &u.size}, func() error {
		got[k] = u
		return nil
	}); err != nil {
		return fmt.Errorf("read uploaded outputs: %w", err)
	}
	for i := range cs {
		c := &cs[i]
		if !c.OK || !hasUploaded(c) {
			continue
		}
		for j, o := range c.Outputs {
			if o.Blob == "" {
				continue
			}
			up, ok := got[key{c.Attempt, o.Name}]
			if !ok || up.blob != o.Blob {
				refuse(c, fmt.Sprintf("output %q names data %s that attempt %d did not upload under that name", o.Name, o.Blob, c.Attempt))
				break
			}
			c.Outputs[j].Size = up.size
		}
	}
	return nil
}

// appendUploaded appends the uploaded outputs of one success to the
// arrays of insertUploadedSQL, with its task.
func appendUploaded(tasks []int64, names, blobs []string, task int64, os []Output) ([]int64, []string, []string) {
	for _, o := range os {
		if o.Blob != "" {
			tasks, names, blobs = append(tasks, task), append(names, o.Name), append(blobs, o.Blob)
		}
	}
	return tasks, names, blobs
}

// insertUploadedSQL stores uploaded outputs ($1 task, $2 name, $3 blob)
// of tasks still running, as insertOutputsSQL does inline ones.
const insertUploadedSQL = `INSERT INTO task_outputs (task_id, name, data, blob_id)
	SELECT u.task_id, u.name, '', u.blob FROM unnest($1::bigint[], $2::text[], $3::text[]) AS u(task_id, name, blob)
	JOIN tasks t ON t.id = u.task_id WHERE t.state COLLATE "C" = 'running'`

// CollectOutputUploads removes the uploads of attempts that ended without
// their result naming them (failed, lost, cancelled), with their blobs when
// nothing else holds them. Maintenance runs it often: a worker that uploads
// and hands its attempts back must not leave bytes behind for long. It
// returns how many uploads it removed.
func (s *Store) CollectOutputUploads(ctx context.Context) (int64, error) {
	var n int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `DELETE FROM output_uploads u WHERE NOT EXISTS
			(SELECT 1 FROM attempts a WHERE a.id = u.attempt_id AND a.state = 'running') RETURNING blob_id`)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil || len(ids) == 0 {
			return err
		}
		n = int64(len(ids))
		return dropUnusedBlobs(ctx, tx, ids)
	})
	if err != nil {
		return 0, fmt.Errorf("collect uploaded outputs: %w", err)
	}
	return n, nil
}
