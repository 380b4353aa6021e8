package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/wasmcheck"
)

// moduleWriteTimeout bounds the writing of one module's body to a client:
// 64 MiB at 1 Mbit/s takes nine minutes. A client cut off can resume
// with a Range request.
const moduleWriteTimeout = 10 * time.Minute

// moduleStall is how long a module's reader may take for each chunk of it
// (Server.moduleStall): a volunteer's phone on a slow link takes a MiB in
// seconds.
const moduleStall = time.Minute

// handleModule serves module bytes to workers, from the module's file in
// the spool (moduleSpool): ranges, conditional requests on the ETag (the
// id) and HEAD as http.ServeContent answers them. Modules are immutable,
// so they are cached forever; one that was deleted answers 404 from then
// on (moduleSpool.acquire).
func (s *Server) handleModule(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	f, release, err := s.modules.acquire(r.Context(), id,
		func(ctx context.Context) (int64, error) { return s.store.ModuleSize(ctx, id) },
		func(ctx context.Context) ([]byte, error) { return s.store.ModuleBody(ctx, id) })
	if errors.Is(err, store.ErrNotFound) {
		http.Error(w, "no module "+id, http.StatusNotFound)
		return
	}
	if err != nil {
		if r.Context().Err() == nil {
			s.log.Error("read module", "id", id, "err", err)
			http.Error(w, "server error", http.StatusInternalServerError)
		}
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/wasm")
	w.Header().Set("Cache-Control", blobCache) // a module's id is its bytes' hash, as a blob's
	w.Header().Set("ETag", `"`+id+`"`)
	// A reader that stops reading is cut off after s.moduleStall, not at
	// the end of the whole write's time: it holds a connection and an
	// open file meanwhile.
	sw := &stallWriter{ResponseWriter: w, rc: http.NewResponseController(w), stall: s.moduleStall,
		end: time.Now().Add(moduleWriteTimeout)}
	http.ServeContent(sw, r, "", time.Time{}, f)
}

// stallWriter writes a response in chunks of moduleWriteChunk, each
// under a write deadline of stall from its start (and none past end): a
// reader must take a chunk within stall. It passes a file on to the
// connection's ReadFrom (sendfile) a chunk at a time.
type stallWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	end   time.Time
}

// Unwrap returns the ResponseWriter wrapped, for http.ResponseController.
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// deadline gives the next chunk its time.
func (w *stallWriter) deadline() {
	d := time.Now().Add(w.stall)
	if d.After(w.end) {
		d = w.end
	}
	_ = w.rc.SetWriteDeadline(d)
}

// Write writes p a chunk at a time.
func (w *stallWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), moduleWriteChunk)
		w.deadline()
		k, err := w.ResponseWriter.Write(p[:c])
		n += k
		if err != nil {
			return n, err
		}
		p = p[c:]
	}
	return n, nil
}

// ReadFrom copies src a chunk at a time. http.ServeContent copies an
// io.LimitedReader of the file: its limit is taken here, so that every
// chunk is a LimitedReader of the file itself, which the connection sends
// with sendfile.
func (w *stallWriter) ReadFrom(src io.Reader) (int64, error) {
	rf, ok := w.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{w}, src)
	}
	limit := int64(-1) // none
	if lr, ok := src.(*io.LimitedReader); ok {
		src, limit = lr.R, lr.N
	}
	var total int64
	for limit != 0 {
		c := int64(moduleWriteChunk)
		if limit > 0 {
			c = min(c, limit)
		}
		w.deadline()
		n, err := rf.ReadFrom(&io.LimitedReader{R: src, N: c})
		total += n
		if limit > 0 {
			limit -= n
		}
		if err != nil {
			return total, err
		}
		if n < c {
			break // src ended
		}
	}
	return total, nil
}

// moduleWriteChunk is how much of a module's body is written under one
// write deadline (Server.moduleStall): a reader must take a chunk within
// it.
const moduleWriteChunk = 1 << 20

// errUploadsBusy says a module upload waited its whole time for a turn
// (Server.moduleUploads).
var errUploadsBusy = errors.New("too many modules are being uploaded at once; try again shortly")

// handlePushModule validates and stores an uploaded module.
func (s *Server) handlePushModule(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	if name := r.URL.Query().Get("name"); !store.ValidText(name) {
		writeError(w, http.StatusBadRequest, "module name %q is not UTF-8 text without NUL", name)
		return
	}
	wctx, cancel := context.WithTimeout(r.Context(), moduleCheckTimeout)
	release, err := s.moduleUploads.acquire(wctx, owner.ID, 1)
	cancel()
	if err != nil {
		err = errUploadsBusy
		if r.Context().Err() == nil {
			w.Header().Set("Retry-After", "10")
			writeError(w, http.StatusServiceUnavailable, "module not read: %v", err)
		}
		return
	}
	defer release()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxModuleBytes)+1))
	if err != nil || len(body) > s.cfg.MaxModuleBytes {
		writeError(w, http.StatusRequestEntityTooLarge, "module is larger than the %s limit", byteSize(int64(s.cfg.MaxModuleBytes)))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), moduleCheckTimeout)
	defer cancel()
	imports, err := wasmcheck.Check(ctx, body)
	if errors.Is(err, wasmcheck.ErrBusy) && r.Context().Err() == nil {
		// Checks compile one or two at a time (they take memory): this one
		// waited its whole time for a turn.
		w.Header().Set("Retry-After", "10")
		writeError(w, http.StatusServiceUnavailable, "module not checked: %v", err)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "module refused: %v", err)
		return
	}
	sum := sha256.Sum256(body)
	id := "sha256:" + hex.EncodeToString(sum[:])
	m, created, err := s.store.PutModule(r.Context(), owner.ID, s.cfg.DataQuota, id, body, imports)
	var qe *store.QuotaError
	if errors.As(err, &qe) {
		writeError(w, http.StatusRequestEntityTooLarge, "%v; nothing stored", qe)
		return
	}
	if err != nil {
		s.serverError(w, "store module", err)
		return
	}
	if name := r.URL.Query().Get("name"); name != "" && len(name) <= MaxBlobNameBytes && name != m.Name {
		if err := s.store.NameModule(r.Context(), owner.ID, id, name); err != nil {
			s.serverError(w, "store module", err)
			return
		}
		m.Name = name
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, apiModule(m))
}

// handleRemoveModule takes a module off the owner's list and quota
// (store.RemoveModule). Another owner's module answers exactly as an
// unknown one. This replica forgets that the owner has the module, so
// that a workflow naming it is refused here at once; other replicas look
// again within knownModuleFor (Server.missingModules). The body is no
// longer served once the module is deleted (handleModule).
func (s *Server) handleRemoveModule(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	id := r.PathValue("id")
	err := s.store.RemoveModule(r.Context(), owner.ID, id)
	s.knownModules.Delete(ownedModule{owner.ID, id})
	if err != nil {
		s.notFoundOr(w, "module "+id, err)
		return
	}
	s.log.Info("module removed", "module", id, "owner", owner.Name)
	w.WriteHeader(http.StatusNoContent)
}

// byteSize writes a size limit as people read it: in MiB when it is a whole
// number of them, in bytes otherwise.
func byteSize(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
