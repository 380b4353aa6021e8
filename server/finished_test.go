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
