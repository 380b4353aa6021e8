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
	if w := f.watched(4); len(w) != 0 {
		t.Errorf("watched %v before any waiter wants a status", w)
	}
	f.watch("a", a2)
	f.watch("b", a1) // not b's waiter: nothing
	if w := f.watched(4); !slices.Equal(w, []string{"a"}) {
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
	if w := f.watched(4); len(w) != 0 {
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

// watched returns at most n workflows.
func TestFinishWaitersWatchedIsBounded(t *testing.T) {
	t.Parallel()
	f := newFinishWaiters()
	for _, id := range []string{"a", "b", "c"} {
		ch, _ := f.add(id)
		f.watch(id, ch)
	}
	for _, tc := range []struct{ n, want int }{{0, 0}, {2, 2}, {3, 3}, {4, 3}} {
		if got := f.watched(tc.n); len(got) != tc.want {
			t.Errorf("watched(%d) = %v, want %d of them", tc.n, got, tc.want)
		}
	}
}
