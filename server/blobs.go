package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/archive"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/workflow"
)

// MaxBlobNameBytes bounds the file name a blob is pushed with.
const MaxBlobNameBytes = 255

// blobKeys signs the capabilities with which workers download blobs
// (blobToken). The key is a secret every replica shares (store.Secret),
// read once.
type blobKeys struct {
	mu  sync.Mutex
	key []byte
}

// blobToken returns the capability for blob id: workers download
// /blobs/ID?k=TOKEN, which the server gives only in the assignments of
// tasks that read the blob. It is the same for every worker and never
// expires (blobs are immutable), so caches near the workers can keep the
// bytes under one address.
func (s *Server) blobToken(ctx context.Context, id string) (string, error) {
	return s.blobKeys.sign(ctx, s.store, id)
}

// uploadKey returns worker's capability for uploading the outputs of the
// attempts it holds (protocol.Welcome.UploadKey). Signed with the key of
// blob tokens under a prefix no blob id has.
func (s *Server) uploadKey(ctx context.Context, worker string) (string, error) {
	return s.blobKeys.sign(ctx, s.store, "upload\x00"+worker)
}

// sign returns the capability for msg, reading the shared key the first
// time.
func (k *blobKeys) sign(ctx context.Context, st *store.Store, msg string) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key == nil {
		key, err := st.Secret(ctx, "blob-token", 32)
		if err != nil {
			return "", err
		}
		k.key = key
	}
	m := hmac.New(sha256.New, k.key)
	m.Write([]byte(msg))
	return hex.EncodeToString(m.Sum(nil)[:16]), nil
}

// handleWorkerBlob serves a blob to a worker holding its capability, with
// ranges (an interrupted download resumes) and caching forever. A wrong
// capability answers exactly as an absent blob.
func (s *Server) handleWorkerBlob(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	want, err := s.blobToken(r.Context(), id)
	if err != nil {
		s.serverError(w, "read data", err)
		return
	}
	if !workflow.IsModuleID(id) || !hmac.Equal([]byte(r.URL.Query().Get("k")), []byte(want)) {
		http.Error(w, "no data "+id, http.StatusNotFound)
		return
	}
	s.serveBlob(w, r, id, blobCache)
}

// The Cache-Control of what serveBlob answers. A blob's own address names
// its bytes (its id is their hash), so its answer may be kept for ever
// (blobCache, ownBlobCache); an output's address names a task's output,
// which a re-check that overturns the task's result replaces
// (verify.go), so a client asks again each time and gets 304 while the
// bytes are the same (outputCache, with the ETag).
const (
	blobCache    = "public, max-age=31536000, immutable"
	ownBlobCache = "private, max-age=31536000, immutable"
	outputCache  = "private, no-cache"
)

