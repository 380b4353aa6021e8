package server

import "testing"

func TestFinishWaiters(t *testing.T) {
	t.Parallel()
	f := newFinishWaiters()
	a1, forgetA1 := f.add("a")
	a2, forgetA2 := f.add("a")
	b, forgetB := f.add("b")
	if n := f.waiting(); n != 3 {
		t.Fatalf("waiting = %d, want 3", n)
	}
	f.finished("a")
	for i, ch := range []<-chan bool{a1, a2} {
		select {
		case fin := <-ch:
			if !fin {
				t.Errorf("waiter %d of a woken with false, want true (finished)", i)
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
	f.all()
	if fin := <-b; fin {
		t.Error("all() woke b with true, want false (look again)")
	}
	forgetB()
	f.finished("b") // nobody waits: nothing happens
	_, forgetC := f.add("c")
	forgetC()
	if n := f.waiting(); n != 0 {
		t.Fatalf("waiting = %d, want 0", n)
	}
}
