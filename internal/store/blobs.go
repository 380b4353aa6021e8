package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// BlobChunkBytes is the size of the chunks a blob is stored in (the last
// one may be shorter).
const BlobChunkBytes = 1 << 20

// MaxBlobUploads bounds the uploads one owner may have in progress at once.
const MaxBlobUploads = 4

// StaleBlobUpload is how long an upload may go without writing a chunk
// before CollectBlobGarbage removes what it wrote.
const StaleBlobUpload = time.Hour

// Blob describes a data blob as its owner sees it: Name is the file name
// it was pushed with.
type Blob struct {
	ID        string
	Name      string
	Size      int64
	Archive   bool
	CreatedAt time.Time
}

// QuotaError refuses an upload (of data or of a module) that would take
// the bytes an owner keeps past its quota.
type QuotaError struct {
	Quota int64 // bytes an owner may keep in blobs and modules
	Used  int64 // bytes it keeps now
	Size  int64 // bytes of the upload, or at least what arrived before it passed the quota
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("the data quota of %d bytes would be exceeded: %d bytes are in use and the upload has %d "+
		"(free some with `cyclepool data rm`, `cyclepool module rm`, or `cyclepool delete` of workflows that ended)",
		e.Quota, e.Used, e.Size)
}

// ErrTooManyUploads refuses an upload while its owner has MaxBlobUploads
// others in progress.
var ErrTooManyUploads = fmt.Errorf("%d uploads of data are in progress already: wait for one to end", MaxBlobUploads)

// BlobUpload writes one blob's bytes in chunks as they arrive; nothing of
// it is visible until Commit. Abort (or, after a crash,
// CollectBlobGarbage) removes what it wrote.
//
// Up to bulkConns chunks (of all uploads) are written at once, each on a
// connection of its own, while the upload reads on (a database backend
// takes about as long to store a chunk as a client takes to send it;
// docs/RATIONALE.md, "Why are chunks written concurrently?").
type BlobUpload struct {
	s     *Store
	owner int64
	key   int64
	quota int64
	used  int64 // the owner's bytes in blobs when the upload began
	seq   int
	size  int64
	buf   []byte
	h     hash.Hash
	// over is the error of a write that passes quota (a *QuotaError
	// when nil).
	over func(used, size int64) error

	touched time.Time      // when a chunk write last marked the upload alive
	writes  sync.WaitGroup // chunk writes in flight
	mu      sync.Mutex
	err     error // the first chunk write that failed
}

// lockOwnerSQL takes the row of owner $1 for the rest of the transaction,
// ordering the beginnings and commits of its uploads. It is a statement
// of its own: in READ COMMITTED, a statement that waited for the lock
// reads the other tables as they were when it began, so what the owner's
// other uploads did while it waited is read by the statements after it.
// NO KEY UPDATE leaves the row's key to the foreign keys of other rows
// written meanwhile (workflows, blob_uploads).
const lockOwnerSQL = `SELECT 1 FROM owners WHERE id = $1 FOR NO KEY UPDATE`

// ownerBytesSQL sums the bytes that the owner (the parameter owner names)
// keeps stored, other than the blob except names: the blobs on its list,
// and those its workflows read (a blob the owner removed from its list
// stays while one of its workflows reads it, until the workflow is
// deleted: DeleteWorkflow); and likewise the modules on its list and
// those its workflows use. Each blob and each module counts once, however
// many hold it; one the owner shares with other owners counts for each.
func ownerBytesSQL(owner, except string) string {
	return `SELECT (SELECT coalesce(sum(b.size), 0) FROM blobs b WHERE b.id <> ` + except + ` AND b.id IN (
		SELECT ob.blob_id FROM owner_blobs ob WHERE ob.owner_id = ` + owner + `
		UNION SELECT wb.blob_id FROM workflows w JOIN workflow_blobs wb ON wb.workflow_id = w.id WHERE w.owner_id = ` + owner + `))::bigint
	+ (` + ownerModuleBytesSQL(owner) + `)`
}

