package server

import (
	"crypto/hmac"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/workflow"
)

// MaxWorkerUploads bounds the outputs one worker uploads at once to one
// replica, and MaxUploads those of all workers: each holds about 1.3 MiB
// of the replica's memory while it streams.
const (
	MaxWorkerUploads = 4
	MaxUploads       = 48
)

// workerUploads counts the uploads in progress per worker.
type workerUploads struct {
	mu    sync.Mutex
	n     map[string]int
	total int
}

// begin reserves an upload for worker, or reports false when it has
// MaxWorkerUploads in progress or the replica MaxUploads.
func (u *workerUploads) begin(worker string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n == nil {
		u.n = map[string]int{}
	}
	if u.n[worker] >= MaxWorkerUploads || u.total >= MaxUploads {
		return false
	}
	u.n[worker]++
	u.total++
	return true
}

func (u *workerUploads) end(worker string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.total--
	if u.n[worker]--; u.n[worker] <= 0 {
		delete(u.n, worker)
	}
}

// handleUploadOutput stores one output of a running attempt, streamed
// into a blob: PUT /outputs/{attempt}?name=NAME&w=WORKER&k=UPLOAD_KEY
// (docs/PROTOCOL.md, "Outputs over HTTP"), or its checkpoint: PUT
// /checkpoints/{attempt}?w=WORKER&k=UPLOAD_KEY, within the task's memory
// limit, which the checkpoint frame then names. It answers the blob's id and
// size as JSON; the worker's result then names it. The attempt must run
// on that worker, and its uploads stay within the task's output limit
// (413 past it, with nothing stored).
func (s *Server) handleUploadOutput(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	worker, name := q.Get("w"), q.Get("name")
	attempt, err := strconv.ParseInt(r.PathValue("attempt"), 10, 64)
	if err != nil || attempt <= 0 {
		writeError(w, http.StatusBadRequest, "attempt %q is not an attempt id", r.PathValue("attempt"))
		return
	}
	want, err := s.uploadKey(r.Context(), worker)
	if err != nil {
		s.serverError(w, "check the upload key", err)
		return
	}
	if worker == "" || !hmac.Equal([]byte(q.Get("k")), []byte(want)) {
		writeError(w, http.StatusForbidden, "no upload key for worker %q", worker)
		return
	}
	if err := s.hub.gates.wait(r.Context(), worker); err != nil { // the attempt may be committing
		return
	}
	if r.Pattern == "PUT /checkpoints/{attempt}" {
		name = "" // the attempt's checkpoint (store.BeginOutputUpload)
	} else if msg := workflow.CheckOutputName(name); msg != "" {
		writeError(w, http.StatusBadRequest, "%s", msg)
		return
	}
	if !s.uploads.begin(worker) {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, "too many uploads in progress (%d of this worker, %d of all workers at most): try again", MaxWorkerUploads, MaxUploads)
		return
	}
	defer s.uploads.end(worker)
	began := time.Now()
	u, err := s.store.BeginOutputUpload(r.Context(), attempt, worker, name, r.ContentLength)
	if s.uploadRefused(w, err) {
		return
	}
	if _, err := u.ReadFrom(r.Context(), r.Body); err != nil {
		u.Abort(r.Context())
		if !s.uploadRefused(w, err) {
			writeError(w, http.StatusBadRequest, "output not stored: reading the upload: %v", err)
		}
		return
	}
	if r.ContentLength >= 0 && u.Size() != r.ContentLength {
		u.Abort(r.Context())
		writeError(w, http.StatusBadRequest, "output not stored: %d bytes arrived of %d", u.Size(), r.ContentLength)
		return
	}
	id, err := u.Commit(r.Context(), worker)
	if s.uploadRefused(w, err) {
		return
	}
	s.metrics.uploadedBytes.Add(float64(u.Size()))
	s.metrics.uploadSeconds.Add(time.Since(began).Seconds())
	writeJSON(w, http.StatusOK, map[string]any{"blob": id, "size": u.Size()})
}

// uploadRefused answers a refused output upload and reports whether err
// refused it.
func (s *Server) uploadRefused(w http.ResponseWriter, err error) bool {
	var le *store.OutputLimitError
	switch {
	case err == nil:
		return false
	case errors.As(err, &le):
		writeError(w, http.StatusRequestEntityTooLarge, "%v; nothing stored", le)
	case errors.Is(err, store.ErrNotHeld):
		writeError(w, http.StatusConflict, "%v", store.ErrNotHeld)
	case errors.Is(err, store.ErrReplicated):
		writeError(w, http.StatusConflict, "%v", store.ErrReplicated)
	default:
		s.serverError(w, "store output", err)
	}
	return true
}
