package server

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
)

// newOwner makes an owner of f's module.
func (f *fixture) newOwner(t *testing.T, name string) store.Owner {
	t.Helper()
	ctx := context.Background()
	tok, err := f.st.CreateOwner(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	o, err := f.st.OwnerByToken(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.PutModule(ctx, o.ID, 1<<30, f.module, []byte("\x00asm"), []string{}); err != nil {
		t.Fatal(err)
	}
	return o
}

// Owners share this replica's slots: an owner who submits a small
// workflow behind another owner's backlog gets the next free slots, as
// many as the owner ahead runs, rather than waiting until the backlog has
// all been dispatched. Each round's slots go to the owner with the fewest
// attempts running, so the counts by owner follow the turns.
func TestOwnersShareTheSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submitMany(t, 200) // the first owner's backlog, ahead in the queue
	second := f.newOwner(t, "second")
	var small []store.NewTask
	for i := range 5 {
		small = append(small, store.NewTask{Name: fmt.Sprintf("s%d", i), Module: f.module, MaxAttempts: 1, TimeoutMS: 1000,
			MemoryPages: 16, OutputBytes: 1 << 20, LogBytes: 1 << 10})
	}
	id, err := f.st.CreateWorkflow(ctx, second.ID, &store.NewWorkflow{Name: "small", Priority: "batch", Tasks: small})
	if err != nil {
		t.Fatal(err)
	}
	s := New(f.st, Config{Replica: "r", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	first := f.owner.ID
	// Each round, a worker of 4 slots comes; nothing finishes.
	for i, want := range []map[int64]int{
		{first: 2, second.ID: 2}, // turns 1 and 2 of each
		{first: 4, second.ID: 4},
		{first: 7, second.ID: 5}, // the second owner's last, then the backlog
		{first: 11, second.ID: 5},
	} {
		w := f.worker.ID
		if i > 0 {
			reg, err := f.st.RegisterWorker(ctx, store.WorkerHello{Kind: "headless", Slots: 4}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			w = reg.ID
		}
		socketless(s, w, 4)
		if n, _, _, err := s.disp.assign(ctx, s.hub.reserve(1000)); err != nil || n != 4 {
			t.Fatalf("round %d: claimed %d, err %v; want 4", i, n, err)
		}
		if got := s.hub.runningByOwner(); !maps.Equal(got, want) {
			t.Errorf("round %d: attempts running by owner %v, want %v", i, got, want)
		}
	}
	// As the database has it.
	st, err := f.st.Status(ctx, second.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range st.Tasks {
		if task.State != store.StateRunning {
			t.Errorf("the second owner's task %s is %s, want running", task.Name, task.State)
		}
	}
}

// An owner far past its turn (it runs many attempts here) still gets the
// slots another owner's few tasks leave idle, in the same dispatch run:
// once the other's are claimed, the next read reaches its tasks. Before,
// the slots waited for the next wake-up or poll (a minute here).
func TestSlotsLeftByAFewTasksGoToTheBusyOwnerAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	f.submitMany(t, 100)
	second := f.newOwner(t, "second")
	one := store.NewTask{Name: "one", Module: f.module, MaxAttempts: 1, TimeoutMS: 1000, MemoryPages: 16, OutputBytes: 1 << 20, LogBytes: 1 << 10}
	if _, err := f.st.CreateWorkflow(ctx, second.ID, &store.NewWorkflow{Name: "one", Priority: "batch", Tasks: []store.NewTask{one}}); err != nil {
		t.Fatal(err)
	}
	s := New(f.st, Config{Replica: "r", Lease: time.Minute, Poll: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	// The first owner runs 5,000 attempts on this replica (a worker whose
	// slots they all fill).
	reg, err := f.st.RegisterWorker(ctx, store.WorkerHello{Kind: "headless", Slots: 5000}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	full := socketless(s, reg.ID, 5000)
	held := make([]protocol.Assign, 5000)
	owners := make([]int64, 5000)
	for i := range held {
		held[i], owners[i] = protocol.Assign{Attempt: int64(1_000_000 + i), Module: f.module}, f.owner.ID
	}
	s.hub.setFree(full, 0)
	if _, ok := s.hub.started(full, held, owners); !ok {
		t.Fatal("started refused")
	}
	socketless(s, f.worker.ID, 4)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.disp.run(rctx)
	s.disp.wake()
	deadline := time.Now().Add(30 * time.Second) // bounds the test, claims nothing
	for s.hub.runningByOwner()[f.owner.ID] < 5003 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.hub.runningByOwner(); got[second.ID] != 1 || got[f.owner.ID] != 5003 {
		t.Errorf("attempts running by owner %v, want the second owner's task and 3 of the first's beside its 5,000", got)
	}
}

// A worker that reconnects with its attempts running (a replica died, its
// network came back) has them counted for their owners again, over a real
// WebSocket: before, the attempts its hello listed counted for nobody until
// they ended, and their owner got more than its share of the slots
// meanwhile.
func TestKeptAttemptsCountForTheirOwners(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s, url := runServer(t, f)
	hello := &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 2}
	w := dialGateWorkerWith(t, s, url, hello)
	welcome := w.welcome
	if _, err := s.submit(context.Background(), f.owner.ID, f.oneTask()); err != nil {
		t.Fatal(err)
	}
	attempt := w.next(protocol.TypeAssign).Assign[0].Attempt
	want := map[int64]int{f.owner.ID: 1}
	if got := s.hub.runningByOwner(); !maps.Equal(got, want) {
		t.Fatalf("attempts running by owner %v, want %v", got, want)
	}
	w.ws.Close()
	for slices.Contains(s.hub.ids(), welcome.WorkerID) { // its read loop ends
		time.Sleep(time.Millisecond)
	}
	if got := s.hub.runningByOwner(); len(got) != 0 {
		t.Fatalf("attempts running by owner %v with the worker gone, want none", got)
	}
	// It comes back holding its attempt (its lease still runs).
	dialGateWorkerWith(t, s, url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 2,
		WorkerID: welcome.WorkerID, ReconnectToken: welcome.ReconnectToken, Running: []int64{attempt}})
	if got := s.hub.runningByOwner(); !maps.Equal(got, want) {
		t.Errorf("attempts running by owner %v after the reconnection, want %v", got, want)
	}
}
