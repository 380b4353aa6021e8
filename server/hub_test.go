package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
)

// A worker that has said nothing for longer than the hub's silent limit
// (a frozen tab whose socket is still open) gets no work until it speaks
// again, however much free room it announced.
func TestReserveSkipsSilentWorkers(t *testing.T) {
	t.Parallel()
	h := newHub(time.Second, time.Second)
	quiet := &conn{id: "quiet", free: 5, running: map[int64]heldAttempt{}}
	quiet.heard.Store(time.Now().Add(-2 * time.Second).UnixNano())
	live := &conn{id: "live", free: 2, running: map[int64]heldAttempt{}}
	live.heard.Store(time.Now().UnixNano())
	h.add(quiet)
	h.add(live)

	slots := h.reserve(10)
	if len(slots) != 2 || slots[0] != live || slots[1] != live {
		t.Fatalf("reserved %d slots (%v): want the live worker's 2 only", len(slots), ids(slots))
	}
	h.release(slots)

	if !h.heardFrom(quiet) {
		t.Fatal("heardFrom: the quiet worker was not reported as silent until now")
	}
	if h.heardFrom(quiet) {
		t.Fatal("heardFrom: a worker heard a moment ago reported as silent")
	}
	if slots := h.reserve(10); len(slots) != 7 {
		t.Fatalf("reserved %d slots (%v) once the quiet worker spoke: want 7", len(slots), ids(slots))
	}
}

func ids(cs []*conn) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.id
	}
	return out
}

// Attempts travel several to an assign frame, within the frame's bounds.
func TestAssignFrames(t *testing.T) {
	t.Parallel()
	sizes := func(fs [][]protocol.Assign) []int {
		out := make([]int, len(fs))
		for i, f := range fs {
			out[i] = len(f)
		}
		return out
	}
	small := make([]protocol.Assign, 150)
	if got := sizes(assignFrames(small, protocol.DefaultMaxFrameBytes)); !slices.Equal(got, []int{64, 64, 22}) {
		t.Errorf("150 small attempts in frames of %v", got)
	}
	big := make([]protocol.Assign, 3)
	for i := range big {
		big[i].Stdin.Data = make([]byte, 40<<20)
	}
	if got := sizes(assignFrames(big, protocol.DefaultMaxFrameBytes)); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("3 attempts of 40 MiB in frames of %v", got)
	}
	long := make([]protocol.Assign, 4)
	for i := range long {
		long[i].Args = []string{strings.Repeat("x", 100<<10)}
	}
	if got := sizes(assignFrames(long, protocol.DefaultMaxFrameBytes)); !slices.Equal(got, []int{1, 1, 1, 1}) {
		t.Errorf("4 attempts with 100 KiB of args in frames of %v", got)
	}
	if got := assignFrames(nil, protocol.DefaultMaxFrameBytes); len(got) != 0 {
		t.Errorf("no attempts in %d frames", len(got))
	}
}

// A heartbeat's queue changes the room of a worker: more room is free at
// once; less takes back only room that is free, the rest as attempts end.
func TestSetQueue(t *testing.T) {
	t.Parallel()
	h := newHub(time.Minute, time.Minute)
	c := &conn{id: "w", threads: 2, slots: 10, free: 10, running: map[int64]heldAttempt{}, operator: true}
	c.heard.Store(time.Now().UnixNano())
	h.add(c)
	if !h.setQueue(c, 64) || c.slots != 66 || c.free != 66 {
		t.Fatalf("grown to a queue of 64: slots %d, free %d; want 66, 66", c.slots, c.free)
	}
	slots := h.reserve(100)
	if len(slots) != 66 {
		t.Fatalf("reserved %d, want 66", len(slots))
	}
	if _, ok := h.started(c, []protocol.Assign{{Attempt: 1}, {Attempt: 2}, {Attempt: 3}}, []int64{0, 0, 0}); !ok {
		t.Fatal("started refused")
	}
	h.release(slots[3:])
	if h.setQueue(c, 0) || c.slots != 2 || c.free != -1 {
		t.Fatalf("shrunk to no queue with 3 attempts held: slots %d, free %d; want 2, -1", c.slots, c.free)
	}
	if len(h.reserve(100)) != 0 {
		t.Fatal("reserved room of a worker over its new size")
	}
	for _, a := range []int64{1, 2} {
		h.finished(c, a)
	}
	if slots := h.reserve(100); len(slots) != 1 {
		t.Fatalf("reserved %d once two of three ended, want 1", len(slots))
	}
}

