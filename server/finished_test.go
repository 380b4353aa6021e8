package server

import (
	"slices"
	"testing"

	"github.com/cyclepool/cyclepool/internal/store"
)

func TestFinishWaiters(t *testing.T) {
	t.Parallel()
	f := newFinishWaiters()
	a1, forgetA1 := f.add("a")
	a2, forgetA2 := f.add("a")
	b, forgetB := f.add("b")
	if n := f.waiting(); n != 3 {
		t.Fatalf("waiting = %d, want 3", n)
	}
	if w := f.watchedAmong([]string{"a", "b"}, 4); len(w) != 0 {
		t.Errorf("watched %v before any waiter wants a status", w)
	}
	f.watch("a", a2)
	f.watch("b", a1) // not b's waiter: nothing
	if w := f.watchedAmong([]string{"b", "a", "a", "c"}, 4); !slices.Equal(w, []string{"a"}) {
		t.Errorf("watched %v, want [a]", w)
	}
	st := &store.FinishedStatus{Status: &store.WorkflowStatus{ID: "a"}}
	f.finished("a", st)
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
	if w := f.watchedAmong([]string{"a"}, 4); len(w) != 0 {
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

// watchedAmong returns at most n workflows, each once, and only of those
// it is given.
func TestFinishWaitersWatchedAmong(t *testing.T) {
	t.Parallel()
	f := newFinishWaiters()
	for _, id := range []string{"a", "b", "c"} {
		ch, _ := f.add(id)
		f.watch(id, ch)
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
		if got := f.watchedAmong(tc.ids, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("watchedAmong(%v, %d) = %v, want %v", tc.ids, tc.n, got, tc.want)
		}
	}
}
