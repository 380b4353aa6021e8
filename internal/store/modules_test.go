package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
)

// moduleOf returns n bytes of fill, a module body as far as the store is
// concerned, and its id.
func moduleOf(n int, fill byte) (string, []byte) {
	body := bytes.Repeat([]byte{fill}, n)
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:]), body
}

// moduleStored reports whether module id's row is in the database.
func (f *fixture) moduleStored(t *testing.T, id string) bool {
	t.Helper()
	var ok bool
	if err := f.s.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM modules WHERE id = $1)`, id).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// Modules count in their owner's data quota with its blobs, each once: a
// module the owner keeps already costs nothing to push again, one that
// would pass the quota is refused and stores nothing, and data finds the
// room the modules took. Owners are counted apart, a module two owners
// push counts for each, and one owner's removal leaves the other's module.
// Before, modules took no room: an owner could fill the disk with them.
func TestModulesCountInTheQuota(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t) // the owner has the fixture's module, of 4 bytes
	const quota = 1000
	a, aBody := moduleOf(600, 'a')
	b, bBody := moduleOf(400, 'b')
	other := f.otherOwner(t, "other")
	var qe *QuotaError
	for _, step := range []struct {
		name    string
		owner   int64
		id      string
		body    []byte
		created bool
		used    int64 // of a refusal; 0: accepted
	}{
		{"a module that fits", f.owner, a, aBody, true, 0},
		{"the same again, though past the quota", f.owner, a, aBody, false, 0},
		{"a module past the quota", f.owner, b, bBody, false, 604},
		{"the first module, by another owner", other, a, aBody, true, 0},
		{"the second, by the other owner", other, b, bBody, true, 0},
	} {
		_, created, err := f.s.PutModule(ctx, step.owner, quota, step.id, step.body, []string{})
		switch {
		case step.used != 0:
			if !errors.As(err, &qe) || qe.Used != step.used || qe.Size != int64(len(step.body)) || qe.Quota != quota {
				t.Fatalf("%s: %v, want a QuotaError of %d bytes used and %d more", step.name, err, step.used, len(step.body))
			}
		case err != nil || created != step.created:
			t.Fatalf("%s: created %v, %v; want created %v", step.name, created, err, step.created)
		}
	}
	if missing, err := f.s.MissingModules(ctx, f.owner, []string{b}); err != nil || len(missing) != 1 {
		t.Errorf("the module refused is the owner's: missing %v, %v", missing, err)
	}
	// Data finds the modules' bytes in use: 604 of 1,000.
	if _, err := f.s.BeginBlobUpload(ctx, f.owner, quota, 397); !errors.As(err, &qe) || qe.Used != 604 {
		t.Errorf("data of 397 bytes beside 604 of modules, with a quota of 1,000: %v, want a QuotaError of 604 used", err)
	}
	u, err := f.s.BeginBlobUpload(ctx, f.owner, quota, 396)
	if err != nil {
		t.Fatalf("data of 396 bytes beside 604 of modules, with a quota of 1,000: %v", err)
	}
	u.Abort(ctx)

	// Removed by one owner, a module stays for the other, and the room
	// it took is the first owner's again.
	if err := f.s.RemoveModule(ctx, f.owner, a); err != nil {
		t.Fatal(err)
	}
	if !f.moduleStored(t, a) {
		t.Fatal("a module the other owner lists was deleted")
	}
	if _, _, err := f.s.PutModule(ctx, f.owner, quota, b, bBody, []string{}); err != nil {
		t.Fatalf("the second module once the first was removed: %v", err)
	}
	if err := f.s.RemoveModule(ctx, other, a); err != nil {
		t.Fatal(err)
	}
	if f.moduleStored(t, a) {
		t.Error("a module nothing holds any more is still stored")
	}

	for _, tc := range []struct {
		name  string
		owner int64
		id    string
	}{
		{"removed already", f.owner, a},
		{"another owner's only", other, f.module},
		{"unknown", f.owner, "sha256:" + hex.EncodeToString(make([]byte, 32))},
		{"not text", f.owner, "\x00"},
	} {
		if err := f.s.RemoveModule(ctx, tc.owner, tc.id); !errors.Is(err, ErrNotFound) {
			t.Errorf("remove a module %s: %v, want ErrNotFound", tc.name, err)
		}
	}
	if !f.moduleStored(t, f.module) {
		t.Error("another owner's attempt to remove a module deleted it")
	}
}

// A module a workflow uses stays when its owner removes it, and counts in
// the owner's quota (pushing it again is free), until the workflow is
// deleted: DeleteWorkflow then deletes it. A module deleted while it kept
// its bytes would let an owner store without bound.
func TestModuleUsedByAWorkflowStaysUntilItIsDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	m, body := moduleOf(500, 'm')
	if _, _, err := f.s.PutModule(ctx, f.owner, 1<<20, m, body, []string{}); err != nil {
		t.Fatal(err)
	}
	task := f.task("a")
	task.Module = m
	id := f.submit(t, "batch", task)
	if _, err := f.s.Cancel(ctx, f.owner, id); err != nil {
		t.Fatal(err)
	}
	if err := f.s.RemoveModule(ctx, f.owner, m); err != nil {
		t.Fatal(err)
	}
	if !f.moduleStored(t, m) {
		t.Fatal("a module a workflow uses was deleted")
	}
	if missing, err := f.s.MissingModules(ctx, f.owner, []string{m}); err != nil || len(missing) != 1 {
		t.Errorf("the removed module is still the owner's: missing %v, %v", missing, err)
	}
	n, nBody := moduleOf(600, 'n')
	var qe *QuotaError
	if _, _, err := f.s.PutModule(ctx, f.owner, 1000, n, nBody, []string{}); !errors.As(err, &qe) || qe.Used != 504 {
		t.Errorf("600 bytes more beside a removed module a workflow uses: %v, want a QuotaError of 504 used", err)
	}
	if _, created, err := f.s.PutModule(ctx, f.owner, 504, m, body, []string{}); err != nil || !created {
		t.Errorf("the removed module again, with a quota of what is in use: created %v, %v; want created", created, err)
	}
	if err := f.s.RemoveModule(ctx, f.owner, m); err != nil {
		t.Fatal(err)
	}

	if err := f.s.DeleteWorkflow(ctx, f.owner, id); err != nil {
		t.Fatal(err)
	}
	if f.moduleStored(t, m) {
		t.Error("the workflow is deleted, and the module nothing holds any more is still stored")
	}
	if !f.moduleStored(t, f.module) {
		t.Error("the owner's module was deleted with a workflow that did not use it")
	}
	if _, _, err := f.s.PutModule(ctx, f.owner, 1000, n, nBody, []string{}); err != nil {
		t.Errorf("600 bytes more once the workflow is deleted: %v", err)
	}
}

// Two pushes of one owner at once cannot both fit the same room: the
// owner's row orders them, and the second counts the first.
func TestConcurrentModulePushesKeepTheQuota(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	const quota = 1000
	tx := f.holdOwner(t)
	errs := make(chan error, 2)
	for _, fill := range []byte{'x', 'y'} {
		go func() {
			id, body := moduleOf(600, fill)
			_, _, err := f.s.PutModule(ctx, f.owner, quota, id, body, []string{})
			errs <- err
		}()
	}
	refused := f.quotaRefusals(t, tx, errs)
	ms, err := f.s.Modules(ctx, f.owner)
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	for _, m := range ms {
		used += m.Size
	}
	if refused != 1 || used > quota {
		t.Errorf("%d of the two pushes refused, and the owner keeps %d bytes; want 1 refused, at most its quota of %d", refused, used, quota)
	}
}

// A module pushed by one owner while another's removal is deleting it is
// stored again, not refused by the foreign key of a row gone meanwhile.
func TestModulePushedWhileItIsDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	other := f.otherOwner(t, "other")
	// The removal of the fixture's module, which only the owner has, holds
	// its row (as dropUnusedModules does) while the other owner pushes it.
	tx, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `DELETE FROM owner_modules WHERE owner_id = $1 AND module_id = $2`, f.owner, f.module); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM modules WHERE id = $1 FOR UPDATE`, f.module); err != nil {
		t.Fatal(err)
	}
	pushed := make(chan error, 1)
	go func() {
		_, _, err := f.s.PutModule(ctx, other, 1<<20, f.module, []byte("\x00asm"), []string{})
		pushed <- err
	}()
	f.waitForLockWaits(t, 1)
	if _, err := tx.Exec(ctx, `DELETE FROM modules WHERE id = $1`, f.module); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-pushed; err != nil {
		t.Fatalf("push a module while it is deleted: %v", err)
	}
	if missing, err := f.s.MissingModules(ctx, other, []string{f.module}); err != nil || len(missing) != 0 || !f.moduleStored(t, f.module) {
		t.Errorf("the module pushed while it was deleted: stored %v, missing for its owner %v, %v", f.moduleStored(t, f.module), missing, err)
	}
}
