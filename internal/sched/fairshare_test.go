package sched

import (
	"slices"
	"testing"
)

func TestFairShare(t *testing.T) {
	for _, tc := range []struct {
		name    string
		owners  []int64 // of tasks 0.., in their priority order
		running map[int64]int
		want    []int
	}{
		{"one owner keeps its order", []int64{1, 1, 1}, map[int64]int{1: 9}, []int{0, 1, 2}},
		{"a backlog first shares with the owner behind it", []int64{1, 1, 1, 1, 2, 2}, nil, []int{0, 4, 1, 5, 2, 3}},
		{"the owner running fewer goes first", []int64{1, 1, 2, 2, 2}, map[int64]int{1: 2}, []int{2, 3, 0, 4, 1}},
		{"ties keep the priority order", []int64{2, 1, 2, 1}, map[int64]int{1: 1, 2: 1}, []int{0, 1, 2, 3}},
		{"three owners", []int64{1, 1, 2, 3, 3, 3}, map[int64]int{3: 1}, []int{0, 2, 1, 3, 4, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order := make([]int, len(tc.owners))
			for i := range order {
				order[i] = i
			}
			got := FairShare(order, func(i int) int64 { return tc.owners[i] }, tc.running)
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// Schedule gives the slots to the owner with the fewest attempts running,
// whatever the priority order says between owners.
func TestScheduleSharesSlotsBetweenOwners(t *testing.T) {
	var ready []Task
	for i, o := range []int64{1, 1, 1, 1, 2, 2} {
		ready = append(ready, Task{ID: string(rune('a' + i)), Owner: o})
	}
	cfg := DefaultConfig()
	cfg.LongestFirst = false
	p := Schedule(FixedClock(t0), Input{Ready: ready, Workers: []Worker{{ID: "w", Slots: 8, Busy: 5, Idle: 3}},
		Running: map[int64]int{1: 4, 2: 1}}, cfg)
	var got []string
	for _, a := range p.Assignments {
		got = append(got, a.Task)
	}
	if want := []string{"e", "f", "a"}; !slices.Equal(got, want) {
		t.Errorf("assigned %v, want %v", got, want)
	}
}
