package headless

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/internal/archive"
	"github.com/cyclepool/cyclepool/internal/dirlock"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// DefaultDataCacheBytes bounds the data cache by default.
const DefaultDataCacheBytes = 20 << 30

// dataCache keeps the blobs tasks mount, downloaded once per worker: the
// file HEX (the blob sha256:HEX, checked against its hash before use) and,
// for archives, the tree HEX.d unpacked from it. A download that breaks
// off leaves HEX.part, which the next one resumes with a range request.
// Blobs in use by an attempt are never evicted; the others go, least
// recently used first, when the cache passes its bound, after the parts
// no download is writing (those of downloads that gave up or of an
// earlier run), which count against the bound too.
type dataCache struct {
	dir string
	max int64
	log *slog.Logger

	mu      sync.Mutex
	entries map[string]*dataEntry // by hex
	client  *http.Client
	release func() // gives the cache up (close)
	// unpackHook, when set (by tests), is called as an archive's tree
	// starts to be unpacked.
	unpackHook func(hexID string)
}

// close gives the cache up: the lock on a shared one, the whole of a
// private one.
func (c *dataCache) close() {
	if c.release != nil {
		c.release()
	}
}

// dataEntry is one blob of the cache.
type dataEntry struct {
	ready chan struct{} // closed once fetched (or failed: err)
	err   error
	size  int64 // the file and, once unpacked, its tree
	tree  bool  // the tree HEX.d is unpacked
	users int
	used  time.Time
	// unpacking is held while the tree is unpacked: by one attempt at a
	// time, the others that need it waiting, and no attempt of another
	// blob (c.mu is not held meanwhile).
	unpacking sync.Mutex
}

func newDataCache(dir string, max int64, log *slog.Logger) (*dataCache, error) {
	if dir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		dir = filepath.Join(base, "cyclepool", "data")
	}
	if max <= 0 {
		max = DefaultDataCacheBytes
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("headless: data cache %s: %w", dir, err)
	}
	c := &dataCache{max: max, log: log, entries: map[string]*dataEntry{}, client: &http.Client{}}
	// One worker process per cache: another worker on the machine (or a
	// test beside it) gets a private cache inside, removed when it closes,
	// rather than evicting and unpacking what the first one reads.
	if release, ok := dirlock.Take(dir); ok {
		c.release = release
	} else {
		private, err := os.MkdirTemp(dir, "worker-")
		if err != nil {
			return nil, fmt.Errorf("headless: data cache %s: %w", dir, err)
		}
		unlock, _ := dirlock.Take(private) // held while in use: see the sweep below
		c.release = func() {
			os.RemoveAll(private)
			if unlock != nil {
				unlock()
			}
		}
		dir = private
	}
	c.dir = dir
	// What an earlier run left: complete blobs (checked when they were
	// downloaded, and renamed into place whole) are kept, first in line
	// for eviction; unpacked trees are made again.
	names, _ := os.ReadDir(dir)
	for _, n := range names {
		name := n.Name()
		if isHexID("sha256:"+name) && n.Type().IsRegular() {
			if info, err := n.Info(); err == nil {
				ready := make(chan struct{})
				close(ready)
				c.entries[name] = &dataEntry{ready: ready, size: info.Size()}
				continue
			}
		}
		if h, rest, _ := strings.Cut(name, "."); isHexID("sha256:"+h) && (rest == "d" || rest == "d.tmp") {
			os.RemoveAll(filepath.Join(dir, name)) // only what this cache makes
		}
		if strings.HasPrefix(name, "worker-") && n.IsDir() {
			// A private cache: removed when its worker is gone (its
			// lock is free).
			if unlock, ok := dirlock.Take(filepath.Join(dir, name)); ok {
				os.RemoveAll(filepath.Join(dir, name))
				unlock()
			}
		}
	}
	return c, nil
}

// dataPath is where blob id is in a data cache at dir.
func dataPath(dir, id string) string {
	return filepath.Join(dir, strings.TrimPrefix(id, "sha256:"))
}