// ownerModuleBytesSQL sums the bytes of the modules the owner keeps: those
// on its list and those its workflows use, each once.
func ownerModuleBytesSQL(owner string) string {
	return `SELECT coalesce(sum(m.size), 0)::bigint FROM modules m WHERE m.id IN (
		SELECT om.module_id FROM owner_modules om WHERE om.owner_id = ` + owner + `
		UNION SELECT wm.module_id FROM workflows w JOIN workflow_modules wm ON wm.workflow_id = w.id WHERE w.owner_id = ` + owner + `)`
}

// BeginBlobUpload starts an upload for owner, who may keep quota bytes in
// blobs. It fails with a *QuotaError when the owner is at its quota
// already, or when expect (the upload's size if known, else -1) would pass
// it, and with ErrTooManyUploads.
func (s *Store) BeginBlobUpload(ctx context.Context, ownerID, quota, expect int64) (*BlobUpload, error) {
	u := &BlobUpload{s: s, owner: ownerID, quota: quota, h: sha256.New()}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		// Uploads beginning at once would each count the others out.
		if _, err := tx.Exec(ctx, lockOwnerSQL, ownerID); err != nil {
			return err
		}
		var open int
		if err := tx.QueryRow(ctx, `SELECT (SELECT count(*) FROM blob_uploads WHERE owner_id = $1 AND attempt_id IS NULL AND touched_at > now() - $2::interval),
			(`+ownerBytesSQL("$1", "''")+`)`, ownerID, StaleBlobUpload).Scan(&open, &u.used); err != nil {
			return err
		}
		if open >= MaxBlobUploads {
			return ErrTooManyUploads
		}
		if u.used+max(expect, 0) > quota || u.used >= quota && expect != 0 {
			return &QuotaError{Quota: quota, Used: u.used, Size: max(expect, 0)}
		}
		return tx.QueryRow(ctx, `INSERT INTO blob_uploads (key, owner_id) VALUES (nextval('blob_keys'), $1) RETURNING key`, ownerID).Scan(&u.key)
	})
	if err != nil {
		return nil, fmt.Errorf("begin data upload: %w", err)
	}
	return u, nil
}

