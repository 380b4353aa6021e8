package main

import "testing"

func sieveCount(lo, hi uint64) uint64 {
	comp := make([]bool, hi)
	var c uint64
	for i := uint64(2); i < hi; i++ {
		if comp[i] {
			continue
		}
		if i >= lo {
			c++
		}
		for j := i * i; j < hi; j += i {
			comp[j] = true
		}
	}
	return c
}

func TestKnownCounts(t *testing.T) {
	for _, tc := range []struct{ lo, hi, want uint64 }{
		{0, 0, 0}, {0, 2, 0}, {0, 3, 1}, {2, 3, 1}, {0, 10, 4}, {0, 100, 25},
		{0, 1000, 168}, {0, 1000000, 78498}, {1000000, 1001000, 75},
		{4294967291, 4294967312, 2}, // 2^32-5 and 2^32+15 are prime
	} {
		if got := countPrimes(tc.lo, tc.hi); got != tc.want {
			t.Errorf("countPrimes(%d, %d) = %d, want %d", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestAgainstSieve(t *testing.T) {
	for _, r := range [][2]uint64{{0, 50000}, {12345, 67890}, {99990, 100000}} {
		if got, want := countPrimes(r[0], r[1]), sieveCount(r[0], r[1]); got != want {
			t.Errorf("[%d, %d): got %d, sieve says %d", r[0], r[1], got, want)
		}
	}
}

func TestCheckpointResume(t *testing.T) {
	const lo, hi = 1000, 200000
	want := countPrimes(lo, hi)
	var saved [][]byte
	var last float64
	h := hooks{
		progress: func(f float64) {
			if f < last || f > 1 {
				t.Fatalf("progress went from %v to %v", last, f)
			}
			last = f
		},
		checkpointDue: func() bool { return true },
		checkpoint:    func(b []byte) error { saved = append(saved, b); return nil },
	}
	got, err := run(state{Lo: lo, Hi: hi, Next: lo}, h)
	if err != nil || got != want {
		t.Fatalf("run = %d, %v; want %d", got, err, want)
	}
	if last != 1 || len(saved) == 0 {
		t.Fatalf("last progress %v, %d checkpoints", last, len(saved))
	}
	// Resume from a checkpoint in the middle.
	s, err := decodeState(saved[len(saved)/2], lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	if s.Next <= lo || s.Next >= hi {
		t.Fatalf("checkpoint at %d", s.Next)
	}
	h.checkpointDue = func() bool { return false }
	last = 0
	got, err = run(s, h)
	if err != nil || got != want {
		t.Fatalf("resumed run = %d, %v; want %d", got, err, want)
	}
	if _, err := decodeState(saved[0], lo, hi+1); err == nil {
		t.Error("checkpoint for another range accepted")
	}
	if _, err := decodeState([]byte(`{"lo":1000,"hi":200000,"next":5,"count":0}`), lo, hi); err == nil {
		t.Error("inconsistent checkpoint accepted")
	}
	if _, err := decodeState([]byte("garbage"), lo, hi); err == nil {
		t.Error("garbage checkpoint accepted")
	}
}
