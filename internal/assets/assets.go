// Package assets serves a set of embedded static files under
// content-hashed names (page.3fa2c1d0.js) with a one-year immutable cache
// lifetime, so that a new build never meets a stale copy. The plain name
// also works, with revalidation, for scripts that cannot know the hash.
// Large compressible files are sent gzipped when the client accepts it.
//
// The volunteer page (package web) and the owners' dashboard (web/app)
// each serve their files through a Set.
package assets

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

// file is one embedded file.
type file struct {
	name   string // plain name, e.g. page.js
	hashed string // name with the content hash, e.g. page.3fa2c1d0.js
	body   []byte
	ctype  string

	gzOnce sync.Once
	gz     []byte // body gzipped, made on first request; nil when not worth it
}

// gzipped returns the body compressed, once (the browser worker's
// worker.wasm shrinks from about 4 MB to 1.2 MB: it matters on a phone).
func (f *file) gzipped() []byte {
	f.gzOnce.Do(func() {
		var b bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&b, gzip.DefaultCompression)
		_, _ = zw.Write(f.body)
		_ = zw.Close()
		if b.Len() < len(f.body)*9/10 {
			f.gz = b.Bytes()
		}
	})
	return f.gz
}

// Set is the files of one directory, by plain and by hashed name.
type Set struct {
	prefix   string
	byName   map[string]*file
	byHashed map[string]*file
}

// Load reads every regular file at the top of fsys. prefix is the URL path
// the files are served under (for example "/static/"); URL prepends it.
func Load(fsys fs.FS, prefix string) (*Set, error) {
	s := &Set{prefix: prefix, byName: map[string]*file{}, byHashed: map[string]*file{}}
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read assets: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read asset %s: %w", e.Name(), err)
		}
		sum := sha256.Sum256(body)
		ext := path.Ext(e.Name())
		f := &file{name: e.Name(), body: body,
			hashed: strings.TrimSuffix(e.Name(), ext) + "." + hex.EncodeToString(sum[:4]) + ext,
			ctype:  mime.TypeByExtension(ext)}
		switch ext {
		case ".wasm":
			f.ctype = "application/wasm"
		case ".js":
			f.ctype = "text/javascript; charset=utf-8"
		}
		if f.ctype == "" {
			f.ctype = "application/octet-stream"
		}
		s.byName[f.name], s.byHashed[f.hashed] = f, f
	}
	return s, nil
}

// URL returns the path of a file under its hashed name, or "" when the set
// has no file of that name.
func (s *Set) URL(name string) string {
	if f := s.byName[name]; f != nil {
		return s.prefix + f.hashed
	}
	return ""
}

// Serve writes the file called name (hashed or plain) or a 404.
func (s *Set) Serve(w http.ResponseWriter, r *http.Request, name string) {
	f, immutable := s.byHashed[name], true
	if f == nil {
		f, immutable = s.byName[name], false
	}
	if f == nil {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", f.ctype)
	if immutable {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	h.Set("Vary", "Accept-Encoding")
	body, etag := f.body, `"`+f.hashed+`"`
	if len(body) > 1024 && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		if gz := f.gzipped(); gz != nil {
			body, etag = gz, `"`+f.hashed+`.gz"`
			h.Set("Content-Encoding", "gzip")
		}
	}
	h.Set("ETag", etag)
	http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(body))
}
