package server

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/wasmcheck"
)

// moduleBodies holds the module bodies the server has in memory: those
// being read or served, and the recently served ones, max bytes in all (a
// body larger than max is held alone). A body is read from the database
// once however many requests want it at once, and stays held while any of
// them is still writing it; a request that needs room waits until
// enough is freed. Module ids are known to every volunteer and GET
// /modules/{id} needs no token, so without this, clients asking at once or
// reading slowly held a copy of a body each (TestModuleMemoryIsBounded).
type moduleBodies struct {
	mu      sync.Mutex
	max     int64
	size    int64      // bytes of every body held: read, being read or served
	lru     *list.List // of *moduleBody served by nobody, most recent first
	entries map[string]*moduleBody
	room    chan struct{} // closed (and replaced) when bodies are freed
	loads   int           // reads from the database, for tests
}

// moduleBody is one module's body in moduleBodies.
type moduleBody struct {
	id    string
	size  int64
	body  []byte
	err   error
	ready chan struct{} // closed once the body was read (or failed)
	refs  int           // requests holding it
	elem  *list.Element // in lru while refs is 0
}

func newModuleBodies(max int64) *moduleBodies {
	return &moduleBodies{max: max, lru: list.New(), entries: map[string]*moduleBody{}, room: make(chan struct{})}
}

// moduleLoadTimeout bounds the read of one module's body, which the
// requests that want it share (none of them may cancel it for the others).
const moduleLoadTimeout = time.Minute

// acquire returns the body of module id and a function to call once done
// with it. A body not held is read with load, after size (its length) has
// been found to fit. A body kept from earlier requests (in lru) is served
// only after size has found the module still there: a module can be
// deleted (store.RemoveModule), and a replica that kept its body would
// otherwise serve it for as long as nothing needed the room. A body that
// requests in flight hold is shared without asking again.
func (m *moduleBodies) acquire(ctx context.Context, id string, size func(context.Context) (int64, error),
	load func(context.Context) ([]byte, error)) ([]byte, func(), error) {
	m.mu.Lock()
	if e := m.entries[id]; e != nil && e.refs > 0 {
		return m.wait(ctx, e)
	}
	m.mu.Unlock()
	n, err := size(ctx)
	if errors.Is(err, store.ErrNotFound) {
		m.forget(id)
	}
	if err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	for {
		if e := m.entries[id]; e != nil {
			return m.wait(ctx, e)
		}
		m.evict(n)
		if m.size+n <= m.max || m.size == 0 {
			break
		}
		room := m.room
		m.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		m.mu.Lock()
	}
	e := &moduleBody{id: id, size: n, ready: make(chan struct{}), refs: 1}
	m.entries[id] = e
	m.size += n
	m.loads++
	m.mu.Unlock()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moduleLoadTimeout)
	body, err := load(lctx)
	cancel()
	m.mu.Lock()
	e.body, e.err = body, err
	if err == nil {
		m.size += int64(len(body)) - e.size
		e.size = int64(len(body))
	} else {
		// Not held: the next request reads it again.
		delete(m.entries, id)
		m.size -= e.size
		e.size = 0
	}
	close(e.ready)
	m.mu.Unlock()
	if err != nil {
		m.release(e)
		return nil, nil, err
	}
	return body, func() { m.release(e) }, nil
}

// wait holds e for the caller and waits until it was read; m.mu is held,
// and released.
func (m *moduleBodies) wait(ctx context.Context, e *moduleBody) ([]byte, func(), error) {
	e.refs++
	if e.elem != nil {
		m.lru.Remove(e.elem)
		e.elem = nil
	}
	m.mu.Unlock()
	select {
	case <-e.ready:
	case <-ctx.Done():
		m.release(e)
		return nil, nil, ctx.Err()
	}
	if e.err != nil {
		m.release(e)
		return nil, nil, e.err
	}
	return e.body, func() { m.release(e) }, nil
}

// release gives back a hold of e: a body nobody holds stays, as the most
// recently used, while there is room.
func (m *moduleBodies) release(e *moduleBody) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.refs--
	if e.refs == 0 && m.entries[e.id] == e {
		e.elem = m.lru.PushFront(e)
		m.evict(0)
	}
	close(m.room)
	m.room = make(chan struct{})
}

// forget drops the body of module id unless requests hold it (they are
// served, and the next request asks again).
func (m *moduleBodies) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.entries[id]; e != nil && e.elem != nil {
		m.lru.Remove(e.elem)
		e.elem = nil
		delete(m.entries, id)
		m.size -= e.size
	}
}

// evict drops the least recently used bodies that nobody holds until n
// more bytes fit, or none is left; m.mu is held.
func (m *moduleBodies) evict(n int64) {
	for m.size+n > m.max && m.lru.Len() > 0 {
		e := m.lru.Remove(m.lru.Back()).(*moduleBody)
		e.elem = nil
		delete(m.entries, e.id)
		m.size -= e.size
	}
}

// moduleWriteTimeout bounds the writing of one module's body to a client,
// which holds the body in memory meanwhile: 64 MiB at 1 Mbit/s takes nine
// minutes.
const moduleWriteTimeout = 10 * time.Minute

// moduleStall is how long a module's reader may take for each chunk of it
// (Server.moduleStall): a volunteer's phone on a slow link takes a MiB in
// seconds.
const moduleStall = time.Minute

// handleModule serves module bytes to workers. Modules are immutable, so
// they are cached forever; one that was deleted answers 404 from then on
// (moduleBodies.acquire).
func (s *Server) handleModule(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, release, err := s.modules.acquire(r.Context(), id,
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
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	w.Header().Set("ETag", `"`+id+`"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	// A reader that stops reading lets the body go after s.moduleStall,
	// not at the end of the whole write's time: the body is held while
	// it is written, and memory for module bodies is shared by all.
	rc := http.NewResponseController(w)
	end := time.Now().Add(moduleWriteTimeout)
	for off := 0; off < len(body); {
		n := min(moduleWriteChunk, len(body)-off)
		deadline := time.Now().Add(s.moduleStall)
		if deadline.After(end) {
			deadline = end
		}
		_ = rc.SetWriteDeadline(deadline)
		if _, err := w.Write(body[off : off+n]); err != nil {
			return
		}
		off += n
	}
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