// How many attempts a connection may hold: a new volunteer one until its
// first result, a volunteer with a short record whose latest reports were
// all failures one, a
// volunteer whose strikes outnumber its results none; the operator's
// workers all their slots.
func TestAllowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		c    *conn
		want int
	}{
		{"a new volunteer", &conn{slots: 8}, 1},
		{"a volunteer with a result on this connection", &conn{slots: 8, tasksDone: 1}, 8},
		{"a volunteer with results on record", &conn{slots: 8, record: store.WorkerRecord{Succeeded: 5}}, 8},
		{"failures in a row", &conn{slots: 8, tasksDone: 9, failStreak: failStreakFewer}, 1},
		{"failures in a row of a worker with a record", &conn{slots: 8, tasksDone: failStreakRecord, failStreak: 50}, 8},
		{"strikes outnumbering results", &conn{slots: 8, record: store.WorkerRecord{Succeeded: 4, Strikes: 7}}, 0},
		{"the operator's worker, new and failing", &conn{slots: 8, operator: true, failStreak: 50}, 8},
	} {
		if got := tc.c.allowed(); got != tc.want {
			t.Errorf("%s: allowed %d, want %d", tc.name, got, tc.want)
		}
	}
}

// A dispatch round walks only the connections that may have room: a
// paused worker, or one whose slots are all taken, leaves the hub's open
// set when a round meets it, and comes back as soon as it resumes or an
// attempt of its ends, so that thousands of paused or busy volunteers cost
// a round nothing and none is forgotten.
func TestReserveWalksOnlyWorkersWithRoom(t *testing.T) {
	t.Parallel()
	h := newHub(time.Minute, time.Minute)
	now := time.Now().UnixNano()
	paused := &conn{id: "paused", free: 1, slots: 1, operator: true, paused: true, running: map[int64]heldAttempt{}}
	busy := &conn{id: "busy", free: 1, slots: 1, operator: true, running: map[int64]heldAttempt{}}
	for _, c := range []*conn{paused, busy} {
		c.heard.Store(now)
		h.add(c)
	}
	if got := ids(h.reserve(10)); !slices.Equal(got, []string{"busy"}) {
		t.Fatalf("reserved %v, want busy's one slot", got)
	}
	if _, ok := h.started(busy, []protocol.Assign{{Attempt: 7, Module: "m"}}, []int64{0}); !ok {
		t.Fatal("started: busy is no longer connected")
	}
	if got := h.reserve(10); len(got) != 0 {
		t.Fatalf("reserved %v with no free slot", ids(got))
	}
	if len(h.open) != 0 {
		t.Fatalf("the open set still holds %d connections without room", len(h.open))
	}
	h.heartbeat(paused, time.Now(), &protocol.Heartbeat{Device: &protocol.Device{}}, time.Second, time.Second)
	h.finished(busy, 7)
	got := ids(h.reserve(10))
	slices.Sort(got)
	if !slices.Equal(got, []string{"busy", "paused"}) {
		t.Fatalf("reserved %v once one resumed and the other's attempt ended, want both", got)
	}
	h.remove(busy)
	h.release(h.reserve(10))
	if _, ok := h.open[busy]; ok {
		t.Fatal("a connection that left is still in the open set")
	}
}

// setFree gives c n free slots, as attempts ending would: for tests that
// drive the dispatcher by hand.
func (h *hub) setFree(c *conn, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c.free = n
	h.openedLocked(c)
}

