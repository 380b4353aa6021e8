package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// The attack on GET /modules/{id}, which needs no token, as anyone who
// learnt two module ids from an assignment makes it: two connections ask
// for two large modules and read them at a trickle (a few KiB at a time,
// fast enough for the server's stall limit). Meanwhile an honest client
// gets a third module, whole, and the server's heap does not hold the
// attackers' modules. When bodies were held in memory while written, the
// two held the memory every download shared for up to ten minutes (the
// whole write's time), and every other module waited for room until its
// client gave up. (Not parallel: it measures the heap.)
func TestTricklingModuleReadersHoldNoMemory(t *testing.T) {
	const size = 32 << 20 // the attackers' modules; more than the sockets' buffers hold
	st, _, tok := openStore(t)
	s := New(st, Config{MaxModuleBytes: size, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { s.Close() })
	t.Cleanup(ts.Close)
	m := &moduleServer{url: ts.URL, token: tok}
	var big []string
	for _, fill := range []byte{'a', 'b'} {
		body := paddedModule(t, size, fill)
		if status, answer := m.push(t, body); status != http.StatusCreated {
			t.Fatalf("push a module of %d MiB: %d %v", size>>20, status, answer)
		}
		big = append(big, moduleID(body))
	}
	honest := paddedModule(t, 64<<10, 'h')
	if status, answer := m.push(t, honest); status != http.StatusCreated {
		t.Fatalf("push: %d %v", status, answer)
	}

	var base runtime.MemStats
	runtime.GC()
	runtime.GC() // and the pools' victims
	runtime.ReadMemStats(&base)

	// The attackers: the headers, then 4 KiB every 50 ms (80 KiB/s, a
	// MiB in 13 s, the module in 7 minutes) until the test ends.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ended []string // why attackers' connections ended before the test did
	read := make([]int64, len(big))
	for i, id := range big {
		c, err := net.Dial("tcp", strings.TrimPrefix(ts.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		r := getModuleHeaders(t, c, id, fmt.Sprintf("attacker %d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				n, err := r.Read(buf)
				mu.Lock()
				read[i] += int64(n)
				if err != nil {
					ended = append(ended, fmt.Sprintf("attacker %d after %d bytes: %v", i, read[i], err))
					mu.Unlock()
					return
				}
				mu.Unlock()
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	// Both trickle before the honest client asks.
	for trickling := false; !trickling; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		trickling = read[0] > 0 && read[1] > 0 || len(ended) > 0
		mu.Unlock()
	}

	// The honest client, while both attackers read. The timeout only
	// bounds the test: when the attackers held the shared memory, this
	// waited for as long as they did.
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", ts.URL+"/modules/"+moduleID(honest), nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	var got []byte
	if err == nil {
		got, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	took := time.Since(start)
	var now runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&now)
	grown := int64(now.HeapInuse) - int64(base.HeapInuse)
	mu.Lock()
	t.Logf("the honest download took %v while the attackers had read %d and %d bytes", took.Round(time.Millisecond), read[0], read[1])
	cut := slices.Clone(ended)
	mu.Unlock()
	t.Logf("heap in use grown by %d MiB while 2 readers of modules of %d MiB hold their connections", grown>>20, size>>20)
	if len(cut) > 0 {
		t.Fatalf("attackers cut off before the honest download ended: %v", cut)
	}
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, honest) {
		t.Errorf("honest client, while two trickling readers are connected: %d bytes, err %v; want the module's %d", len(got), err, len(honest))
	}
	if grown > size/2 {
		t.Errorf("the heap grew by %d MiB while two trickling readers held %d MiB modules", grown>>20, size>>20)
	}
	mu.Lock()
	cut = slices.Clone(ended)
	mu.Unlock()
	if len(cut) > 0 {
		t.Errorf("attackers cut off: %v", cut)
	}
}
