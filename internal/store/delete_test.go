package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"
)

// An owner deletes a workflow that has ended, and with it everything it
// held: tasks, attempts, outputs, and the blobs nothing else holds (an
// output uploaded over HTTP, data the owner removed from its list). Until
// then, data a workflow reads counts against its owner's quota even once
// removed from the owner's list: removing it while a workflow kept its
// bytes gave the quota back, so that an owner could store without bound.
// A running workflow, or another owner's, is not deleted.
func TestDeleteWorkflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		if err := f.s.pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// 1,000 bytes of data, read by the workflow.
	data := bytes.Repeat([]byte("d"), 1000)
	u, err := f.s.BeginBlobUpload(ctx, f.owner, 1<<20, -1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.ReadFrom(ctx, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	b, _, err := u.Commit(ctx, "data", false)
	if err != nil {
		t.Fatal(err)
	}
	id, err := f.s.CreateWorkflow(ctx, f.owner, &NewWorkflow{Name: "wf", Priority: "batch", Tasks: []NewTask{f.task("a")}, Blobs: []string{b.ID}})
	if err != nil {
		t.Fatal(err)
	}
	c := f.claim(t, 1, time.Minute)[0]
	out := bytes.Repeat([]byte("o"), 2000)
	if err := uploadOutput(ctx, f.s, c, "big", out); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(out)
	outBlob := "sha256:" + hex.EncodeToString(sum[:])
	if acc, err := f.s.Complete(ctx, []Completion{{Attempt: c.Attempt, Worker: c.Worker, OK: true,
		Outputs: []Output{{Name: "big", Blob: outBlob, Size: int64(len(out))}}}}); err != nil || !acc[0] {
		t.Fatalf("result: %v %v", acc, err)
	}

	other, err := f.s.CreateOwner(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.s.OwnerByToken(ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	running := f.submit(t, "batch", f.task("r"))
	for _, tc := range []struct {
		name  string
		owner int64
		id    string
		want  error
	}{
		{"another owner's", o.ID, id, ErrNotFound},
		{"not an id", f.owner, "nope", ErrNotFound},
		{"running", f.owner, running, ErrWorkflowRunning},
	} {
		if err := f.s.DeleteWorkflow(ctx, tc.owner, tc.id); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}

	// Off the owner's list, the data still counts while the workflow
	// reads it (beside the owner's module, of 4 bytes).
	if err := f.s.RemoveBlob(ctx, f.owner, b.ID); err != nil {
		t.Fatal(err)
	}
	var qe *QuotaError
	if _, err := f.s.BeginBlobUpload(ctx, f.owner, 1500, 1000); !errors.As(err, &qe) || qe.Used != 1004 {
		t.Fatalf("an upload of 1,000 bytes with a quota of 1,500 while a workflow reads 1,000: %v", err)
	}

	if err := f.s.DeleteWorkflow(ctx, f.owner, id); err != nil {
		t.Fatal(err)
	}
	for what, n := range map[string]int{
		"workflow":    count(`SELECT count(*) FROM workflows WHERE id = $1`, id),
		"tasks":       count(`SELECT count(*) FROM tasks WHERE workflow_id = $1`, id),
		"attempts":    count(`SELECT count(*) FROM attempts WHERE id = $1`, c.Attempt),
		"outputs":     count(`SELECT count(*) FROM task_outputs WHERE task_id = $1`, c.TaskID),
		"uploads":     count(`SELECT count(*) FROM output_uploads WHERE attempt_id = $1`, c.Attempt),
		"blobs":       count(`SELECT count(*) FROM blobs WHERE id = ANY($1)`, []string{b.ID, outBlob}),
		"blob chunks": count(`SELECT count(*) FROM blob_chunks`),
	} {
		if n != 0 {
			t.Errorf("%d %s left", n, what)
		}
	}
	if st, err := f.s.Status(ctx, f.owner, running); err != nil || st.State != StateRunning {
		t.Errorf("the other workflow: %v, %v", st, err)
	}
	u, err = f.s.BeginBlobUpload(ctx, f.owner, 1500, 1000)
	if err != nil {
		t.Fatalf("an upload of 1,000 bytes with a quota of 1,500 after the delete: %v", err)
	}
	u.Abort(ctx)
	if err := f.s.DeleteWorkflow(ctx, f.owner, id); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted twice: %v", err)
	}
}
