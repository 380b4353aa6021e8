package store

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TryLead and Resign, step by step on one database with a TTL far longer
// than the test: whoever leads keeps the lead while it renews and the
// others are refused; a resignation (by the holder only) hands the lead
// over at once; leads of different names are independent; a holder that
// lost its lead learns it on its next attempt.
func TestTryLeadSteps(t *testing.T) {
	t.Parallel()
	const ttl = time.Hour
	type step struct {
		op     string // "lead" or "resign"
		who    string // holder: "a" or "b"
		name   string // leader name; "" is "maintenance"
		want   bool   // what TryLead reports ("lead" only)
		expire bool   // before the step, make the current lead of name lapse
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"the first one leads and keeps leading while it renews", []step{
			{op: "lead", who: "a", want: true},
			{op: "lead", who: "b", want: false},
			{op: "lead", who: "a", want: true},
			{op: "lead", who: "b", want: false},
			{op: "lead", who: "a", want: true},
		}},
		{"a lapsed lead goes to the next one asking, and the old holder learns it", []step{
			{op: "lead", who: "a", want: true},
			{op: "lead", who: "b", want: false},
			{op: "lead", who: "b", want: true, expire: true},
			{op: "lead", who: "a", want: false},
			{op: "lead", who: "b", want: true},
		}},
		{"a resignation hands over at once, only the holder's counts", []step{
			{op: "lead", who: "a", want: true},
			{op: "resign", who: "b"},
			{op: "lead", who: "b", want: false},
			{op: "resign", who: "a"},
			{op: "lead", who: "b", want: true},
			{op: "lead", who: "a", want: false},
		}},
		{"leads of different names are independent", []step{
			{op: "lead", who: "a", name: "x", want: true},
			{op: "lead", who: "b", name: "y", want: true},
			{op: "lead", who: "b", name: "x", want: false},
			{op: "lead", who: "a", name: "y", want: false},
			{op: "resign", who: "a", name: "x"},
			{op: "lead", who: "b", name: "y", want: true},
			{op: "lead", who: "b", name: "x", want: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			url := migratedURL(t)
			// Two replicas: two Store handles on the same database.
			stores := map[string]*Store{}
			for _, who := range []string{"a", "b"} {
				s, err := Open(ctx, url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				stores[who] = s
			}
			for i, st := range tc.steps {
				name := st.name
				if name == "" {
					name = "maintenance"
				}
				s := stores[st.who]
				if st.expire {
					if _, err := s.pool.Exec(ctx, `UPDATE leaders SET expires_at = now() - interval '1 millisecond' WHERE name = $1`, name); err != nil {
						t.Fatal(err)
					}
				}
				switch st.op {
				case "lead":
					got, err := s.TryLead(ctx, name, "replica-"+st.who, ttl)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if got != st.want {
						t.Fatalf("step %d: TryLead(%s, replica-%s) = %v, want %v", i, name, st.who, got, st.want)
					}
				case "resign":
					if err := s.Resign(ctx, name, "replica-"+st.who); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
				}
			}
		})
	}
}

// leadCall is one TryLead call of a contender, timed on the test's clock.
type leadCall struct {
	i          int // the contender's index
	who        string
	start, end time.Time
	ok         bool
}

// TryLead in real time, with every contender asking every 10ms (replicas
// ask every third of the TTL), on separate Store handles or on one, and a
// TTL of 600ms: at most one leads at any time; the leader keeps the lead
// while it renews; when it stops, one of the others takes over once its
// TTL has run out, not before; and the old leader learns on its next
// attempt that it lost the lead.
//
// Every call is timed; the checks hold for any timing of the calls (a
// contender the machine stalls for longer than the TTL may lose its lead
// lawfully), so they do not depend on the machine's speed.
func TestTryLeadRealTime(t *testing.T) {
	t.Parallel()
	const ttl = 600 * time.Millisecond
	cases := []struct {
		name       string
		holders    int
		sharedPool bool
	}{
		{"two stores", 2, false},
		{"three stores", 3, false},
		{"one store, two holders", 2, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := migratedURL(t)
			stores := make([]*Store, tc.holders)
			for i := range stores {
				if tc.sharedPool && i > 0 {
					stores[i] = stores[0]
					continue
				}
				s, err := Open(ctx, url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				stores[i] = s
			}

			var mu sync.Mutex
			var calls []leadCall
			try := func(i int) (leadCall, error) {
				who := fmt.Sprintf("replica-%d", i)
				c := leadCall{i: i, who: who, start: time.Now()}
				ok, err := stores[i].TryLead(ctx, "maintenance", who, ttl)
				c.end, c.ok = time.Now(), ok
				if err == nil {
					mu.Lock()
					calls = append(calls, c)
					mu.Unlock()
				}
				return c, err
			}
			// Each contender asks every 10ms until told to stop.
			stop := make([]chan struct{}, tc.holders)
			done := make([]chan error, tc.holders)
			for i := range tc.holders {
				stop[i], done[i] = make(chan struct{}), make(chan error, 1)
				go func() {
					for {
						if _, err := try(i); err != nil {
							done[i] <- err
							return
						}
						select {
						case <-stop[i]:
							done[i] <- nil
							return
						case <-time.After(10 * time.Millisecond):
						}
					}
				}()
			}
			halt := func(i int) {
				if stop[i] == nil {
					return
				}
				close(stop[i])
				if err := <-done[i]; err != nil {
					t.Errorf("replica-%d: %v", i, err)
				}
				stop[i] = nil
			}
			defer func() {
				for i := range stop {
					halt(i)
				}
			}()
			snapshot := func() []leadCall {
				mu.Lock()
				defer mu.Unlock()
				return append([]leadCall(nil), calls...)
			}
			// lastWin returns the last win in cs by a holder for which
			// mine says true.
			lastWin := func(cs []leadCall, mine func(who string) bool) (leadCall, bool) {
				for i := len(cs) - 1; i >= 0; i-- {
					if cs[i].ok && mine(cs[i].who) {
						return cs[i], true
					}
				}
				return leadCall{}, false
			}
			anyone := func(string) bool { return true }

			// Phase 1: everyone contends for twice the TTL.
			began := time.Now()
			for time.Since(began) < 2*ttl {
				time.Sleep(20 * time.Millisecond)
			}
			phase1 := snapshot()
			leader, ok := lastWin(phase1, anyone)
			if !ok {
				t.Fatalf("nobody led after %v of contention (%d calls)", 2*ttl, len(phase1))
			}
			tries, wins := map[string]int{}, map[string]int{}
			for _, c := range phase1 {
				tries[c.who]++
				if c.ok {
					wins[c.who]++
				}
			}
			for i := range tc.holders {
				if who := fmt.Sprintf("replica-%d", i); tries[who] < 5 {
					t.Fatalf("%s asked only %d times in phase 1", who, tries[who])
				}
			}
			t.Logf("phase 1: %d calls, wins by holder %v", len(phase1), wins)

			// Phase 2: the leader stops renewing; the others keep asking
			// until one of them takes over.
			halt(leader.i)
			last, _ := lastWin(snapshot(), func(who string) bool { return who == leader.who })
			others := func(who string) bool { return who != leader.who }
			var heir leadCall
			deadline := last.end.Add(ttl + 5*time.Second)
			for {
				if w, ok := lastWin(snapshot(), others); ok && w.start.After(last.end) {
					heir = w
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("nobody took over from %s within %v of its last renewal", leader.who, time.Since(last.end))
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !heir.end.After(last.start.Add(ttl)) {
				t.Errorf("%s took over %v after %s's last renewal began, before the TTL of %v ran out", heir.who,
					heir.end.Sub(last.start), leader.who, ttl)
			}
			t.Logf("%s took over from %s %v after its last renewal began (TTL %v)", heir.who, leader.who,
				heir.end.Sub(last.start), ttl)

			// Phase 3: the old leader asks again and learns that it lost.
			again, err := try(leader.i)
			if err != nil {
				t.Fatal(err)
			}
			if again.ok {
				// Lawful only if the heir (or another) let its lead lapse.
				for _, w := range snapshot() {
					if w.ok && others(w.who) && !w.end.After(again.start) && !again.end.After(w.start.Add(ttl)) {
						t.Errorf("%s, which stopped renewing, still leads after %s took over", leader.who, w.who)
						break
					}
				}
			}
			// The others keep asking for a while: the heir keeps its lead.
			for time.Since(again.end) < ttl/2 {
				time.Sleep(20 * time.Millisecond)
			}
			for i := range stop {
				halt(i)
			}
			checkLeadCalls(t, snapshot(), ttl)
		})
	}
}

// checkLeadCalls checks a log of timed TryLead calls, each ending before
// the next call of the same holder starts:
//   - safety: a holder wins only if the previous leader's lease had run
//     out: after a win by x ending before a call y of another holder
//     starts, y wins only if it ends later than x's start plus the TTL;
//   - liveness: a holder is refused only while another holds an unexpired
//     lead: some other holder's win started before the refused call ended
//     and ended no earlier than the TTL before the refused call started.
//
// (The database's clock may be offset from the test's; the offset cancels
// out, as each bound compares two times on the same clock.)
func checkLeadCalls(t *testing.T, calls []leadCall, ttl time.Duration) {
	t.Helper()
	errs := 0
	for _, y := range calls {
		if errs > 10 {
			t.Fatalf("more errors left out (%d calls)", len(calls))
		}
		if y.ok {
			for _, x := range calls {
				if x.ok && x.who != y.who && !x.end.After(y.start) && !y.end.After(x.start.Add(ttl)) {
					t.Errorf("%s won a call ending %v after %s won one, within the TTL of %v: two leaders",
						y.who, y.end.Sub(x.start), x.who, ttl)
					errs++
					break
				}
			}
			continue
		}
		explained := false
		for _, x := range calls {
			if x.ok && x.who != y.who && x.start.Before(y.end) && !x.end.Add(ttl).Before(y.start) {
				explained = true
				break
			}
		}
		if !explained {
			t.Errorf("%s was refused the lead while nobody else held it", y.who)
			errs++
		}
	}
}