// Write adds p to the blob. It fails with a *QuotaError as soon as the
// blob would pass the owner's quota.
func (u *BlobUpload) Write(ctx context.Context, p []byte) error {
	if u.used+u.size+int64(len(p)) > u.quota {
		if u.over != nil {
			return u.over(u.used, u.size+int64(len(p)))
		}
		return &QuotaError{Quota: u.quota, Used: u.used, Size: u.size + int64(len(p))}
	}
	u.h.Write(p)
	u.size += int64(len(p))
	for len(p) > 0 {
		if u.buf == nil {
			u.buf = make([]byte, 0, BlobChunkBytes)
		}
		n := min(len(p), BlobChunkBytes-len(u.buf))
		u.buf = append(u.buf, p[:n]...)
		p = p[n:]
		if len(u.buf) == BlobChunkBytes {
			if err := u.flush(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// ReadFrom copies r into the blob, a chunk at a time.
func (u *BlobUpload) ReadFrom(ctx context.Context, r io.Reader) (int64, error) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			if werr := u.Write(ctx, buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// flush hands the buffered chunk to a writer of its own, and takes in
// exchange one of the Store's chunk buffers, waiting while all are being
// written. It returns the error of any chunk write that failed before.
func (u *BlobUpload) flush(ctx context.Context) error {
	if err := u.failed(); err != nil || len(u.buf) == 0 {
		return err
	}
	var next []byte
	select {
	case next = <-u.s.chunkBufs:
	case <-ctx.Done():
		return fmt.Errorf("write data chunk %d: %w", u.seq, ctx.Err())
	}
	if next == nil {
		next = make([]byte, 0, BlobChunkBytes)
	}
	buf, seq := u.buf, u.seq
	u.buf, u.seq = next[:0], u.seq+1
	touch := time.Since(u.touched) >= touchEvery
	if touch {
		u.touched = time.Now()
	}
	u.writes.Add(1)
	// Not the upload's context: a statement cancelled mid-way may still
	// commit, after Abort removed the upload's chunks, and leave one
	// behind; Abort waits for the writes instead.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), chunkWriteTimeout)
	go func() {
		defer u.writes.Done()
		defer cancel()
		err := u.writeChunk(wctx, seq, buf, touch)
		u.s.chunkBufs <- buf
		if err != nil {
			u.mu.Lock()
			if u.err == nil {
				u.err = err
			}
			u.mu.Unlock()
		}
	}()
	return nil
}

// writeChunk stores chunk seq. The bulk connections do not wait for the
// WAL flush (bulkParams), which is safe: the blob becomes visible only
// with Commit's transaction, whose flush covers every chunk's WAL before
// it (a crash before it loses chunks of an upload nobody sees). Waiting
// took 20 ms a MiB. touch marks the upload alive.
func (u *BlobUpload) writeChunk(ctx context.Context, seq int, data []byte, touch bool) error {
	if _, err := u.s.bulk.Exec(ctx, `INSERT INTO blob_chunks (blob_key, seq, data) VALUES ($1, $2, $3)`, u.key, seq, data); err != nil {
		return fmt.Errorf("write data chunk %d: %w", seq, err)
	}
	if touch {
		if _, err := u.s.bulk.Exec(ctx, `UPDATE blob_uploads SET touched_at = now() WHERE key = $1`, u.key); err != nil {
			return fmt.Errorf("write data chunk %d: %w", seq, err)
		}
	}
	return nil
}

// chunkWriteTimeout bounds the write of one chunk.
const chunkWriteTimeout = time.Minute

// touchEvery is how long an upload goes between the marks that tell
// CollectBlobGarbage it is alive (well within StaleBlobUpload, however
// slowly its client sends).
const touchEvery = time.Minute

// failed returns the error of the first chunk write that failed.
func (u *BlobUpload) failed() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.err
}

// finish writes the last chunk and waits for every write in flight.
func (u *BlobUpload) finish(ctx context.Context) error {
	err := u.flush(ctx)
	u.writes.Wait()
	if err != nil {
		return err
	}
	return u.failed()
}

// Size is how many bytes the upload holds so far.
func (u *BlobUpload) Size() int64 { return u.size }

// ID is the blob id of the bytes written so far ("sha256:<hex>").
func (u *BlobUpload) ID() string { return "sha256:" + hex.EncodeToString(u.h.Sum(nil)) }

// Commit makes the blob visible to its owner under name; archive says the
// bytes were checked as a safe archive. When the same bytes are stored
// already (pushed by this or another owner), what this upload wrote is
// removed and the stored blob is given to the owner: created is false when
// the owner had it already. Commit checks the quota again, against the
// uploads that committed in the meantime.
func (u *BlobUpload) Commit(ctx context.Context, name string, archive bool) (b Blob, created bool, err error) {
	if err := u.finish(ctx); err != nil {
		u.Abort(ctx)
		return b, false, err
	}
	id := u.ID()
	err = u.s.tx(ctx, func(tx pgx.Tx) error {
		// The owner's row orders concurrent commits of one owner, so that
		// two uploads cannot both fit the same room.
		if _, err := tx.Exec(ctx, lockOwnerSQL, u.owner); err != nil {
			return err
		}
		var used int64
		if err := tx.QueryRow(ctx, ownerBytesSQL("$1", "$2"), u.owner, id).Scan(&used); err != nil {
			return err
		}
		if used+u.size > u.quota {
			return &QuotaError{Quota: u.quota, Used: used, Size: u.size}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO blobs (id, key, size, chunk_bytes, archive) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (id) DO UPDATE SET archive = blobs.archive OR excluded.archive`, id, u.key, u.size, BlobChunkBytes, archive); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM blob_uploads WHERE key = $1`, u.key); err != nil {
			return err
		}
		// xmax is 0 on a row the statement inserted, not on one it updated.
		if err := tx.QueryRow(ctx, `INSERT INTO owner_blobs (owner_id, blob_id, name) VALUES ($1, $2, $3)
			ON CONFLICT (owner_id, blob_id) DO UPDATE SET name = excluded.name RETURNING xmax = 0, created_at`,
			u.owner, id, name).Scan(&created, &b.CreatedAt); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT size, archive FROM blobs WHERE id = $1`, id).Scan(&b.Size, &b.Archive)
	})
	if err != nil {
		u.Abort(ctx)
		return b, false, fmt.Errorf("store data %s: %w", id, err)
	}
	b.ID, b.Name = id, name
	// The bytes were there already: this upload's chunks are garbage.
	u.dropChunks(ctx)
	return b, created, nil
}

// Abort removes what the upload wrote. It runs on a context of its own, so
// that an upload cut off by its client is still cleaned up.
func (u *BlobUpload) Abort(ctx context.Context) {
	u.writes.Wait()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _ = u.s.pool.Exec(ctx, `DELETE FROM blob_uploads WHERE key = $1`, u.key)
	u.dropChunks(ctx)
}

// dropChunks removes the upload's chunks unless a blob owns them.
func (u *BlobUpload) dropChunks(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _ = u.s.bulk.Exec(ctx, `DELETE FROM blob_chunks WHERE blob_key = $1 AND NOT EXISTS (SELECT 1 FROM blobs WHERE key = $1)`, u.key)
}

// OwnerBlob returns the owner's blob id, or ErrNotFound when the owner has
// not pushed it (whether or not another owner has).
func (s *Store) OwnerBlob(ctx context.Context, ownerID int64, id string) (Blob, error) {
	b := Blob{ID: id}
	if !ValidText(id) {
		return b, ErrNotFound
	}
	err := s.pool.QueryRow(ctx, `SELECT ob.name, b.size, b.archive, ob.created_at FROM owner_blobs ob JOIN blobs b ON b.id = ob.blob_id
		WHERE ob.owner_id = $1 AND ob.blob_id = $2`, ownerID, id).Scan(&b.Name, &b.Size, &b.Archive, &b.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return b, ErrNotFound
	}
	if err != nil {
		return b, fmt.Errorf("look up data %s: %w", id, err)
	}
	return b, nil
}

// OwnerBlobs returns those of ids the owner has pushed, by id; an id
// missing from the map is one the owner cannot use.
func (s *Store) OwnerBlobs(ctx context.Context, ownerID int64, ids []string) (map[string]Blob, error) {
	rows, err := s.pool.Query(ctx, `SELECT b.id, ob.name, b.size, b.archive, ob.created_at FROM owner_blobs ob JOIN blobs b ON b.id = ob.blob_id
		WHERE ob.owner_id = $1 AND ob.blob_id = ANY($2)`, ownerID, ids)
	if err != nil {
		return nil, fmt.Errorf("look up data: %w", err)
	}
	bs, err := pgx.CollectRows(rows, scanBlob)
	if err != nil {
		return nil, fmt.Errorf("look up data: %w", err)
	}
	m := make(map[string]Blob, len(bs))
	for _, b := range bs {
		m[b.ID] = b
	}
	return m, nil
}

func scanBlob(r pgx.CollectableRow) (Blob, error) {
	var b Blob
	err := r.Scan(&b.ID, &b.Name, &b.Size, &b.Archive, &b.CreatedAt)
	return b, err
}

// Blobs lists the blobs an owner has pushed, newest first.
func (s *Store) Blobs(ctx context.Context, ownerID int64) ([]Blob, error) {
	rows, err := s.pool.Query(ctx, `SELECT b.id, ob.name, b.size, b.archive, ob.created_at FROM owner_blobs ob JOIN blobs b ON b.id = ob.blob_id
		WHERE ob.owner_id = $1 ORDER BY ob.created_at DESC, b.id`, ownerID)
	if err != nil {
		return nil, fmt.Errorf("list data: %w", err)
	}
	bs, err := pgx.CollectRows(rows, scanBlob)
	if err != nil {
		return nil, fmt.Errorf("list data: %w", err)
	}
	return bs, nil
}

// RemoveBlob takes a blob off the owner's list (and out of its quota), or
// returns ErrNotFound. The bytes stay while a workflow reads them or
// another owner has the blob; CollectBlobGarbage removes them after.
func (s *Store) RemoveBlob(ctx context.Context, ownerID int64, id string) error {
	if !ValidText(id) {
		return ErrNotFound
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM owner_blobs WHERE owner_id = $1 AND blob_id = $2`, ownerID, id)
	if err != nil {
		return fmt.Errorf("remove data %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	return nil
}

// CollectBlobGarbage removes blobs that no owner, workflow, task output or
// running attempt's upload holds,
// and the chunks of uploads that wrote nothing for StaleBlobUpload (their
// client went away and the server that served it died before cleaning up).
// It returns how many blobs and uploads it removed.
func (s *Store) CollectBlobGarbage(ctx context.Context) (int64, error) {
	var n int64
	err := s.tx(ctx, func(tx pgx.Tx) error {
		n = 0
		rows, err := tx.Query(ctx, `DELETE FROM blobs b WHERE `+blobUnused+` RETURNING key`)
		if err != nil {
			return err
		}
		keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		stale, err := tx.Query(ctx, `DELETE FROM blob_uploads WHERE touched_at < now() - $1::interval RETURNING key`, StaleBlobUpload)
		if err != nil {
			return err
		}
		staleKeys, err := pgx.CollectRows(stale, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		keys = append(keys, staleKeys...)
		n = int64(len(keys))
		if len(keys) > 0 {
			if _, err := tx.Exec(ctx, `DELETE FROM blob_chunks WHERE blob_key = ANY($1)`, keys); err != nil {
				return err
			}
		}
		// Chunks of neither a blob nor an upload in progress (a chunk
		// always has one of them while it may be needed: an upload's row
		// is written before its chunks and removed with its blob's
		// insertion), which nothing else would ever remove.
		_, err = tx.Exec(ctx, `DELETE FROM blob_chunks c WHERE NOT EXISTS (SELECT 1 FROM blobs b WHERE b.key = c.blob_key)
			AND NOT EXISTS (SELECT 1 FROM blob_uploads u WHERE u.key = c.blob_key)`)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("collect data garbage: %w", err)
	}
	return n, nil
}

// blobUnused is the condition on a blobs row b that nothing holds it: no
// owner, workflow, running attempt's upload, task output or checkpoint.
const blobUnused = `NOT EXISTS (SELECT 1 FROM owner_blobs ob WHERE ob.blob_id = b.id)
	AND NOT EXISTS (SELECT 1 FROM workflow_blobs wb WHERE wb.blob_id = b.id)
	AND NOT EXISTS (SELECT 1 FROM output_uploads u WHERE u.blob_id = b.id)
	AND NOT EXISTS (SELECT 1 FROM task_outputs o WHERE o.blob_id = b.id)
	AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.checkpoint_blob = b.id)`

// dropUnusedBlobs removes those of the blobs ids that nothing holds, with
// their chunks, in tx.
func dropUnusedBlobs(ctx context.Context, tx pgx.Tx, ids []string) error {
	rows, err := tx.Query(ctx, `DELETE FROM blobs b WHERE b.id = ANY($1) AND `+blobUnused+` RETURNING key`, ids)
	if err != nil {
		return err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(keys) == 0 {
		return err
	}
	_, err = tx.Exec(ctx, `DELETE FROM blob_chunks WHERE blob_key = ANY($1)`, keys)
	return err
}

// BlobReader reads a stored blob a chunk at a time; it is an io.ReadSeeker
// (for http.ServeContent and its ranges). It holds readAhead chunks in
// memory.
type BlobReader struct {
	s          *Store
	ctx        context.Context
	key        int64
	size       int64
	chunkBytes int64
	pos        int64
	seq        int64    // the first chunk in chunks
	chunks     [][]byte // readAhead chunks from seq, read in one query
	bufs       [][]byte // the chunks' memory, reused by every load
}

// readAhead is how many chunks a BlobReader reads in one query: one round
// trip per 4 MiB rather than per MiB (394 MiB/s one by one, loopback).
const readAhead = 4

// load reads the chunks from seq on.
func (r *BlobReader) load(seq int64) error {
	r.chunks = r.chunks[:0]
	rows, err := r.s.bulk.Query(r.ctx, `SELECT data FROM blob_chunks WHERE blob_key = $1 AND seq >= $2 AND seq < $3 ORDER BY seq`,
		r.key, seq, seq+readAhead)
	if err != nil {
		return fmt.Errorf("read data chunk %d: %w", seq, err)
	}
	// Copied from the connection's buffer into the reader's own, reused:
	// a download allocates readAhead chunks once, not per load.
	var b pgtype.DriverBytes
	for rows.Next() {
		if err := rows.Scan(&b); err != nil {
			rows.Close()
			return fmt.Errorf("read data chunk %d: %w", seq, err)
		}
		i := len(r.chunks)
		if i == len(r.bufs) {
			r.bufs = append(r.bufs, nil)
		}
		r.bufs[i] = append(r.bufs[i][:0], b...)
		r.chunks = append(r.chunks, r.bufs[i])
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read data chunk %d: %w", seq, err)
	}
	if len(r.chunks) == 0 {
		return fmt.Errorf("read data chunk %d: missing", seq)
	}
	r.seq = seq
	return nil
}

// OpenBlob opens blob id for reading, whoever pushed it, or returns
// ErrNotFound. ctx bounds every read.
func (s *Store) OpenBlob(ctx context.Context, id string) (*BlobReader, error) {
	r := &BlobReader{s: s, ctx: ctx}
	err := s.pool.QueryRow(ctx, `SELECT key, size, chunk_bytes FROM blobs WHERE id = $1`, id).Scan(&r.key, &r.size, &r.chunkBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("open data %s: %w", id, err)
	}
	return r, nil
}

// Size is the blob's size in bytes.
func (r *BlobReader) Size() int64 { return r.size }

// Read implements io.Reader.
func (r *BlobReader) Read(p []byte) (int, error) {
	if r.pos >= r.size {
		return 0, io.EOF
	}
	seq := r.pos / r.chunkBytes
	if seq < r.seq || seq >= r.seq+int64(len(r.chunks)) {
		if err := r.load(seq); err != nil {
			return 0, err
		}
	}
	buf := r.chunks[seq-r.seq]
	off := r.pos - seq*r.chunkBytes
	if off >= int64(len(buf)) {
		return 0, fmt.Errorf("read data chunk %d: %d bytes, want more than %d", seq, len(buf), off)
	}
	n := copy(p, buf[off:])
	r.pos += int64(n)
	return n, nil
}

// Seek implements io.Seeker.
func (r *BlobReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.size
	default:
		return 0, errors.New("seek data: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("seek data: negative position")
	}
	r.pos = offset
	return offset, nil
}

// Secret returns the shared secret called name, of n random bytes made by
// the first replica that asked for it.
func (s *Store) Secret(ctx context.Context, name string, n int) ([]byte, error) {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	var v []byte
	err := s.pool.QueryRow(ctx, `WITH ins AS (INSERT INTO secrets (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING RETURNING value)
		SELECT value FROM ins UNION ALL SELECT value FROM secrets WHERE name = $1`, name, b).Scan(&v)
	if err != nil {
		return nil, fmt.Errorf("read secret %s: %w", name, err)
	}
	return v, nil
}
