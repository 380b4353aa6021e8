package web

import (
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, path string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest("GET", path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

// The page names its assets by content hash; those are cached forever, the
// page itself is revalidated, and everything is cross-origin isolated.
func TestPageAndHashedAssets(t *testing.T) {
	h := Handler("")
	resp := get(t, h, "/")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "How much to give") {
		t.Fatalf("page: %s\n%s", resp.Status, body)
	}
	if resp.Header.Get("Cross-Origin-Embedder-Policy") != "require-corp" || resp.Header.Get("Cross-Origin-Opener-Policy") != "same-origin" {
		t.Errorf("page is not cross-origin isolated: %v", resp.Header)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
		t.Errorf("page Cache-Control %q", cc)
	}
	re := regexp.MustCompile(`/static/page\.[0-9a-f]{8}\.js`)
	js := re.FindString(string(body))
	if js == "" {
		t.Fatalf("the page names no hashed page.js:\n%s", body)
	}
	resp = get(t, h, js)
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Cache-Control"), "immutable") {
		t.Fatalf("%s: %s, Cache-Control %q", js, resp.Status, resp.Header.Get("Cache-Control"))
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/javascript") {
		t.Errorf("Content-Type %q", ct)
	}
	resp = get(t, h, "/static/page.js")
	if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "no-cache" {
		t.Errorf("unhashed name: %s, Cache-Control %q", resp.Status, resp.Header.Get("Cache-Control"))
	}
	if resp := get(t, h, "/static/page.00000000.js"); resp.StatusCode != 404 {
		t.Errorf("a wrong hash: %s", resp.Status)
	}
}

func TestAssetsGzipped(t *testing.T) {
	h := Handler("")
	resp := get(t, h, "/static/task.js", "Accept-Encoding", "gzip")
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("not gzipped: %v", resp.Header)
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(zr)
	if !strings.Contains(string(b), "wasi_snapshot_preview1") {
		t.Fatalf("gzipped body is not task.js")
	}
}

// No other site may frame the volunteer page (and start it) unless the
// operator names it; the names cannot end the header's directive.
func TestFrameAncestors(t *testing.T) {
	for _, tc := range []struct {
		configured, csp, xfo string
	}{
		{"", "frame-ancestors 'self'", "SAMEORIGIN"},
		{"'self'", "frame-ancestors 'self'", "SAMEORIGIN"},
		{"'none'", "frame-ancestors 'none'", "DENY"},
		{"'self' https://project.example", "frame-ancestors 'self' https://project.example", ""},
	} {
		resp := get(t, Handler(tc.configured), "/")
		if got := resp.Header.Get("Content-Security-Policy"); got != tc.csp {
			t.Errorf("%q: Content-Security-Policy %q, want %q", tc.configured, got, tc.csp)
		}
		if got := resp.Header.Get("X-Frame-Options"); got != tc.xfo {
			t.Errorf("%q: X-Frame-Options %q, want %q", tc.configured, got, tc.xfo)
		}
	}
	for _, bad := range []string{"", " ", "https://a.example; script-src *", "https://a.example,https://b.example", "x\nSet-Cookie: a=b"} {
		if CheckFrameAncestors(bad) == "" {
			t.Errorf("%q accepted", bad)
		}
	}
	if msg := CheckFrameAncestors("'self' https://project.example"); msg != "" {
		t.Errorf("a good list refused: %s", msg)
	}
}
