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
	"sync"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/wasmcheck"
)

// moduleCache keeps recently served module bytes in memory, up to max bytes.
type moduleCache struct {
	mu    sync.Mutex
	max   int
	size  int
	order *list.List // of string ids, most recent first
	items map[string]*list.Element
	data  map[string][]byte
}

func newModuleCache(max int) *moduleCache {
	return &moduleCache{max: max, order: list.New(), items: map[string]*list.Element{}, data: map[string][]byte{}}
}

func (c *moduleCache) get(id string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[id]
	if !ok {
		return nil, false
	}
	c.order.MoveToFront(e)
	return c.data[id], true
}

func (c *moduleCache) put(id string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[id]; ok || len(b) > c.max {
		return
	}
	c.items[id] = c.order.PushFront(id)
	c.data[id] = b
	c.size += len(b)
	for c.size > c.max {
		e := c.order.Back()
		old := e.Value.(string)
		c.order.Remove(e)
		c.size -= len(c.data[old])
		delete(c.items, old)
		delete(c.data, old)
	}
}

// handleModule serves module bytes to workers. Modules are immutable, so
// they are cached forever.
func (s *Server) handleModule(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	body, ok := s.modules.get(id)
	if !ok {
		var err error
		body, err = s.store.ModuleBody(r.Context(), id)
		if errors.Is(err, store.ErrNotFound) {
			http.Error(w, "no module "+id, http.StatusNotFound)
			return
		}
		if err != nil {
			s.log.Error("read module", "id", id, "err", err)
			http.Error(w, "server error", http.StatusInternalServerError)
			return
		}
		s.modules.put(id, body)
	}
	w.Header().Set("Content-Type", "application/wasm")
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	w.Header().Set("ETag", `"`+id+`"`)
	_, _ = w.Write(body)
}

// handlePushModule validates and stores an uploaded module.
func (s *Server) handlePushModule(w http.ResponseWriter, r *http.Request, owner store.Owner) {
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
	m, created, err := s.store.PutModule(r.Context(), owner.ID, id, body, imports)
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

// byteSize writes a size limit as people read it: in MiB when it is a whole
// number of them, in bytes otherwise.
func byteSize(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