// serveBlob streams blob id, a chunk at a time, with Cache-Control cache.
func (s *Server) serveBlob(w http.ResponseWriter, r *http.Request, id, cache string) {
	br, err := s.store.OpenBlob(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) {
		http.Error(w, "no data "+id, http.StatusNotFound)
		return
	}
	if err != nil {
		s.serverError(w, "read data", err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", cache)
	w.Header().Set("ETag", `"`+id+`"`)
	http.ServeContent(w, r, "", time.Time{}, br)
}

// handlePushBlob stores the request's body as a blob: PUT
// /api/v1/blobs/ID?name=NAME[&archive=1], whose body's hash must be ID, or
// POST /api/v1/blobs?name=NAME[&archive=1] (the dashboard's upload, and
// clients that cannot hash first). The body is streamed into the database
// a chunk at a time. Nothing of a refused or interrupted upload becomes
// visible.
func (s *Server) handlePushBlob(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	id := r.PathValue("id") // "" for POST /api/v1/blobs: whatever the hash is
	if r.Method == http.MethodPut && !workflow.IsModuleID(id) {
		writeError(w, http.StatusBadRequest, "data id %q is not sha256: and 64 lower-case hex digits", id)
		return
	}
	q := r.URL.Query()
	name := q.Get("name")
	if len(name) > MaxBlobNameBytes {
		writeError(w, http.StatusBadRequest, "data name is longer than %d bytes", MaxBlobNameBytes)
		return
	}
	if !store.ValidText(name) {
		writeError(w, http.StatusBadRequest, "data name %q is not UTF-8 text without NUL", name)
		return
	}
	isArchive := q.Get("archive") == "1" || q.Get("archive") == "true"
	quota := s.cfg.DataQuota
	if r.ContentLength > quota {
		writeError(w, http.StatusRequestEntityTooLarge, "data of %d bytes is larger than the data quota of %s", r.ContentLength, byteSize(quota))
		return
	}
	u, err := s.store.BeginBlobUpload(r.Context(), owner.ID, quota, r.ContentLength)
	if s.blobRefused(w, err) {
		return
	}
	body := http.MaxBytesReader(w, r.Body, quota+1)
	// An archive is checked as it streams by, in a goroutine of its own
	// reading what the upload wrote; its refusal stops the upload.
	var check chan error
	var pw *io.PipeWriter
	var src io.Reader = body
	if isArchive {
		var pr *io.PipeReader
		pr, pw = io.Pipe()
		check = make(chan error, 1)
		go func() {
			err := archive.Check(pr)
			if err == nil {
				_, err = io.Copy(io.Discard, pr) // tar's trailing padding
			}
			pr.CloseWithError(err)
			check <- err
		}()
		src = io.TeeReader(body, checkPipe{pw})
	}
	_, err = u.ReadFrom(r.Context(), src)
	var refused error // the archive's refusal
	if pw != nil {
		pw.CloseWithError(err)
		if cerr := <-check; err == nil || errors.Is(err, errArchiveRefused) {
			refused = cerr
		}
	}
	if refused != nil {
		u.Abort(r.Context())
		writeError(w, http.StatusBadRequest, "%v; nothing stored", refused)
		return
	}
	if err != nil {
		u.Abort(r.Context())
		if s.blobRefused(w, err) {
			return
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "data is larger than the data quota of %s", byteSize(quota))
			return
		}
		writeError(w, http.StatusBadRequest, "upload cut off after %d bytes: %v; nothing stored", u.Size(), err)
		return
	}
	if got := u.ID(); id != "" && got != id {
		u.Abort(r.Context())
		writeError(w, http.StatusBadRequest, "the data's sha256 is %s, not %s (changed or cut off on the way); nothing stored", got, id)
		return
	}
	b, created, err := u.Commit(r.Context(), name, isArchive)
	if s.blobRefused(w, err) {
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, apiBlob(b))
}

// errArchiveRefused stops an upload whose archive check failed.
var errArchiveRefused = errors.New("the archive was refused")

// checkPipe feeds an archive's check; once the check has refused the
// archive, writing fails with errArchiveRefused.
type checkPipe struct{ pw *io.PipeWriter }

func (c checkPipe) Write(p []byte) (int, error) {
	n, err := c.pw.Write(p)
	if err != nil {
		return n, errArchiveRefused
	}
	return n, nil
}

// blobRefused answers an upload's error, if any, and reports whether it
// did.
func (s *Server) blobRefused(w http.ResponseWriter, err error) bool {
	var qe *store.QuotaError
	switch {
	case err == nil:
		return false
	case errors.As(err, &qe):
		writeError(w, http.StatusRequestEntityTooLarge, "%v; nothing stored", qe)
	case errors.Is(err, store.ErrTooManyUploads):
		w.Header().Set("Retry-After", "10")
		writeError(w, http.StatusTooManyRequests, "%v", store.ErrTooManyUploads)
	default:
		s.serverError(w, "store data", err)
	}
	return true
}

// handleBlob answers HEAD and GET /api/v1/blobs/ID for the blob's owner:
// whether it is there (a client skips what is), and its bytes. Another
// owner's blob answers exactly as an absent one.
func (s *Server) handleBlob(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	id := r.PathValue("id")
	b, err := s.store.OwnerBlob(r.Context(), owner.ID, id)
	if err != nil {
		s.notFoundOr(w, "data "+id, err)
		return
	}
	w.Header().Set("X-Cyclepool-Name", b.Name)
	w.Header().Set("X-Cyclepool-Archive", strconv.FormatBool(b.Archive))
	s.serveBlob(w, r, id, ownBlobCache)
}

// handleBlobs lists the owner's blobs.
func (s *Server) handleBlobs(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	bs, err := s.store.Blobs(r.Context(), owner.ID)
	if err != nil {
		s.serverError(w, "list data", err)
		return
	}
	writeJSON(w, http.StatusOK, apiBlobs(bs))
}

// handleRemoveBlob takes a blob off the owner's list and quota.
func (s *Server) handleRemoveBlob(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	id := r.PathValue("id")
	if err := s.store.RemoveBlob(r.Context(), owner.ID, id); err != nil {
		s.notFoundOr(w, "data "+id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// checkBlobs refuses a workflow whose files name data by path (the CLI
// pushes paths first), data the owner has not pushed, or an archive mount
// of data not pushed as an archive. It returns the owner's blobs by id.
func (s *Server) checkBlobs(ctx context.Context, owner store.Owner, spec *workflow.Spec) (map[string]store.Blob, *workflow.Error, error) {
	ids := spec.BlobIDs()
	paths := spec.BlobPaths()
	if len(ids) == 0 && len(paths) == 0 {
		return nil, nil, nil
	}
	blobs, err := s.store.OwnerBlobs(ctx, owner.ID, ids)
	if err != nil {
		return nil, nil, fmt.Errorf("check data: %w", err)
	}
	for _, t := range spec.Tasks {
		for _, f := range t.Files {
			if f.Blob == "" {
				continue
			}
			field := "files." + f.Path + ".blob"
			b, ok := blobs[f.Blob]
			switch {
			case !workflow.IsModuleID(f.Blob):
				return nil, &workflow.Error{Task: t.Name, Field: field,
					Msg: fmt.Sprintf("data %q is a path: push it first and use its sha256: id (cyclepool submit pushes paths itself)", f.Blob)}, nil
			case !ok:
				return nil, &workflow.Error{Task: t.Name, Field: field,
					Msg: fmt.Sprintf("unknown data %s: push it first (cyclepool data push FILE)", f.Blob)}, nil
			case f.Archive && !b.Archive:
				return nil, &workflow.Error{Task: t.Name, Field: field,
					Msg: fmt.Sprintf("data %s was not pushed as an archive (cyclepool data push DIR, or --archive for a tar file)", f.Blob)}, nil
			}
		}
	}
	return blobs, nil, nil
}

// toSetup is the protocol.Setup of a task: its files' blobs with their
// size and the address workers download them from.
func toSetup(t *workflow.TaskSpec, blobs map[string]store.Blob, token func(id string) (string, error)) (*protocol.Setup, error) {
	su := &protocol.Setup{Env: t.Env, Outputs: t.Outputs, ScratchBytes: t.ScratchBytes}
	if t.Cwd != "/" {
		su.Cwd = t.Cwd
	}
	for _, f := range t.Files {
		if f.Source != nil {
			continue // an input named by its path
		}
		pf := protocol.File{Path: f.Path, Data: f.Data, Archive: f.Archive, Writable: f.Writable}
		if f.Blob != "" {
			tok, err := token(f.Blob)
			if err != nil {
				return nil, err
			}
			pf.Blob, pf.Size, pf.URL = f.Blob, blobs[f.Blob].Size, "/blobs/"+f.Blob+"?k="+tok
		}
		su.Files = append(su.Files, pf)
	}
	return su, nil
}