// freeOf returns c's free slots.
func (h *hub) freeOf(c *conn) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return c.free
}

// A volunteer that hands back attempts faster than its budget (a broken
// runner that fails every attempt before it starts, or a hostile worker)
// gets no new work until its hold ends, even through a new connection; the
// holds in a row double, and an accepted result resets them. What a paused
// worker hands back costs one from the budget, however many attempts; what
// the connection does not hold costs nothing. The operator's workers are
// not held.
func TestHandBacksPastTheBudgetHoldTheWorker(t *testing.T) {
	t.Parallel()
	h := newHub(time.Minute, time.Minute)
	now := time.Now()
	newConn := func(id string, operator, paused bool) *conn {
		c := &conn{id: id, free: 1000, slots: 1000, operator: operator, paused: paused, tasksDone: 100, running: map[int64]heldAttempt{}}
		c.heard.Store(now.UnixNano())
		h.add(c)
		return c
	}
	var held []int64 // attempts every connection holds (they are never freed here)
	for a := range int64(600) {
		held = append(held, a+1)
	}
	vol, op, pauser := newConn("volunteer", false, false), newConn("operator", true, false), newConn("pauser", false, true)
	for _, c := range []*conn{vol, op, pauser} {
		for _, a := range held {
			c.running[a] = heldAttempt{module: "m"}
		}
	}
	tests := []struct {
		name string
		c    *conn
		back []int64
		at   time.Duration // after now
		hold time.Duration
	}{
		{"attempts it does not hold", vol, []int64{10_000, 10_001}, 0, 0},
		{"within the budget", vol, held[:handBackBurst], 0, 0},
		{"one past it", vol, held[:1], 0, handBackHold},
		{"more while held", vol, held[:3], 0, 0},
		{"the operator's, far past it", op, held, 0, 0},
		{"a paused worker's, a budget's worth of times", pauser, held, 0, 0},
		{"a paused worker's, once more", pauser, held, 0, handBackHold},
	}
	for _, tc := range tests {
		n := 1
		if strings.Contains(tc.name, "a budget's worth") {
			n = handBackBurst
		}
		for i := range n {
			if got := h.handedBack(tc.c, tc.back, now.Add(tc.at)); got != tc.hold {
				t.Fatalf("%s (%d): held for %v, want %v", tc.name, i, got, tc.hold)
			}
		}
	}
	pauser.paused = false
	h.openedLocked(pauser)
	if got := ids(h.reserve(1)); !slices.Equal(got, []string{"operator"}) {
		t.Fatalf("reserved %v while the volunteers are held, want the operator's slot", got)
	}

	// A new connection of the held identity is held too.
	h.remove(vol)
	vol = newConn("volunteer", false, false)
	for _, a := range held {
		vol.running[a] = heldAttempt{module: "m"}
	}
	if got := ids(h.reserve(2)); !slices.Equal(got, []string{"operator", "operator"}) {
		t.Fatalf("reserved %v with the held volunteer reconnected, want the operator's slots", got)
	}
	h.endHolds()
	if got := ids(h.reserve(3)); !slices.Contains(got, "volunteer") {
		t.Fatalf("reserved %v once the hold ended, want a slot of the volunteer's", got)
	}
	// Its next hold is twice as long; after an accepted result, as short as
	// the first again.
	if got := h.handedBack(vol, held[:1], now.Add(time.Second)); got != 2*handBackHold {
		t.Fatalf("second hold in a row: %v, want %v", got, 2*handBackHold)
	}
	h.endHolds()
	h.succeeded(vol)
	if got := h.handedBack(vol, held[:1], now.Add(2*time.Second)); got != handBackHold {
		t.Fatalf("a hold after an accepted result: %v, want %v", got, handBackHold)
	}
	h.endHolds()
	// The budget comes back, one every handBackEvery.
	later := now.Add(2*time.Second + handBackEvery)
	if got := h.handedBack(vol, held[:1], later); got != 0 {
		t.Fatalf("held for %v with a hand-back earned back", got)
	}
}

