package server

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/dirlock"
	"github.com/cyclepool/cyclepool/internal/store"
)

// moduleSpool keeps module bodies in files in a directory, and serves
// each request an open file: a client that reads slowly then holds a file
// descriptor (and the kernel's page cache), not a copy of a body in the
// Go heap. Module ids are known to every volunteer and GET /modules/{id}
// needs no token, so bodies held in memory while they were written let
// two anonymous slow readers hold the memory every download shared, and
// every other download wait (TestTricklingModuleReadersHoldNoMemory).
//
// A body is read from the database once however many requests want it at
// once, and written to its file (a temporary file renamed, so that no
// reader sees part of one). The bodies read from the database at once
// take at most loadMax bytes (one larger body alone): that, not the number
// of readers, bounds the memory module bodies take. The files take at most
// max bytes of disk, the least recently used going first, except those
// that requests are serving: one file per module however many read it,
// never removed while open (so that Windows, which cannot remove an open
// file, behaves as Unix does), and a new module is spooled even when the
// files in use fill the bound, rather than wait for a reader to end.
type moduleSpool struct {
	dir     string // "" until first used when temp
	temp    bool   // dir is made under os.TempDir() and removed by close
	log     *slog.Logger
	unlock  func() // gives back a given dir (dirlock), nil when not held
	max     int64
	loadMax int64

	mu      sync.Mutex
	size    int64      // bytes of every file spooled or being loaded
	loading int64      // bytes being read from the database
	lru     *list.List // of *spooled served by nobody, most recent first
	files   map[string]*spooled
	room    chan struct{} // closed (and replaced) when a load ends
	loads   int           // reads from the database, for tests
	seq     uint64        // numbers the files, so that a module's next one has another name
	ready   bool          // dir exists and was cleared of earlier files
	closed  bool
}

// spooled is one module's file in moduleSpool.
type spooled struct {
	id    string
	path  string
	size  int64
	err   error
	ready chan struct{} // closed once the body was spooled (or failed)
	done  bool          // ready is closed
	refs  int           // requests holding it
	elem  *list.Element // in lru while refs is 0
	gone  bool          // no longer in files: removed once refs is 0
}

// spoolFileSuffix ends the name of every file the spool keeps: a
// directory given in Config.ModuleSpoolDir is cleared of such files (and
// of spoolTempPrefix ones) when first used, never of others.
const (
	spoolFileSuffix = ".wasm"
	spoolTempPrefix = ".load-"
)

func newModuleSpool(dir string, max, loadMax int64) *moduleSpool {
	return &moduleSpool{dir: dir, temp: dir == "", max: max, loadMax: loadMax, lru: list.New(),
		files: map[string]*spooled{}, room: make(chan struct{})}
}

// moduleLoadTimeout bounds the read of one module's body and the writing
// of its file, which the requests that want it share (none of them may
// cancel it for the others).
const moduleLoadTimeout = time.Minute

// errSpoolClosed answers the requests that arrive once the server closed.
var errSpoolClosed = errors.New("the server is closed")

// prepare makes the spool's directory, or clears a given one of the files
// a previous process left (m.mu is held): the spool knows only the files
// it wrote, and found its modules still there for. A given directory that
// another process holds (two replicas given one --data-dir) is left to it,
// and the spool makes one of its own: each would clear and evict the
// other's files.
func (m *moduleSpool) prepare() error {
	if m.closed {
		return errSpoolClosed
	}
	if m.ready {
		return nil
	}
	if !m.temp {
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return fmt.Errorf("make the module spool: %w", err)
		}
		if unlock, ok := dirlock.Take(m.dir); ok {
			m.unlock = unlock
		} else {
			if m.log != nil {
				m.log.Warn("the module spool's directory is another process's: using one of this process's own",
					"dir", m.dir)
			}
			m.temp = true
		}
	}
	if m.temp {
		dir, err := os.MkdirTemp("", "cyclepool-modules-")
		if err != nil {
			return fmt.Errorf("make the module spool: %w", err)
		}
		m.dir = dir
	} else {
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			return fmt.Errorf("make the module spool: %w", err)
		}
		entries, err := os.ReadDir(m.dir)
		if err != nil {
			return fmt.Errorf("read the module spool: %w", err)
		}
		for _, e := range entries {
			if n := e.Name(); e.Type().IsRegular() && (strings.HasSuffix(n, spoolFileSuffix) || strings.HasPrefix(n, spoolTempPrefix)) {
				if err := os.Remove(filepath.Join(m.dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("clear the module spool: %w", err)
				}
			}
		}
	}
	m.ready = true
	return nil
}

