package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// The queue is read fairly between owners: each owner's k-th ready task
// (in its own order) comes at turn running[owner] + k, tasks go by turn
// and then by age, and an owner whose running attempts put all its tasks
// past the window is not read at all. The first owner's backlog is large
// (written by COPY), the others' small (one statement); the third's last
// workflow is interactive: its tasks come first among its own, and win
// ties of turn (their sort key has the head start).
func TestCandidatesShareTheQueueBetweenOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	owners := map[string]int64{"a": f.owner}
	for _, name := range []string{"b", "c"} {
		owners[name] = f.newOwner(t, name)
	}
	submit := func(owner, prefix, priority string, n int) {
		w := NewWorkflow{Name: prefix, Priority: priority}
		for i := range n {
			w.Tasks = append(w.Tasks, f.task(fmt.Sprintf("%s%03d", prefix, i)))
		}
		if _, err := f.s.CreateWorkflow(ctx, owners[owner], &w); err != nil {
			t.Fatal(err)
		}
	}
	submit("a", "a", "batch", smallWorkflow+36) // 100 tasks
	submit("b", "b", "batch", 5)
	submit("c", "c", "batch", 5)
	submit("c", "i", "interactive", 2)
	for _, tc := range []struct {
		name    string
		running map[string]int
		limit   int
		want    string // the candidates' names (their first letters name their owners), or how many
		more    bool
	}{
		{"none running", nil, 9, "i000 a000 b000 i001 a001 b001 a002 b002 c000", true},
		{"the backlog's owner runs 3", map[string]int{"a": 3}, 8, "i000 b000 i001 b001 b002 c000 a000 b003", true},
		{"one runs 100", map[string]int{"a": 1, "b": 100}, 5, "i000 i001 a000 a001 c000", true},
		{"an owner not in the queue", map[string]int{"z": 7}, 3, "i000 a000 b000", true},
		// Turn 10 gives 10 + 5 + 7 tasks, short of the window while the
		// first owner has more: the turns are counted again for more.
		{"owners with few tasks", nil, 30, "i000 a000 b000 i001 a001 b001 a002 b002 c000 a003 b003 c001 a004 b004 c002 a005 c003 a006 c004 " +
			"a007 a008 a009 a010 a011 a012 a013 a014 a015 a016 a017", true},
		{"the whole queue", nil, 400, "112", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			running := map[int64]int{}
			for o, n := range tc.running {
				id, ok := owners[o]
				if !ok {
					id = 1 << 40
				}
				running[id] = n
			}
			cs, more, err := f.s.Candidates(ctx, tc.limit, running)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range cs {
				got = append(got, c.Name)
				if want := owners[c.Name[:1]]; c.Name[0] == 'i' && c.Owner != owners["c"] || c.Name[0] != 'i' && c.Owner != want {
					t.Errorf("%s: owner %d, want its workflow's", c.Name, c.Owner)
				}
			}
			if g := strings.Join(got, " "); g != tc.want && fmt.Sprint(len(got)) != tc.want {
				t.Errorf("candidates %s, want %s", g, tc.want)
			}
			if more != tc.more {
				t.Errorf("more %v, want %v", more, tc.more)
			}
		})
	}
	// A claim says whose its attempts are.
	cs, _, err := f.s.Candidates(ctx, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	var picks []Pick
	for _, c := range cs {
		picks = append(picks, Pick{TaskID: c.TaskID, Worker: f.worker})
	}
	claimed, err := f.s.ClaimPicks(ctx, picks, time.Minute)
	if err != nil || len(claimed) != 3 {
		t.Fatalf("claimed %d, err %v", len(claimed), err)
	}
	var got []int64
	for _, c := range claimed {
		got = append(got, c.Owner)
	}
	slices.Sort(got)
	if want := []int64{owners["a"], owners["b"], owners["c"]}; !slices.Equal(got, want) {
		t.Errorf("claimed attempts of owners %v, want %v", got, want)
	}
}

// newOwner makes an owner of f's module, for the tests of fair sharing.
func (f *fixture) newOwner(t *testing.T, name string) int64 {
	t.Helper()
	o := f.otherOwner(t, name)
	if _, _, err := f.s.PutModule(context.Background(), o, 1<<30, f.module, []byte("\x00asm"), []string{}); err != nil {
		t.Fatal(err)
	}
	return o
}