// prepare puts the blobs of a setup in the cache (an archive unpacked),
// and holds them there until release is called. A blob that cannot be
// fetched or does not match its hash ends the attempt with an Outcome.
func (c *dataCache) prepare(ctx context.Context, server string, su *protocol.Setup) (release func(), o *wasmworker.Outcome) {
	var held []*dataEntry
	release = func() {
		c.mu.Lock()
		for _, e := range held {
			e.users--
			e.used = time.Now()
		}
		c.mu.Unlock()
	}
	for _, f := range su.Files {
		if f.Blob == "" {
			continue
		}
		e, err := c.get(ctx, server, f)
		if e != nil {
			held = append(held, e)
		}
		if err != nil {
			release()
			if ctx.Err() != nil {
				return nil, &wasmworker.Outcome{Reason: protocol.ReasonCancelled, Message: "cancelled"}
			}
			return nil, &wasmworker.Outcome{Reason: protocol.ReasonWorker, Message: clip(fmt.Sprintf("fetching data for %s: %v", f.Path, err))}
		}
	}
	c.evict()
	return release, nil
}

// get returns the entry of f's blob, held (users counted), once it is in
// the cache, and unpacked when f is an archive.
func (c *dataCache) get(ctx context.Context, server string, f protocol.File) (*dataEntry, error) {
	if !isHexID(f.Blob) {
		return nil, fmt.Errorf("bad data id %q", f.Blob)
	}
	hexID := strings.TrimPrefix(f.Blob, "sha256:")
	c.mu.Lock()
	e := c.entries[hexID]
	if e != nil {
		e.users++
		c.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			return e, ctx.Err()
		}
		if e.err != nil { // written before ready was closed
			return e, e.err
		}
	} else {
		e = &dataEntry{ready: make(chan struct{}), users: 1}
		c.entries[hexID] = e
		c.mu.Unlock()
		size, err := c.fetch(ctx, server, f, hexID)
		c.mu.Lock()
		e.size, e.err = size, err
		if err != nil {
			delete(c.entries, hexID) // the next attempt tries again
		}
		c.mu.Unlock()
		close(e.ready)
		if err != nil {
			return e, err
		}
	}
	if f.Archive {
		return e, c.unpack(hexID, e)
	}
	return e, nil
}

