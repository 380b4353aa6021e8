package main

import (
	"encoding/json"
	"errors"
	"fmt"
)

// isPrime reports whether n is prime, by trial division with the 6k±1
// wheel. It is deliberately simple and CPU-bound.
func isPrime(n uint64) bool {
	if n < 2 {
		return false
	}
	if n < 4 {
		return true
	}
	if n%2 == 0 || n%3 == 0 {
		return false
	}
	if n <= 0xFFFFFFFF {
		m := uint32(n)
		for d := uint32(5); uint64(d)*uint64(d) <= n; d += 6 {
			if m%d == 0 || m%(d+2) == 0 {
				return false
			}
		}
		return true
	}
	for d := uint64(5); d <= n/d; d += 6 {
		if n%d == 0 || n%(d+2) == 0 {
			return false
		}
	}
	return true
}

// countPrimes counts the primes in [lo, hi).
func countPrimes(lo, hi uint64) uint64 {
	var c uint64
	for n := lo; n < hi; n++ {
		if isPrime(n) {
			c++
		}
	}
	return c
}

// state is what a checkpoint holds: the range, the next number to test and
// the primes counted in [LO, Next).
type state struct {
	Lo    uint64 `json:"lo"`
	Hi    uint64 `json:"hi"`
	Next  uint64 `json:"next"`
	Count uint64 `json:"count"`
}

func (s state) encode() []byte {
	b, _ := json.Marshal(s)
	return b
}

func decodeState(b []byte, lo, hi uint64) (state, error) {
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return state{}, fmt.Errorf("bad checkpoint: %w", err)
	}
	if s.Lo != lo || s.Hi != hi {
		return state{}, fmt.Errorf("checkpoint is for [%d, %d), not [%d, %d)", s.Lo, s.Hi, lo, hi)
	}
	if s.Next < lo || s.Next > hi || s.Count > s.Next-lo {
		return state{}, errors.New("checkpoint is inconsistent")
	}
	return s, nil
}

// hooks connect the counting loop to the platform (or to a test).
type hooks struct {
	progress      func(float64)
	checkpointDue func() bool
	checkpoint    func([]byte) error
}

// step is how many numbers are tested between two looks at the platform.
const step = 1 << 14

// run counts the primes in [s.Lo, s.Hi) starting from s, reporting progress
// and saving checkpoints through h.
func run(s state, h hooks) (uint64, error) {
	span := float64(s.Hi - s.Lo)
	for s.Next < s.Hi {
		end := s.Hi
		if s.Hi-s.Next > step {
			end = s.Next + step
		}
		s.Count += countPrimes(s.Next, end)
		s.Next = end
		if span > 0 {
			h.progress(float64(s.Next-s.Lo) / span)
		}
		if s.Next < s.Hi && h.checkpointDue() {
			if err := h.checkpoint(s.encode()); err != nil {
				return 0, err
			}
		}
	}
	return s.Count, nil
}