// endHolds ends every identity's hold, as time would.
func (h *hub) endHolds() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, hb := range h.handBacks {
		hb.until = time.Time{}
	}
	for _, c := range h.conns {
		c.heldUntil = time.Time{}
		h.openedLocked(c)
	}
}

// A worker that is paused and holds nothing heartbeats at the idle
// interval: its silence is measured against that, so its heartbeats do
// not count as a return from silence (which wakes the dispatcher), and
// the sample it leaves names the idle interval for the jitter test.
func TestIdleWorkersAreHeardAgainstTheIdleInterval(t *testing.T) {
	h := newHub(time.Second, 2*time.Minute)
	c := &conn{id: "w", slots: 1, free: 1, running: map[int64]heldAttempt{}}
	h.add(c)
	silentFor := func(d time.Duration) { c.heard.Store(time.Now().Add(-d).UnixNano()) }
	paused := &protocol.Device{Paused: true}
	cases := []struct {
		name      string
		hb        *protocol.Heartbeat
		idle      bool
		wakesNext bool // a frame after a minute of silence counts as a return
	}{
		{"paused, holding nothing", &protocol.Heartbeat{Device: paused}, true, false},
		{"paused, holding an attempt", &protocol.Heartbeat{Device: paused, Running: []protocol.Progress{{Attempt: 1}}}, false, true},
		{"not paused", &protocol.Heartbeat{Device: &protocol.Device{}}, false, true},
		{"no device", &protocol.Heartbeat{}, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h.heartbeat(c, time.Now(), tc.hb, time.Second, 4*time.Second)
			if c.idle.Load() != tc.idle {
				t.Fatalf("idle %v, want %v", c.idle.Load(), tc.idle)
			}
			want := time.Second
			if tc.idle {
				want = 4 * time.Second
			}
			if got := c.samples[len(c.samples)-1].Every; got != want {
				t.Fatalf("the sample names %v, want %v", got, want)
			}
			silentFor(time.Minute)
			if got := h.heardFrom(c); got != tc.wakesNext {
				t.Fatalf("heard after a minute's silence: returned from silence %v, want %v", got, tc.wakesNext)
			}
		})
	}
}

// The attempts running by owner (the queue's fair share) follow every way
// an attempt leaves a connection: it finishes, its outcome arrives, it is
// cancelled with its slot freed, or its connection goes; a connection
// gone no longer counts even if its read loop still ends an attempt.
func TestRunningByOwnerFollowsTheAttempts(t *testing.T) {
	t.Parallel()
	h := newHub(time.Minute, time.Minute)
	newConn := func(id string) *conn {
		gone := make(chan struct{}) // frames sent to it are dropped
		close(gone)
		c := &conn{id: id, threads: 8, slots: 8, free: 8, running: map[int64]heldAttempt{}, operator: true, done: gone}
		c.heard.Store(time.Now().UnixNano())
		h.add(c)
		return c
	}
	c, d := newConn("c"), newConn("d")
	_, okC := h.started(c, []protocol.Assign{{Attempt: 1}, {Attempt: 2}, {Attempt: 3}, {Attempt: 4}, {Attempt: 5}}, []int64{7, 7, 7, 8, 0})
	_, okD := h.started(d, []protocol.Assign{{Attempt: 6}, {Attempt: 7}}, []int64{7, 8})
	if !okC || !okD {
		t.Fatal("started refused")
	}
	check := func(step string, want map[int64]int) {
		t.Helper()
		if got := h.runningByOwner(); !maps.Equal(got, want) {
			t.Errorf("%s: %v, want %v", step, got, want)
		}
	}
	check("started", map[int64]int{7: 4, 8: 2})
	h.finished(c, 1)
	h.finished(c, 1) // again: no change
	check("one finished", map[int64]int{7: 3, 8: 2})
	if ok, _, _ := h.takeOutcome(c, 4, &payloadHold{}); !ok {
		t.Fatal("outcome refused")
	}
	check("an outcome arrived", map[int64]int{7: 3, 8: 1})
	h.cancel([]int64{2}, "test", true)
	check("cancelled", map[int64]int{7: 2, 8: 1})
	h.remove(d)
	check("a connection gone", map[int64]int{7: 1})
	h.finished(d, 6)
	check("the gone connection's attempt ended", map[int64]int{7: 1})
	h.finished(c, 3)
	check("all ended", map[int64]int{})
}