func isHexID(id string) bool {
	h, ok := strings.CutPrefix(id, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

// fetch makes sure the file HEX holds the blob: kept from before and
// matching its hash, or downloaded (resuming HEX.part) and checked. A
// download whose hash does not match is thrown away and made once more
// from the start.
func (c *dataCache) fetch(ctx context.Context, server string, f protocol.File, hexID string) (int64, error) {
	p := filepath.Join(c.dir, hexID)
	if sum, size, err := hashFile(p); err == nil {
		if sum == hexID {
			return size, nil
		}
		os.Remove(p) // damaged since
	}
	var last error
	for try := 0; try < 3; try++ {
		err := c.download(ctx, server+f.URL, p+".part", f.Size)
		if err == nil {
			sum, size, herr := hashFile(p + ".part")
			switch {
			case herr != nil:
				err = herr
			case sum != hexID:
				os.Remove(p + ".part")
				err = fmt.Errorf("downloaded %d bytes whose sha256 is %s, not %s", size, sum, hexID)
			default:
				os.Chtimes(p+".part", inputTime, inputTime)
				if err := os.Rename(p+".part", p); err != nil {
					return 0, err
				}
				return size, nil
			}
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		last = err
		c.log.Warn("data download", "blob", hexID, "try", try+1, "err", err)
	}
	return 0, last
}

// download writes url into part, resuming from part's size with a range
// request, until it holds want bytes.
func (c *dataCache) download(ctx context.Context, url, part string, want int64) error {
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if have > want {
		if err := f.Truncate(0); err != nil {
			return err
		}
		have, _ = f.Seek(0, io.SeekStart)
	}
	if have == want {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if have > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", have))
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent && have > 0:
	case resp.StatusCode == http.StatusOK:
		if have > 0 { // the range was not honoured: from the start
			if err := f.Truncate(0); err != nil {
				return err
			}
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				return err
			}
			have = 0
		}
	default:
		return fmt.Errorf("GET %s: %s", strings.SplitN(url, "?", 2)[0], resp.Status)
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, want-have))
	if err != nil {
		return err
	}
	if have+n != want {
		return fmt.Errorf("download cut off at %d of %d bytes", have+n, want)
	}
	return f.Sync()
}

// hashFile returns the hex sha256 and the size of a file.
func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// unpack unpacks the archive HEX into the tree HEX.d, once. Only the
// attempts that need this tree wait for it: an archive that takes long to
// unpack (a large one, one owner's) holds no other attempt back.
func (c *dataCache) unpack(hexID string, e *dataEntry) error {
	e.unpacking.Lock()
	defer e.unpacking.Unlock()
	c.mu.Lock()
	done := e.tree
	c.mu.Unlock()
	if done {
		return nil
	}
	if c.unpackHook != nil {
		c.unpackHook(hexID)
	}
	dir := filepath.Join(c.dir, hexID+".d")
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(c.dir, hexID))
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := unpackTree(f, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("unpacking the archive: %w", err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return err
	}
	c.mu.Lock()
	e.tree, e.size = true, e.size+size
	c.mu.Unlock()
	return nil
}

// unpackTree unpacks a checked archive into dir and returns the bytes it
// wrote. Symbolic links to files of the archive become hard links, and
// every time is inputTime: the tree reads the same on every worker, and no
// host symbolic link can lead a task out of it (docs/DATA.md says what is
// not supported yet).
func unpackTree(r io.Reader, dir string) (int64, error) {
	var links []archive.Entry
	files := map[string]bool{}
	var size int64
	err := archive.Walk(r, func(e archive.Entry, body io.Reader) error {
		p := filepath.Join(dir, filepath.FromSlash(e.Name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch e.Type {
		case tar.TypeDir:
			if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case tar.TypeSymlink:
			links = append(links, e)
		default:
			out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return err
			}
			n, err := io.Copy(out, body)
			size += n
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			files[e.Name] = true
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	// Where each link leads, by name (an archive names each entry once):
	// following a link to a link is a lookup, not a walk of all the links,
	// which took minutes for an archive of 100,000 links in a chain, the
	// data cache locked meanwhile.
	leads := make(map[string]string, len(links))
	for _, l := range links {
		leads[l.Name] = path.Join(path.Dir(l.Name), l.Linkname)
	}
	for _, l := range links {
		target := leads[l.Name]
		for range 40 { // a link to a link: follow it, as the kernel would
			next, ok := leads[target]
			if !ok {
				break
			}
			target = next
		}
		if files[target] {
			if err := os.Link(filepath.Join(dir, filepath.FromSlash(target)), filepath.Join(dir, filepath.FromSlash(l.Name))); err != nil {
				return 0, err
			}
		}
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Chtimes(p, inputTime, inputTime)
	})
	return size, err
}

// idleParts returns the partial downloads (HEX.part) of blobs that have no
// entry, so that no fetch is writing them, oldest first. c.mu is held.
func (c *dataCache) idleParts() []fs.FileInfo {
	names, err := os.ReadDir(c.dir)
	if err != nil {
		return nil
	}
	var parts []fs.FileInfo
	for _, n := range names {
		h, ok := strings.CutSuffix(n.Name(), ".part")
		if !ok || !isHexID("sha256:"+h) || !n.Type().IsRegular() || c.entries[h] != nil {
			continue
		}
		if info, err := n.Info(); err == nil {
			parts = append(parts, info)
		}
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].ModTime().Before(parts[j].ModTime()) })
	return parts
}

// holding returns the ids of the blobs in the cache, at most
// protocol.MaxHelloData, most recently used first.
func (c *dataCache) holding() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	hexes := make([]string, 0, len(c.entries))
	for h := range c.entries {
		hexes = append(hexes, h)
	}
	sort.Slice(hexes, func(i, j int) bool { return c.entries[hexes[i]].used.After(c.entries[hexes[j]].used) })
	hexes = hexes[:min(len(hexes), protocol.MaxHelloData)]
	for i, h := range hexes {
		hexes[i] = "sha256:" + h
	}
	return hexes
}

// evict removes partial downloads no fetch is writing, oldest first, then
// blobs no attempt holds, least recently used first, until the cache is
// within its bound.
func (c *dataCache) evict() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var total int64
	var idle []string
	for h, e := range c.entries {
		total += e.size
		if e.users == 0 {
			idle = append(idle, h)
		}
	}
	parts := c.idleParts()
	for _, p := range parts {
		total += p.Size()
	}
	for _, p := range parts {
		if total <= c.max {
			return
		}
		if err := os.Remove(filepath.Join(c.dir, p.Name())); err == nil {
			total -= p.Size()
		}
	}
	sort.Slice(idle, func(i, j int) bool { return c.entries[idle[i]].used.Before(c.entries[idle[j]].used) })
	for _, h := range idle {
		if total <= c.max {
			return
		}
		total -= c.entries[h].size
		delete(c.entries, h)
		os.RemoveAll(filepath.Join(c.dir, h+".d"))
		os.Remove(filepath.Join(c.dir, h))
	}
}
