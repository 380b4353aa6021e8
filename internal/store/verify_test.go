package store

import (
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/sched"
)

func TestOutputsHash(t *testing.T) {
	t.Parallel()
	a := []Output{{Name: "stdout", Data: []byte("x")}, {Name: "out/b", Data: nil}}
	b := []Output{{Name: "out/b", Data: []byte{}}, {Name: "stdout", Data: []byte("x")}}
	if OutputsHash(a) != OutputsHash(b) {
		t.Errorf("hash depends on output order or nil vs empty")
	}
	for _, c := range [][]Output{
		{{Name: "stdout", Data: []byte("y")}},
		{{Name: "stdout", Data: []byte("x")}},
		{{Name: "stdou", Data: []byte("tx")}},
		nil,
	} {
		if OutputsHash(c) == OutputsHash(a) {
			t.Errorf("different outputs %v hash alike", c)
		}
	}
}

func TestDecideReplicas(t *testing.T) {
	t.Parallel()
	task := verifyTask{id: 1, state: StateRunning, replicas: 2, quorum: 2, maxReplicas: 5}
	ok := func(id int64, w, h string) replicaAttempt {
		return replicaAttempt{id: id, worker: w, state: "succeeded", hash: h}
	}
	run := func(id int64, w string) replicaAttempt { return replicaAttempt{id: id, worker: w, state: "running"} }
	trusted := sched.Reputation{Valid: 30, Recent: []bool{true, true, true, true, true, true, true, true, true, true}}
	tests := []struct {
		name    string
		task    verifyTask
		as      []replicaAttempt
		reps    map[string]sched.Reputation
		accept  string
		winner  int64
		invalid []string
		valid   []string
		more    int
		fail    bool
	}{
		{name: "one result, other running: wait", task: task, as: []replicaAttempt{ok(1, "a", "h1"), run(2, "b")}},
		{name: "two agree", task: task, as: []replicaAttempt{ok(1, "a", "h1"), ok(2, "b", "h1")}, accept: "h1", winner: 1, valid: []string{"a", "b"}},
		{name: "two disagree: one more", task: task, as: []replicaAttempt{ok(1, "liar", "bad"), ok(2, "b", "h1")}, more: 1},
		{name: "third breaks the tie", task: task, as: []replicaAttempt{ok(1, "liar", "bad"), ok(2, "b", "h1"), ok(3, "c", "h1")},
			accept: "h1", winner: 2, valid: []string{"b", "c"}, invalid: []string{"liar"}},
		{name: "minority never accepted", task: verifyTask{id: 1, state: StateRunning, replicas: 3, quorum: 1, maxReplicas: 5},
			as: []replicaAttempt{ok(1, "a", "x"), ok(2, "b", "y")}, more: 1},
		{name: "no quorum within bound fails", task: verifyTask{id: 1, state: StateRunning, replicas: 2, quorum: 2, maxReplicas: 3},
			as: []replicaAttempt{ok(1, "a", "x"), ok(2, "b", "y"), ok(3, "c", "z")}, fail: true},
		{name: "pending replica counts as outstanding", task: verifyTask{id: 1, state: StateReady, pending: 1, replicas: 2, quorum: 2, maxReplicas: 5},
			as: []replicaAttempt{ok(1, "a", "x")}},
		{name: "trusted worker alone", task: task, as: []replicaAttempt{ok(1, "t", "x")}, reps: map[string]sched.Reputation{"t": trusted},
			accept: "x", winner: 1},
		{name: "re-check never accepts a lone result", task: verifyTask{id: 1, state: StateReady, hash: "old", replicas: 2, quorum: 2, maxReplicas: 5},
			as: []replicaAttempt{ok(1, "t", "old")}, reps: map[string]sched.Reputation{"t": trusted}, more: 1},
		{name: "re-check overturns", task: verifyTask{id: 1, state: StateRunning, hash: "old", replicas: 2, quorum: 2, maxReplicas: 5},
			as: []replicaAttempt{ok(1, "t", "old"), ok(2, "a", "new"), ok(3, "b", "new")}, reps: map[string]sched.Reputation{"t": trusted},
			accept: "new", winner: 2, valid: []string{"a", "b"}, invalid: []string{"t"}},
		{name: "late result judged against the accepted hash", task: verifyTask{id: 1, state: StateDone, hash: "h1", replicas: 2, quorum: 2, maxReplicas: 5},
			as: []replicaAttempt{{id: 1, worker: "a", state: "succeeded", hash: "h1", verdict: "valid"}, ok(3, "liar", "bad")}, invalid: []string{"liar"}},
		{name: "cancelled task ignores results", task: verifyTask{id: 1, state: StateCancelled, replicas: 2, quorum: 2, maxReplicas: 5},
			as: []replicaAttempt{ok(1, "a", "x"), ok(2, "b", "x")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := decideReplicas(tc.task, tc.as, tc.reps, sched.DefaultVerify())
			if o.accept != tc.accept || o.more != tc.more || (o.fail != "") != tc.fail {
				t.Fatalf("outcome = %+v, want accept %q more %d fail %v", o, tc.accept, tc.more, tc.fail)
			}
			if tc.accept != "" && o.winner != tc.winner {
				t.Errorf("winner = %d, want %d", o.winner, tc.winner)
			}
			if !equalStrings(o.invalid, tc.invalid) || !equalStrings(o.valid, tc.valid) {
				t.Errorf("valid %v invalid %v, want %v %v", o.valid, o.invalid, tc.valid, tc.invalid)
			}
		})
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestReputationFromRecord(t *testing.T) {
	t.Parallel()
	cfg := sched.DefaultVerify()
	tests := []struct {
		valid, invalid int64
		streak         int
		trusted        bool
	}{
		{0, 0, 0, false},
		{30, 0, 30, true},
		{30, 1, 5, false},
		{30, 1, 12, true},
		{5, 0, 5, false},
	}
	for _, tc := range tests {
		if got := reputation(tc.valid, tc.invalid, tc.streak, cfg.TrustWindow).Trusted(cfg); got != tc.trusted {
			t.Errorf("reputation(%d, %d, %d).Trusted = %v, want %v", tc.valid, tc.invalid, tc.streak, got, tc.trusted)
		}
	}
}

func TestAggregateRuns(t *testing.T) {
	t.Parallel()
	got := aggregateRuns([]Run{{"m", "b", 3 * time.Second}, {"m", "a", time.Second}, {"m", "b", 5 * time.Second}})
	if len(got) != 2 || got[0].Name != "a" || got[1].Runs != 2 || got[1].Mean != 4*time.Second {
		t.Errorf("aggregateRuns = %+v", got)
	}
}