// A worker gets its attempts in id order: started records none older than
// an attempt the connection holds (recorded before, or earlier in the same
// call), and names those it left out; an attempt recorded again is not
// older than itself.
func TestStartedKeepsAttemptsInIDOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		held     []int64
		reported bool // the outcome of held[0] arrived, not committed yet
		as       []int64
		stale    []int
	}{
		{"nothing held", nil, false, []int64{3, 4}, nil},
		{"newer than held", []int64{2}, false, []int64{3, 4}, nil},
		{"older than held", []int64{5}, false, []int64{3, 6, 7}, []int{0}},
		{"all older", []int64{9}, false, []int64{3, 4}, []int{0, 1}},
		{"again", []int64{5}, false, []int64{5}, nil},
		{"older than an outcome not committed", []int64{8}, true, []int64{6, 9}, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(time.Minute, time.Minute)
			c := &conn{id: "w", threads: 4, slots: 8, free: 8, running: map[int64]heldAttempt{}}
			c.heard.Store(time.Now().UnixNano())
			h.add(c)
			assigns := func(ids []int64) ([]protocol.Assign, []int64) {
				as := make([]protocol.Assign, len(ids))
				for i, id := range ids {
					as[i].Attempt = id
				}
				return as, make([]int64, len(ids))
			}
			if len(tc.held) > 0 {
				as, owners := assigns(tc.held)
				if _, ok := h.started(c, as, owners); !ok {
					t.Fatal("started refused the held attempts")
				}
			}
			if tc.reported {
				// Its outcome arrived: out of c.running, not committed.
				if ok, _, _ := h.takeOutcome(c, tc.held[0], &payloadHold{}); !ok {
					t.Fatal("outcome refused")
				}
			}
			as, owners := assigns(tc.as)
			stale, ok := h.started(c, as, owners)
			if !ok {
				t.Fatal("started refused")
			}
			if !slices.Equal(stale, tc.stale) {
				t.Errorf("stale %v, want %v", stale, tc.stale)
			}
			for i, id := range tc.as {
				_, recorded := c.running[id]
				if want := !slices.Contains(tc.stale, i) || slices.Contains(tc.held, id); recorded != want {
					t.Errorf("attempt %d recorded: %v, want %v", id, recorded, want)
				}
			}
		})
	}
}

// remove splits the attempts of a worker's connection that ended into
// those that waited in its queue and its threads oldest, which may have
// run; a connection the worker has replaced already gives neither.
func TestRemoveSplitsQueuedFromMayHaveRun(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                   string
		threads                int
		held                   []int64
		replaced               bool
		wantQueued, wantMayRun []int64
	}{
		{name: "queue beyond the threads", threads: 2, held: []int64{9, 3, 7, 5}, wantQueued: []int64{7, 9}, wantMayRun: []int64{3, 5}},
		{name: "fewer than the threads", threads: 2, held: []int64{4}, wantMayRun: []int64{4}},
		{name: "nothing held", threads: 1},
		{name: "replaced by a newer connection", threads: 1, held: []int64{1, 2}, replaced: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(time.Minute, time.Minute)
			c := &conn{id: "w", threads: tc.threads, slots: tc.threads, operator: true, running: map[int64]heldAttempt{}}
			for _, a := range tc.held {
				c.running[a] = heldAttempt{}
			}
			h.add(c)
			if tc.replaced { // as add does when the worker reconnects (without a socket to close here)
				h.mu.Lock()
				h.dropLocked(c)
				h.conns[c.id] = &conn{id: "w", threads: 1, slots: 1, operator: true, running: map[int64]heldAttempt{}}
				h.mu.Unlock()
			}
			queued, mayRun := h.remove(c)
			if len(queued) != len(tc.wantQueued) || len(queued) > 0 && !slices.Equal(queued, tc.wantQueued) {
				t.Errorf("queued %v, want %v", queued, tc.wantQueued)
			}
			if len(mayRun) != len(tc.wantMayRun) || len(mayRun) > 0 && !slices.Equal(mayRun, tc.wantMayRun) {
				t.Errorf("may have run %v, want %v", mayRun, tc.wantMayRun)
			}
		})
	}
}

