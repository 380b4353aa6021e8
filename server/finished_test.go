package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/internal/store"
)

func TestFinishWaiters(t *testing.T) {
	t.Parallel()
	f := newFinishWaiters()
	a1, forgetA1 := f.add("a")
	b, forgetB := f.add("b")
	if w := f.beginReading(slices.Values([]string{"a", "b"}), 4); len(w) != 0 {
		t.Errorf("watched %v before any waiter wants a status", w)
	}
	a2, forgetA2 := f.addWatching("a")
	if n := f.waiting(); n != 3 {
		t.Fatalf("waiting = %d, want 3", n)
	}
	w := f.beginReading(slices.Values([]string{"b", "a", "a", "c"}), 4)
	if !slices.Equal(w, []string{"a"}) {
		t.Errorf("watched %v, want [a]", w)
	}
	f.heard("a") // the commit's notification, before the batch is done: held
	for i, ch := range []<-chan wake{a1, a2} {
		select {
		case wk := <-ch:
			t.Errorf("waiter %d of a woken with %+v while a batch reads its status", i, wk)
		default:
		}
	}
	st := &store.FinishedStatus{Status: &store.WorkflowStatus{ID: "a"}}
	f.finished("a", st)
	f.endReading(w) // the batch woke them: nothing more
	for i, ch := range []<-chan wake{a1, a2} {
		select {
		case wk := <-ch:
			if !wk.finished || wk.status != st {
				t.Errorf("waiter %d of a woken with %+v, want finished with its status", i, wk)
			}
		default:
			t.Errorf("waiter %d of a not woken", i)
		}
	}
	select {
	case <-b:
		t.Error("waiter of b woken by a's end")
	default:
	}
	forgetA1()
	forgetA2() // after the wake-up: harmless
	if n := f.waiting(); n != 1 {
		t.Fatalf("waiting = %d after a finished, want 1", n)
	}
	if w := f.beginReading(slices.Values([]string{"a"}), 4); len(w) != 0 {
		t.Errorf("watched %v after a finished", w)
	}
	f.all()
	if wk := <-b; wk.finished || wk.status != nil {
		t.Errorf("all() woke b with %+v, want look again", wk)
	}
	forgetB()
	f.finished("b", nil) // nobody waits: nothing happens
	_, forgetC := f.add("c")
	forgetC()
	if n := f.waiting(); n != 0 {
		t.Fatalf("waiting = %d, want 0", n)
	}
}

// beginReading returns at most n workflows, each once, and only of those
// it is given.
func TestFinishWaitersBeginReading(t *testing.T) {
	t.Parallel()
	f := newFinishWaiters()
	for _, id := range []string{"a", "b", "c"} {
		f.addWatching(id)
	}
	for _, tc := range []struct {
		ids  []string
		n    int
		want []string
	}{
		{[]string{"a", "b", "c"}, 0, nil},
		{[]string{"a", "b", "c"}, 2, []string{"a", "b"}},
		{[]string{"c", "c", "x", "a"}, 4, []string{"c", "a"}},
		{[]string{"x", "y"}, 4, nil},
	} {
		got := f.beginReading(slices.Values(tc.ids), tc.n)
		if !slices.Equal(got, tc.want) {
			t.Errorf("beginReading(%v, %d) = %v, want %v", tc.ids, tc.n, got, tc.want)
		}
		f.endReading(got)
	}
	if len(f.reading) != 0 {
		t.Errorf("%d workflows still being read after every batch ended", len(f.reading))
	}
}

// The listener's word that a workflow finished, heard while a batch reads
// its status, wakes its waiters once the batch is done if the batch did
// not (it did not finish it: another replica did), and at once otherwise.
func TestFinishWaitersHeardWhileReading(t *testing.T) {
	t.Parallel()
	f := newFinishWaiters()
	a, _ := f.addWatching("a")
	b, _ := f.add("b")
	one := f.beginReading(slices.Values([]string{"a"}), 4)
	two := f.beginReading(slices.Values([]string{"a"}), 4) // two batches at once
	f.heard("a")
	f.heard("b") // not being read: at once
	select {
	case wk := <-b:
		if !wk.finished {
			t.Errorf("b woken with %+v, want finished", wk)
		}
	default:
		t.Error("b not woken by the listener")
	}
	f.endReading(one)
	select {
	case wk := <-a:
		t.Fatalf("a woken with %+v while a second batch reads it", wk)
	default:
	}
	f.endReading(two)
	select {
	case wk := <-a:
		if !wk.finished || wk.status != nil {
			t.Errorf("a woken with %+v, want finished, without a status", wk)
		}
	default:
		t.Error("a not woken once the batches were done")
	}
}

// xReader reads n bytes of 'x', held nowhere: a large request body whose
// only copies are the server's.
type xReader struct{ n int }

func (r *xReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n)
	for i := range k {
		p[i] = 'x'
	}
	r.n -= k
	return k, nil
}

// A submission that waits for its workflow's end keeps, while it waits,
// nothing of the workflow's file: four of 7 MiB of stdin each, waiting at
// once, hold less than one such file more than once they have answered
// (each held three times its size before: the body, the parsed file and
// the converted workflow). What the database connections keep of the
// largest arguments they sent stays either way.
func TestSubmitAndWaitHoldsNotItsWorkflow(t *testing.T) {
	f := newFixture(t)
	s := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	h := s.Handler()
	const n, size = 4, 7 << 20
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := pgx.Connect(ctx, f.url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := io.MultiReader(
				strings.NewReader(fmt.Sprintf(`{"name": "big-%d", "tasks": [{"name": "a", "module": %q, "stdin": {"data": "`, i, f.module)),
				&xReader{size}, strings.NewReader(`"}}]}`))
			req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/api/v1/workflows?wait=60s", body)
			req.Header.Set("Authorization", "Bearer "+f.token)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated {
				t.Errorf("HTTP %d: %.200s", rec.Code, rec.Body.String())
			}
		}()
	}
	for try := 0; ; try++ {
		var written int
		if err := db.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE name LIKE 'big-%'`).Scan(&written); err != nil {
			t.Fatal(err)
		}
		if written == n && s.ends.waiting() == n {
			break
		}
		if try == 2000 {
			t.Fatalf("%d of %d workflows written, %d waiting", written, n, s.ends.waiting())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A handler may be just past its commit: the least of a few looks.
	waiting := heap()
	for range 5 {
		time.Sleep(20 * time.Millisecond)
		waiting = min(waiting, heap())
	}
	cancel()
	wg.Wait()
	if after := heap(); waiting > after+size {
		t.Errorf("%d waiting submissions held %d MiB more than once they answered, want under %d MiB", n, (waiting-after)>>20, size>>20)
	}
}

// A state no workflow is ever in is refused with 400, not answered with
// an empty list, which would read as "none of yours".
func TestListRefusesUnknownState(t *testing.T) {
	f := newFixture(t)
	h := New(f.st, Config{Replica: "test", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)}).Handler()
	for state, want := range map[string]int{"": 200, "running": 200, "done": 200, "failed": 200, "cancelled": 200,
		"finished": 400, "Done": 400, "ready": 400} {
		req := httptest.NewRequest(http.MethodGet, "/api/v1/workflows?state="+state, nil)
		req.Header.Set("Authorization", "Bearer "+f.token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("state %q: HTTP %d (%s), want %d", state, rec.Code, rec.Body.String(), want)
		}
		if want == 400 && !strings.Contains(rec.Body.String(), "state must be") {
			t.Errorf("state %q: answer %s does not say what states there are", state, rec.Body.String())
		}
	}
}
