package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
)

// Chunks are written concurrently (BlobUpload.flush): uploads at once, each
// of many chunks, are each stored whole and in order, with at most
// bulkConns chunk buffers in flight; and a chunk write that fails fails
// its upload, which leaves nothing behind.
func TestBlobUploadChunksConcurrently(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	blob := func(i int) []byte {
		b := make([]byte, 5*BlobChunkBytes+12345)
		for j := range b {
			b[j] = byte(j*7 + i*13 + j>>20)
		}
		return b
	}
	var wg sync.WaitGroup
	ids := make([]string, 3)
	errs := make([]error, 3)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := f.s.BeginBlobUpload(ctx, f.owner, 1<<30, -1)
			if err != nil {
				errs[i] = err
				return
			}
			if _, err := u.ReadFrom(ctx, bytes.NewReader(blob(i))); err != nil {
				errs[i] = err
				return
			}
			b, _, err := u.Commit(ctx, "b", false)
			ids[i], errs[i] = b.ID, err
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("upload %d: %v", i, errs[i])
		}
		sum := sha256.Sum256(blob(i))
		if want := "sha256:" + hex.EncodeToString(sum[:]); id != want {
			t.Fatalf("upload %d stored as %s, want %s", i, id, want)
		}
		r, err := f.s.OpenBlob(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, blob(i)) {
			t.Fatalf("upload %d read back %d bytes (%v), not what was written", i, len(got), err)
		}
	}
	if n := len(f.s.chunkBufs); n != bulkConns {
		t.Fatalf("%d chunk buffers back after the uploads, want all %d", n, bulkConns)
	}

	// A chunk that cannot be written (its row is taken) fails the upload.
	u, err := f.s.BeginBlobUpload(ctx, f.owner, 1<<30, -1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `INSERT INTO blob_chunks (blob_key, seq, data) VALUES ($1, 2, '\x00')`, u.key); err != nil {
		t.Fatal(err)
	}
	_, err = u.ReadFrom(ctx, bytes.NewReader(blob(9)))
	if err == nil {
		_, _, err = u.Commit(ctx, "bad", false)
	} else {
		u.Abort(ctx)
	}
	if err == nil {
		t.Fatal("an upload whose chunk 2 could not be written was committed")
	}
	var chunks, uploads int
	if err := f.s.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM blob_chunks WHERE blob_key = $1), (SELECT count(*) FROM blob_uploads WHERE key = $1)`,
		u.key).Scan(&chunks, &uploads); err != nil {
		t.Fatal(err)
	}
	if chunks != 0 || uploads != 0 {
		t.Fatalf("the failed upload left %d chunks and %d upload rows", chunks, uploads)
	}
	if n := len(f.s.chunkBufs); n != bulkConns {
		t.Fatalf("%d chunk buffers back after the failed upload, want all %d", n, bulkConns)
	}
}

// A chunk of neither a blob nor an upload in progress (left by a write
// that committed after its upload was aborted) is garbage the collection
// removes; one of an upload in progress stays.
func TestOrphanChunksCollected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	u, err := f.s.BeginBlobUpload(ctx, f.owner, 1<<30, -1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.pool.Exec(ctx, `INSERT INTO blob_chunks (blob_key, seq, data) VALUES ($1, 0, '\x01'), (-7, 0, '\x02')`, u.key); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CollectBlobGarbage(ctx); err != nil {
		t.Fatal(err)
	}
	var live, orphans int
	if err := f.s.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE blob_key = $1), count(*) FILTER (WHERE blob_key = -7) FROM blob_chunks`,
		u.key).Scan(&live, &orphans); err != nil {
		t.Fatal(err)
	}
	if live != 1 || orphans != 0 {
		t.Errorf("after the collection: %d chunks of the upload in progress (want 1), %d orphans (want 0)", live, orphans)
	}
	u.Abort(ctx)
}

// An owner's uploads that begin or commit at once keep their bounds
// together: at most MaxBlobUploads begin, and the second of two uploads
// that commit at once counts the first's bytes against the quota, though
// both began and read the owner's use before either committed.
func TestConcurrentBlobUploadsKeepTheirBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("begin", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		// Every upload reads how many are open, then waits here to
		// record its own.
		tx, err := f.s.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE blob_uploads IN SHARE MODE`); err != nil {
			t.Fatal(err)
		}
		const n = MaxBlobUploads + 2
		errs := make(chan error, n)
		for range n {
			go func() {
				_, err := f.s.BeginBlobUpload(ctx, f.owner, 1<<30, -1)
				errs <- err
			}()
		}
		f.waitForLockWaits(t, n)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		began := 0
		for range n {
			err := <-errs
			switch {
			case err == nil:
				began++
			case !errors.Is(err, ErrTooManyUploads):
				t.Fatal(err)
			}
		}
		if began != MaxBlobUploads {
			t.Errorf("%d uploads began at once, want %d", began, MaxBlobUploads)
		}
	})
	t.Run("commit", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		const quota = 1000
		var us []*BlobUpload
		for _, b := range []string{"a", "b"} {
			u, err := f.s.BeginBlobUpload(ctx, f.owner, quota, 600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := u.ReadFrom(ctx, bytes.NewReader(bytes.Repeat([]byte(b), 600))); err != nil {
				t.Fatal(err)
			}
			us = append(us, u)
		}
		// Both commits wait for the owner's row, held here.
		tx := f.holdOwner(t)
		errs := make(chan error, 2)
		for _, u := range us {
			go func() {
				_, _, err := u.Commit(ctx, "b", false)
				errs <- err
			}()
		}
		refused := f.quotaRefusals(t, tx, errs)
		bs, err := f.s.Blobs(ctx, f.owner)
		if err != nil {
			t.Fatal(err)
		}
		var used int64
		for _, b := range bs {
			used += b.Size
		}
		if refused != 1 || used > quota {
			t.Errorf("%d of the two uploads refused, and the owner keeps %d bytes; want 1 refused, at most its quota of %d", refused, used, quota)
		}
	})
}

// holdOwner holds the fixture owner's row in a transaction (which
// quotaRefusals ends), so that the owner's quota-checked writes wait.
func (f *fixture) holdOwner(t *testing.T) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM owners WHERE id = $1 FOR UPDATE`, f.owner); err != nil {
		t.Fatal(err)
	}
	return tx
}

// quotaRefusals waits until both of two writes of the owner wait behind tx
// (which holds the owner's row), lets them go by rolling tx back, and
// returns how many of the two the quota refused; any other error fails t.
func (f *fixture) quotaRefusals(t *testing.T, tx pgx.Tx, errs <-chan error) int {
	t.Helper()
	f.waitForLockWaits(t, 2)
	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	refused := 0
	for range 2 {
		err := <-errs
		var qe *QuotaError
		switch {
		case errors.As(err, &qe):
			refused++
		case err != nil:
			t.Fatal(err)
		}
	}
	return refused
}
