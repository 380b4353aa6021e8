package store

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// A task that ends without being done (failed for good, its workflow or
// itself cancelled) lets go of its checkpoint, inline or uploaded, and the
// next collection removes the uploaded one's bytes, as for a task done.
func TestEndedTasksDropTheirCheckpoints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, end := range []string{"failed", "workflow cancelled", "task cancelled"} {
		t.Run(end, func(t *testing.T) {
			f := newFixture(t)
			task := f.task("t")
			task.MaxAttempts = 1
			task.MemoryPages = 64 // room for a 2 MiB checkpoint
			wf := f.submit(t, "batch", task)
			c := f.claim(t, 1, time.Minute)[0]
			// A checkpoint uploaded over HTTP (as the server's handler
			// does), then an inline one: the task holds the blob's.
			u, err := f.s.BeginOutputUpload(ctx, c.Attempt, c.Worker, "", 2<<20)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := u.ReadFrom(ctx, bytes.NewReader(bytes.Repeat([]byte("ck"), 1<<20))); err != nil {
				t.Fatal(err)
			}
			blob, err := u.Commit(ctx, c.Worker)
			if err != nil {
				t.Fatal(err)
			}
			if ok, err := f.s.SaveCheckpointBlob(ctx, c.Attempt, c.Worker, blob, time.Minute); !ok || err != nil {
				t.Fatalf("save the checkpoint: %v %v", ok, err)
			}
			held := func() (inline bool, blobs int) {
				t.Helper()
				if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT checkpoint IS NOT NULL OR checkpoint_blob IS NOT NULL FROM tasks WHERE id = $1),
					(SELECT count(*) FROM blobs WHERE id = $2)`, c.TaskID, blob).Scan(&inline, &blobs); err != nil {
					t.Fatal(err)
				}
				return inline, blobs
			}
			if h, n := held(); !h || n != 1 {
				t.Fatalf("before the end: checkpoint held %v, %d blobs; want held and 1", h, n)
			}
			switch end {
			case "failed":
				if acc, err := f.s.Complete(ctx, []Completion{{Attempt: c.Attempt, Worker: c.Worker, Reason: "exit", End: EndTaskError}}); err != nil || !acc[0] {
					t.Fatalf("fail: %v %v", acc, err)
				}
			case "workflow cancelled":
				if _, err := f.s.Cancel(ctx, f.owner, wf); err != nil {
					t.Fatal(err)
				}
			case "task cancelled":
				if _, err := f.s.CancelTask(ctx, f.owner, wf, "t"); err != nil {
					t.Fatal(err)
				}
			}
			var state string
			if err := f.s.pool.QueryRow(ctx, `SELECT state FROM tasks WHERE id = $1`, c.TaskID).Scan(&state); err != nil {
				t.Fatal(err)
			}
			if want := map[string]string{"failed": "failed"}[end]; want == "" && state != "cancelled" || want != "" && state != want {
				t.Fatalf("the task is %s after it was %s", state, end)
			}
			// Maintenance's two collections: the attempt's uploads, then
			// blobs nothing holds.
			if _, err := f.s.CollectOutputUploads(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := f.s.CollectBlobGarbage(ctx); err != nil {
				t.Fatal(err)
			}
			if h, n := held(); h || n != 0 {
				t.Errorf("%s: checkpoint held %v, %d blobs after the collection; want neither", end, h, n)
			}
			var chunks int
			if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FROM blob_chunks`).Scan(&chunks); err != nil || chunks != 0 {
				t.Errorf("%s: %d chunks left (%v)", end, chunks, err)
			}
		})
	}
}
