package app

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var staticFS embed.FS

type asset struct {
	name, hashed, ctype string
	body                []byte
}

// assets are the dashboard's script and style, served under content-hashed
// names (app.1a2b3c4d.js) with an immutable cache lifetime, as the
// volunteer page's are.
type assets struct {
	byName, byHashed map[string]*asset
}

func loadAssets() *assets {
	a := &assets{byName: map[string]*asset{}, byHashed: map[string]*asset{}}
	entries, err := fs.ReadDir(staticFS, "static")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		body, err := staticFS.ReadFile("static/" + e.Name())
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(body)
		ext := path.Ext(e.Name())
		f := &asset{name: e.Name(), body: body, ctype: mime.TypeByExtension(ext),
			hashed: strings.TrimSuffix(e.Name(), ext) + "." + hex.EncodeToString(sum[:4]) + ext}
		if ext == ".js" {
			f.ctype = "text/javascript; charset=utf-8"
		}
		a.byName[f.name], a.byHashed[f.hashed] = f, f
	}
	return a
}

func (a *assets) url(name string) string {
	if f := a.byName[name]; f != nil {
		return "/app/static/" + f.hashed
	}
	return ""
}

func (a *assets) serve(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	f, immutable := a.byHashed[name], true
	if f == nil {
		f, immutable = a.byName[name], false
	}
	if f == nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", f.ctype)
	if immutable {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	w.Header().Set("ETag", `"`+f.hashed+`"`)
	http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.body))
}
