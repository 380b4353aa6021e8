package store

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// uploadOutput uploads data as output name of attempt c, as the server's
// handler does, and returns the error of its beginning or commit.
func uploadOutput(ctx context.Context, s *Store, c Claimed, name string, data []byte) error {
	u, err := s.BeginOutputUpload(ctx, c.Attempt, c.Worker, name, int64(len(data)))
	if err != nil {
		return err
	}
	if _, err := u.ReadFrom(ctx, bytes.NewReader(data)); err != nil {
		u.Abort(ctx)
		return err
	}
	_, err = u.Commit(ctx, c.Worker)
	return err
}

// An attempt uploads outputs under at most MaxAttemptUploads names (no
// result could name more): a worker holding one attempt cannot add rows
// without end, each an empty output under a new name. Under a name it
// used already it may upload again, and its checkpoint too.
func TestOutputUploadNamesBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submit(t, "batch", f.task("t"))
	c := f.claim(t, 1, time.Minute)[0]
	if err := uploadOutput(ctx, f.s, c, "o0", nil); err != nil {
		t.Fatal(err)
	}
	// The other names (as many uploads of nothing would leave them).
	if _, err := f.s.pool.Exec(ctx, `INSERT INTO output_uploads (attempt_id, name, blob_id, size)
		SELECT $1, 'o' || i, blob_id, 0 FROM generate_series(1, $2 - 1) i, output_uploads WHERE attempt_id = $1 AND name = 'o0'`,
		c.Attempt, MaxAttemptUploads); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		output  string
		refused bool
	}{
		{"a new name", "one-more", true},
		{"a name uploaded before", "o7", false},
		{"the checkpoint", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := uploadOutput(ctx, f.s, c, tc.output, []byte("x"))
			var le *OutputLimitError
			if tc.refused != errors.As(err, &le) || !tc.refused && err != nil {
				t.Fatalf("upload: %v; want refused %v", err, tc.refused)
			}
		})
	}
	var n int
	if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM output_uploads WHERE attempt_id = $1 AND name <> ''`, c.Attempt).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != MaxAttemptUploads {
		t.Errorf("the attempt has %d uploaded outputs, want %d", n, MaxAttemptUploads)
	}
}

// Uploads of one attempt that commit at once fit its output limit
// together: the second to commit counts the first's bytes, though it began
// before the first committed.
func TestConcurrentOutputUploadsKeepTheLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	task := f.task("t")
	task.OutputBytes = 1000
	f.submit(t, "batch", task)
	c := f.claim(t, 1, time.Minute)[0]
	// Both uploads wait for the attempt's row, held here, and then commit
	// one after the other.
	tx, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM attempts WHERE id = $1 FOR UPDATE`, c.Attempt); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for _, name := range []string{"a", "b"} {
		u, err := f.s.BeginOutputUpload(ctx, c.Attempt, c.Worker, name, 600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := u.ReadFrom(ctx, bytes.NewReader(bytes.Repeat([]byte(name), 600))); err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := u.Commit(ctx, c.Worker)
			errs <- err
		}()
	}
	f.waitForLockWaits(t, 2)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var refused int
	for range 2 {
		err := <-errs
		var le *OutputLimitError
		switch {
		case errors.As(err, &le):
			refused++
		case err != nil:
			t.Fatal(err)
		}
	}
	var used int64
	if err := f.s.pool.QueryRow(ctx, `SELECT coalesce(sum(size), 0) FROM output_uploads WHERE attempt_id = $1`, c.Attempt).Scan(&used); err != nil {
		t.Fatal(err)
	}
	if refused != 1 || used > 1000 {
		t.Errorf("%d of the two uploads refused, and the attempt keeps %d bytes of uploads; want 1 refused, at most its limit of 1000", refused, used)
	}
}