// An owner whose running attempts put its first ready task past the turn
// the window ends at gives no candidate; the read must still say that
// ready tasks may follow (more), or the dispatcher leaves its idle slots
// idle until its next poll while that owner's backlog waits: here the
// other owner's single task is all that is read.
func TestCandidatesSayMoreForAnOwnerPastTheTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	b := f.newOwner(t, "b")
	var big NewWorkflow
	for i := range 20 {
		big.Tasks = append(big.Tasks, f.task(fmt.Sprintf("a%03d", i)))
	}
	big.Name, big.Priority = "a", "batch"
	if _, err := f.s.CreateWorkflow(ctx, f.owner, &big); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CreateWorkflow(ctx, b, &NewWorkflow{Name: "b", Priority: "batch", Tasks: []NewTask{f.task("b000")}}); err != nil {
		t.Fatal(err)
	}
	cs, more, err := f.s.Candidates(ctx, 5, map[int64]int{f.owner: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) == 0 || cs[0].Name != "b000" {
		t.Fatalf("candidates %v, want b000 first", cs)
	}
	if len(cs) < 5 && !more {
		t.Errorf("%d candidates and more false, while the first owner has 20 ready tasks", len(cs))
	}
}

// Past MaxQueueOwners owners with ready tasks, those of the highest ids are
// not read: the read must say that ready tasks may follow.
func TestCandidatesSayMorePastMaxQueueOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	for i := range MaxQueueOwners + 1 {
		o := f.owner
		if i > 0 {
			o = f.newOwner(t, fmt.Sprintf("o%d", i))
		}
		if _, err := f.s.CreateWorkflow(ctx, o, &NewWorkflow{Name: "w", Priority: "batch", Tasks: []NewTask{f.task("t")}}); err != nil {
			t.Fatal(err)
		}
	}
	cs, more, err := f.s.Candidates(ctx, 2*MaxQueueOwners, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) < MaxQueueOwners+1 && !more {
		t.Errorf("%d candidates of %d ready tasks, and more false", len(cs), MaxQueueOwners+1)
	}
}

// The queue's read takes each owner's tasks from tasks_ready in order, as
// many as its window needs, with statistics that lag a large submission
// (analyzed when the queue was empty). With them, PostgreSQL read all of
// the owner's 5,000 ready tasks by a bitmap scan and sorted them to give
// the first 100, unless bitmap scans are off (candidatesNoBitmapSQL).
func TestCandidatesReadInProportionToTheirWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := staleQueue(t, 5000)
	const window = 100
	tx, err := f.s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, sql := range append([]string{hotPathSettingsSQL}, candidatesSettings...) { // as Candidates runs it
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	var plan []struct{ Plan planNode }
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+candidatesSQL,
		[]int64{}, []int32{}, MaxQueueOwners, window).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	if got := plan[0].Plan.ActualRows; got != window {
		t.Fatalf("read %v tasks, want %d", got, window)
	}
	plan[0].Plan.walk(func(n *planNode) {
		if rows := (n.ActualRows + n.Removed) * n.ActualLoops; rows > 2*window {
			t.Errorf("%s%s returned %v rows over %v loops for a window of %d", n.NodeType, n.on(), n.ActualRows, n.ActualLoops, window)
		}
	})
}

// The turns do not depend on the order the statement gives each owner's
// tasks in: counted again from the queue's order when it is not that.
func TestTurnsCountedInTheQueuesOrder(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	task := func(owner, id int64, sec int) Candidate {
		return Candidate{Owner: owner, TaskID: id, ReadySince: at.Add(time.Duration(sec) * time.Second)}
	}
	// Owner 1 runs 1 attempt, owner 2 none; owner 1's tasks out of order.
	cs := []Candidate{task(1, 12, 2), task(2, 20, 5), task(1, 10, 1), task(2, 21, 6), task(1, 11, 1)}
	turns := turnsOf(cs, map[int64]int{1: 1})
	if want := []int64{4, 1, 2, 2, 3}; !slices.Equal(turns, want) {
		t.Fatalf("turns %v, want %v", turns, want)
	}
	var got []int64
	for _, c := range byTurn(cs, turns) {
		got = append(got, c.TaskID)
	}
	if want := []int64{20, 10, 21, 11, 12}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}
