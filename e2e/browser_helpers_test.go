//go:build unix

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/cyclepool/cyclepool/internal/chromium"
)

// chromiumPath is Debian's Chromium, which .ci/run installs. A machine
// without it fails the browser tests: they are never skipped.
const chromiumPath = chromium.Path

// screensDir is where the tests' screenshots of the pages go, for people
// to look at: the directory CYCLEPOOL_SCREENS names, and none (no
// screenshot taken) without it. No test asserts on a screenshot.
func screensDir() string { return os.Getenv("CYCLEPOOL_SCREENS") }

// browser is one tab of the shared Chromium, in a browser context of its
// own.
type browser struct {
	t    *testing.T
	ctx  context.Context
	logs *lineLog // the page's console (the worker relays its own log there) and its exceptions
}

// sharedChromiumState is the one headless Chromium the browser tests share, started
// by the first test that needs one and stopped by TestMain: starting a
// Chromium per test cost about a CPU-second each. Each browser a test
// opens is a browser context of its own, with its own tab and window and
// its own cookies, storage and caches, kept in memory (an incognito
// profile's: a smaller default storage quota than a profile on disk).
var sharedChromiumState struct {
	once sync.Once
	ctx  context.Context // the browser's first tab, whose end stops the browser
	stop func()
	err  error
}

// sharedChromium returns the context of the shared Chromium's first tab,
// starting the browser once.
func sharedChromium(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("Chromium is needed for the browser tests: %v (install Debian's chromium package, as .ci/run does)", err)
	}
	sharedChromiumState.once.Do(func() {
		actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), chromium.Options(chromiumPath)...)
		ctx, cancel := chromedp.NewContext(actx)
		sharedChromiumState.ctx = ctx
		sharedChromiumState.stop = func() {
			cancel()
			cancelAlloc()
		}
		sharedChromiumState.err = chromedp.Do(ctx)
	})
	if sharedChromiumState.err != nil {
		t.Fatalf("start chromium: %v", sharedChromiumState.err)
	}
	return sharedChromiumState.ctx
}

// stopChromium stops the shared Chromium, if a test started it.
func stopChromium() {
	if sharedChromiumState.stop != nil {
		sharedChromiumState.stop()
	}
}

// newBrowser opens a tab of the shared Chromium in a new browser context
// (nothing kept of other browsers), whose viewport is width by height. battery,
// when not empty, replaces navigator.getBattery with a battery of that
// state, e.g. `{level: 0.8, charging: false}`, before any script of the
// page runs.
func newBrowser(t *testing.T, width, height int, battery string) *browser {
	t.Helper()
	ctx, cancel := chromedp.NewContext(sharedChromium(t), chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	b := &browser{t: t, ctx: ctx, logs: newLineLog()}
	if err := chromedp.Listen(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			var parts []string
			for _, a := range ev.Args {
				if len(a.Value) > 0 {
					var s string
					if json.Unmarshal(a.Value, &s) == nil {
						parts = append(parts, s)
						continue
					}
					parts = append(parts, string(a.Value))
				} else {
					parts = append(parts, a.Description)
				}
			}
			b.logs.add(fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(parts, " ")))
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			b.logs.add(fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber, msg))
		}
	}); err != nil {
		t.Fatalf("open a tab in chromium: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		t.Fatalf("set the viewport: %v", err)
	}
	if battery != "" {
		src := `Object.defineProperty(Navigator.prototype, "getBattery", {configurable: true, value: function () {
			const b = Object.assign({chargingTime: Infinity, dischargingTime: Infinity, addEventListener() {}}, ` + battery + `);
			return Promise.resolve(b);
		}});`
		if err := chromedp.Do(ctx, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: src})
			return err
		})); err != nil {
			t.Fatalf("override the battery: %v", err)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- browser console ---\n%s", b.logs)
		}
	})
	return b
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// eval evaluates a JavaScript expression in the page (awaiting a promise)
// and decodes its JSON value into out.
func (b *browser) eval(expr string, out any) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			b.t.Fatalf("evaluate %s: %v (%s)", expr, err, raw)
		}
	}
}