// dropQueued takes back the queued attempts of a worker silent for longer
// than the hub's limit, once: not those of a worker heard from, or idle, or
// holding no more than its threads.
func TestDropQueuedTakesBackASilentWorkersQueue(t *testing.T) {
	t.Parallel()
	const silent = time.Second
	now := time.Now().UnixNano()
	for _, tc := range []struct {
		name    string
		threads int
		held    []int64
		heard   time.Duration // the last frame, before now
		idle    bool
		want    []int64
	}{
		{name: "silent with a queue", threads: 1, held: []int64{4, 2, 3}, heard: 2 * silent, want: []int64{3, 4}},
		{name: "heard from", threads: 1, held: []int64{4, 2, 3}, heard: silent / 2},
		{name: "idle", threads: 1, held: []int64{4, 2, 3}, heard: 2 * silent, idle: true},
		{name: "no queue", threads: 2, held: []int64{7, 8}, heard: 2 * silent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHub(silent, time.Minute)
			gone := make(chan struct{})
			close(gone) // frames sent to it are dropped
			c := &conn{id: "w", threads: tc.threads, slots: tc.threads + 2, done: gone, log: slog.New(slog.DiscardHandler),
				operator: true, running: map[int64]heldAttempt{}}
			for _, a := range tc.held {
				c.running[a] = heldAttempt{owner: 1}
			}
			c.waiting.Store(now - int64(tc.heard)) // the read loop waits for a frame since
			c.idle.Store(tc.idle)
			h.add(c)
			got := h.dropQueued(c, now)
			if !slices.Equal(got, tc.want) {
				t.Errorf("dropQueued returned %v, want %v", got, tc.want)
			}
			if again := h.dropQueued(c, now); len(again) != 0 {
				t.Errorf("dropQueued returned %v again", again)
			}
			if len(c.running) != len(tc.held) {
				t.Errorf("the connection holds %d attempts, want all %d until the worker reports them", len(c.running), len(tc.held))
			}
			if n := h.runningByOwner()[1]; n != len(tc.held)-len(tc.want) {
				t.Errorf("%d attempts count for their owner, want %d", n, len(tc.held)-len(tc.want))
			}
			for _, a := range tc.want {
				if ok, _ := h.renews(c, a); ok {
					t.Errorf("attempt %d, taken back, is renewed by a heartbeat", a)
				}
			}
			if unstarted, mayRun := h.remove(c); len(unstarted)+len(mayRun) != len(tc.held)-len(tc.want) {
				t.Errorf("the connection's end ranks %v and %v, want those taken back left out", unstarted, mayRun)
			}

		})
	}
}

// Only the worker's side closing the connection cuts the leases of what it
// may have been running; a close of the replica's own does not.
func TestPeerClosed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"close frame", &websocket.CloseError{Code: websocket.CloseGoingAway}, true},
		{"end without a close frame", &websocket.CloseError{Code: websocket.CloseAbnormalClosure, Text: io.ErrUnexpectedEOF.Error()}, true},
		{"EOF", fmt.Errorf("read header: %w", io.EOF), true},
		{"reset", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"closed here", &net.OpError{Op: "read", Err: net.ErrClosed}, false},
		{"protocol error", protocolError{errors.New("bad frame")}, false},
		{"shutdown", context.Canceled, false},
		{"none", nil, false},
	} {
		if got := peerClosed(tc.err); got != tc.want {
			t.Errorf("%s: peerClosed(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
