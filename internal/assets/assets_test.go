package assets

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
)

func TestServe(t *testing.T) {
	big := strings.Repeat("let x = 1;\n", 500)
	set, err := Load(fstest.MapFS{
		"page.js":     {Data: []byte(big)},
		"page.css":    {Data: []byte("body{}")},
		"w.wasm":      {Data: []byte("\x00asm\x01\x00\x00\x00")},
		"sub/skip.js": {Data: []byte("x")},
	}, "/static/")
	if err != nil {
		t.Fatal(err)
	}
	hashedJS := strings.TrimPrefix(set.URL("page.js"), "/static/")
	if !strings.HasPrefix(hashedJS, "page.") || !strings.HasSuffix(hashedJS, ".js") || hashedJS == "page.js" {
		t.Fatalf("URL(page.js) = %q, want a content-hashed name under /static/", set.URL("page.js"))
	}
	if set.URL("missing.js") != "" || set.URL("skip.js") != "" {
		t.Fatal("URL of a file that is not in the set is not empty")
	}
	for _, tc := range []struct {
		name, file, encoding string
		status               int
		cache, ctype, ce     string
		body                 string
	}{
		{"hashed is immutable", hashedJS, "", 200, "public, max-age=31536000, immutable", "text/javascript; charset=utf-8", "", big},
		{"plain revalidates", "page.css", "", 200, "no-cache", "text/css; charset=utf-8", "", "body{}"},
		{"wasm type", strings.TrimPrefix(set.URL("w.wasm"), "/static/"), "", 200, "public, max-age=31536000, immutable", "application/wasm", "", "\x00asm\x01\x00\x00\x00"},
		{"gzip when accepted", hashedJS, "gzip, br", 200, "public, max-age=31536000, immutable", "text/javascript; charset=utf-8", "gzip", big},
		{"small is never gzipped", "page.css", "gzip", 200, "no-cache", "text/css; charset=utf-8", "", "body{}"},
		{"unknown is 404", "nope.js", "", 404, "", "", "", ""},
		{"a wrong hash is 404", "page.00000000.js", "", 404, "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/static/"+tc.file, nil)
			if tc.encoding != "" {
				r.Header.Set("Accept-Encoding", tc.encoding)
			}
			w := httptest.NewRecorder()
			set.Serve(w, r, tc.file)
			if w.Code != tc.status {
				t.Fatalf("status %d, want %d", w.Code, tc.status)
			}
			if tc.status != http.StatusOK {
				return
			}
			h := w.Header()
			if h.Get("Cache-Control") != tc.cache || h.Get("Content-Type") != tc.ctype || h.Get("Content-Encoding") != tc.ce {
				t.Fatalf("headers %v", h)
			}
			body := w.Body.Bytes()
			if tc.ce == "gzip" {
				zr, err := gzip.NewReader(bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				if body, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			if string(body) != tc.body {
				t.Fatalf("body %q, want %q", body, tc.body)
			}
		})
	}
}
