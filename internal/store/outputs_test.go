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