// pageStatus is window.cyclepool.status, what the worker last reported.
type pageStatus struct {
	Connected     bool          `json:"connected"`
	Done          int           `json:"done"`
	Failed        int           `json:"failed"`
	Cancelled     int           `json:"cancelled"`
	Paused        bool          `json:"paused"`
	PausedBecause string        `json:"pausedBecause"`
	CPUMs         int64         `json:"cpuMs"`
	Running       []runningTask `json:"running"`
	Refused       int           `json:"refused"`
	Threads       int           `json:"threads"` // attempts the page runs at once
	TaskWorkers   taskWorkers   `json:"taskWorkers"`
	Modules       struct {
		Fetched int `json:"fetched"` // from the server (or the HTTP cache)
		Cached  int `json:"cached"`  // from IndexedDB
	} `json:"modules"`
	Data struct {
		Fetched int `json:"fetched"` // blobs downloaded
		Cached  int `json:"cached"`  // from the Cache API
		Evicted int `json:"evicted"` // times the data cache was emptied for room
		Unkept  int `json:"unkept"`  // blobs that did not fit even then
	} `json:"data"`
	Identity struct {
		ID string `json:"id"` // the worker's id, once the server gave it
	} `json:"identity"`
}

// taskWorkers is what the page counts of its task Web Workers.
type taskWorkers struct {
	Started    int `json:"started"`
	Terminated int `json:"terminated"`
	Busy       int `json:"busy"`
	Ahead      int `json:"ahead"`   // attempts run on an instance made ahead of time
	Batches    int `json:"batches"` // messages that sent attempts to a task Web Worker
	Sent       int `json:"sent"`    // attempts those messages sent
	// GivenBack counts attempts taken back from a batch whose
	// running attempt ran long, for another task Web Worker.
	GivenBack int `json:"givenBack"`
}

// runningTask is an attempt the page has given a task Web Worker.
type runningTask struct {
	Task     string  `json:"task"`
	Progress float64 `json:"progress"`
}

func (b *browser) status() pageStatus {
	b.t.Helper()
	var s *pageStatus
	b.eval(`window.cyclepool ? window.cyclepool.status : null`, &s)
	if s == nil {
		return pageStatus{}
	}
	return *s
}

// screenshot sets the viewport to width by height and saves the whole page
// as PNG in screensDir, when there is one.
func (b *browser) screenshot(name string, width, height int64) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(width, height)); err != nil {
		b.t.Fatalf("viewport: %v", err)
	}
	dir := screensDir()
	if dir == "" {
		return
	}
	time.Sleep(300 * time.Millisecond) // let the layout settle
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%dpx.png", name, width)), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// stopPage stops the volunteer page's worker (its toggle) and waits until
// it has: from then on only other workers compute.
func stopPage(t *testing.T, b *browser) {
	t.Helper()
	b.do(chromedp.Click(chromedp.ID("toggle")))
	eventually(t, 10*time.Second, "the page to stop", func() bool {
		var running bool
		b.eval(`window.cyclepool.running`, &running)
		return !running
	})
}

// countingProxy stands between the browser and a server (WebSockets
// included) and counts the requests that reach the server, by path prefix.
// It can also refuse requests by path prefix, as a server gone or a
// network cut for some paths would.
type countingProxy struct {
	url     string
	mu      sync.Mutex
	log     []string // request paths, in order
	refused string   // a path prefix answered with 503 ("" for none)
	// blobBytes counts the bytes of the answers to /blobs/ requests.
	blobBytes atomic.Int64
}

// countingWriter counts what a handler writes.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (w countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n.Add(int64(n))
	return n, err
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	cp := &countingProxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cp.mu.Lock()
		cp.log = append(cp.log, r.URL.Path)
		refuse := cp.refused != "" && strings.HasPrefix(r.URL.Path, cp.refused)
		cp.mu.Unlock()
		if refuse {
			http.Error(w, "refused by the test's proxy", http.StatusServiceUnavailable)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/blobs/") {
			w = countingWriter{w, &cp.blobBytes}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	cp.url = srv.URL
	return cp
}

// refuse makes the proxy answer 503 to the requests whose path starts with
// prefix ("" to refuse none).
func (cp *countingProxy) refuse(prefix string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.refused = prefix
}

// count returns how many requests had a path starting with prefix.
func (cp *countingProxy) count(prefix string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	n := 0
	for _, p := range cp.log {
		if strings.HasPrefix(p, prefix) {
			n++
		}
	}
	return n
}

// cdpEmpty is the parameter of a protocol command that takes none.
var cdpEmpty = cdp.Empty{}