// acquire returns an open file of module id's body and a function to call once done with it (which closes the file). A body not
// spooled is read with load, after size (its length) has been found to
// fit among the loads in progress, and written to its file. A file
// spooled already is served only after size has found the module still
// there: a module can be deleted (store.RemoveModule), and a replica that
// kept its file would otherwise serve it for as long as nothing needed the
// room, or (were its readers trusted) for as long as slow readers
// overlapped. A body being read is shared without asking again: the
// requests that arrive meanwhile are served with the first.
func (m *moduleSpool) acquire(ctx context.Context, id string, size func(context.Context) (int64, error),
	load func(context.Context) ([]byte, error)) (*os.File, func(), error) {
	m.mu.Lock()
	if e := m.files[id]; e != nil && !e.done {
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
	if err := m.prepare(); err != nil {
		m.mu.Unlock()
		return nil, nil, err
	}
	for {
		if e := m.files[id]; e != nil {
			return m.wait(ctx, e)
		}
		if m.loading+n <= m.loadMax || m.loading == 0 {
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
	// A file of its own, even for a module whose earlier file (forgotten,
	// still being read) is there yet.
	m.seq++
	sum := sha256.Sum256([]byte(id))
	name := fmt.Sprintf("%s-%d%s", hex.EncodeToString(sum[:16]), m.seq, spoolFileSuffix)
	e := &spooled{id: id, path: filepath.Join(m.dir, name), size: n, ready: make(chan struct{}), refs: 1}
	m.files[id] = e
	m.loading += n
	m.evict(n)
	m.size += n
	m.loads++
	m.mu.Unlock()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), moduleLoadTimeout)
	written, err := m.spool(lctx, e.path, load)
	cancel()
	m.mu.Lock()
	m.loading -= n
	close(m.room)
	m.room = make(chan struct{})
	e.err = err
	if err == nil {
		m.size += written - e.size
		e.size = written
	} else {
		// Not kept: the next request reads it again.
		if m.files[id] == e {
			delete(m.files, id)
		}
		m.size -= e.size
		e.size = 0
	}
	close(e.ready)
	e.done = true
	m.mu.Unlock()
	if err != nil {
		m.release(e)
		return nil, nil, err
	}
	return m.open(e)
}

// spool reads a body with load and writes it to path, through a
// temporary file renamed once complete; it returns the body's length.
func (m *moduleSpool) spool(ctx context.Context, path string, load func(context.Context) ([]byte, error)) (int64, error) {
	body, err := load(ctx)
	if err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(filepath.Dir(path), spoolTempPrefix+"*")
	if err != nil {
		return 0, fmt.Errorf("spool a module: %w", err)
	}
	_, err = f.Write(body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return 0, fmt.Errorf("spool a module: %w", err)
	}
	return int64(len(body)), nil
}

// wait holds e for the caller and waits until it was spooled; m.mu is
// held, and released.
func (m *moduleSpool) wait(ctx context.Context, e *spooled) (*os.File, func(), error) {
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
	return m.open(e)
}

// open opens e's file for a caller that holds e. A file that cannot be
// opened (something else removed it) is forgotten: the next request
// spools it again.
func (m *moduleSpool) open(e *spooled) (*os.File, func(), error) {
	f, err := os.Open(e.path)
	if err != nil {
		m.mu.Lock()
		if m.files[e.id] == e {
			delete(m.files, e.id)
			e.gone = true
		}
		m.mu.Unlock()
		m.release(e)
		return nil, nil, fmt.Errorf("open a spooled module: %w", err)
	}
	var once sync.Once
	return f, func() {
		once.Do(func() {
			f.Close()
			m.release(e)
		})
	}, nil
}

// release gives back a hold of e: a file nobody holds stays, as the most
// recently used, while there is room; one that was forgotten meanwhile is
// removed.
func (m *moduleSpool) release(e *spooled) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.refs--
	if e.refs > 0 {
		return
	}
	if e.gone {
		m.remove(e)
		return
	}
	if m.files[e.id] == e {
		e.elem = m.lru.PushFront(e)
		m.evict(0)
	}
}

// forget drops the file of module id: at once when no request holds it,
// else once the last is served (the next request asks again).
func (m *moduleSpool) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.files[id]
	if e == nil {
		return
	}
	delete(m.files, id)
	if e.elem != nil {
		m.lru.Remove(e.elem)
		e.elem = nil
		m.remove(e)
		return
	}
	e.gone = true
}

// evict removes the least recently used files that nobody holds until n
// more bytes fit, or none is left; m.mu is held.
func (m *moduleSpool) evict(n int64) {
	for m.size+n > m.max && m.lru.Len() > 0 {
		e := m.lru.Remove(m.lru.Back()).(*spooled)
		e.elem = nil
		delete(m.files, e.id)
		m.remove(e)
	}
}

// remove deletes e's file, which nobody holds; m.mu is held.
func (m *moduleSpool) remove(e *spooled) {
	m.size -= e.size
	e.size = 0
	if e.err == nil {
		_ = os.Remove(e.path)
	}
}

// close removes the spool's files, and its directory when the spool made
// it; requests that arrive later are refused. Call it once nothing is
// served any more.
func (m *moduleSpool) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if !m.ready {
		return nil
	}
	m.ready = false
	if m.unlock != nil {
		defer m.unlock()
	}
	if m.temp {
		if err := os.RemoveAll(m.dir); err != nil {
			return fmt.Errorf("remove the module spool: %w", err)
		}
		return nil
	}
	var errs []error
	for id, e := range m.files {
		delete(m.files, id)
		if e.refs == 0 && e.err == nil {
			if err := os.Remove(e.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	m.lru.Init()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clear the module spool: %w", err)
	}
	return nil
}
