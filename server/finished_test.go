package server

import "testing"

func TestFinishWaiters(t *testing.T) {
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

func TestEchoesWakeOncePerSubmission(t *testing.T) {
	tests := []struct {
		name  string
		calls []string // ids, in the order their wake-ups arrive
		want  []bool
	}{
		{"handler then notification", []string{"a", "a"}, []bool{true, false}},
		{"two submissions interleaved", []string{"a", "b", "b", "a"}, []bool{true, true, false, false}},
		{"a third wake-up counts as new", []string{"a", "a", "a"}, []bool{true, false, true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEchoes()
			for i, id := range tc.calls {
				if got := e.first(id); got != tc.want[i] {
					t.Errorf("call %d (%s): first = %v, want %v", i, id, got, tc.want[i])
				}
			}
		})
	}
	e := newEchoes()
	e.first("lost")
	e.reset()
	if !e.first("lost") {
		t.Error("after reset, a wake-up should count as the first")
	}
	for i := range maxEchoes + 10 { // never grows past its bound
		e.first(string(rune('a'+i%26)) + string(rune(i)))
	}
	if n := len(e.seen); n > maxEchoes {
		t.Errorf("echoes keeps %d ids, more than %d", n, maxEchoes)
	}
}
