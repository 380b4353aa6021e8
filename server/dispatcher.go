package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/sched"
	"github.com/cyclepool/cyclepool/internal/store"
)

// dispatcher matches this replica's ready tasks with the free slots of its
// workers: a round whenever woken (a task became ready, a slot came free,
// a worker arrived) and at least every Config.Poll, and the submission
// shortcut (submit). It owns its state: whether its last round left ready
// tasks (readyLeft), its candidate window (widen) and cache (cands); the
// hub, the store, the metrics and the database's health are given to it.
type dispatcher struct {
	cfg     Config
	store   *store.Store
	hub     *hub
	metrics *metrics
	health  *writeHealth
	log     *slog.Logger
	rt      *runtimes // run-time statistics, shared with the server
	// blobToken is the capability of blob id in a worker's URL.
	blobToken func(ctx context.Context, id string) (string, error)

	wakeC chan struct{}
	// tasksWake says a wake-up was for tasks that became ready (wake), not
	// only for free slots (wakeSlots).
	tasksWake atomic.Bool
	// readyLeft: the last round may have left ready tasks unclaimed.
	// While it is false a small submission may claim its own ready tasks
	// for idle slots (submit) without overtaking older ones.
	readyLeft atomic.Bool
	// widen: the candidate window of the next round is 2^widen times the
	// usual (candidateWindow). Only run's goroutine uses it.
	widen int
	// shortWindow: the last round's window held fewer ready tasks than
	// its size while more were ready (other owners' tasks, past their
	// turns: store.Candidates). Only run's goroutine uses it.
	shortWindow bool
	// readyGen counts the wake-ups for tasks that became ready (wake);
	// cands are ready tasks a round read and did not claim, good while
	// readyGen has not moved.
	readyGen atomic.Uint64
	cands    candidateCache
	// needsSetup has the tasks found at delivery to read an output
	// uploaded over HTTP, which only workers with the setup feature can
	// lay out: the plan keeps them from older workers, as it does tasks
	// with files of their own (a candidate says that; it cannot say this).
	needsSetup taskSet
	// afterSend, set by tests, runs in submit between sending a
	// submission's attempts and its COMMIT; beforeStart in send, once the
	// slots are taken for attempts and before they are recorded as
	// started, with send's context.
	afterSend   func()
	beforeStart func(context.Context)
}

// taskSet is a set of task ids, safe for concurrent use, that forgets
// everything once it holds maxTaskSet (a task forgotten may go to an
// older worker once more, which hands it back).
type taskSet struct {
	mu  sync.Mutex
	ids map[int64]bool
}

const maxTaskSet = 100_000

func (s *taskSet) add(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil || len(s.ids) >= maxTaskSet {
		s.ids = map[int64]bool{}
	}
	s.ids[id] = true
}

func (s *taskSet) has(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ids[id]
}

// wake asks for a round soon: tasks may have become ready.
func (d *dispatcher) wake() {
	d.readyGen.Add(1)
	d.tasksWake.Store(true)
	d.wakeSlots()
}

// wakeSlots asks for a round soon because slots came free (an attempt
// ended, a worker arrived or resumed, a queue grew). The round is skipped
// when the last one left no ready task behind: there is nothing for the
// slots until a task becomes ready, which wakes it again (wake).
func (d *dispatcher) wakeSlots() {
	select {
	case d.wakeC <- struct{}{}:
	default:
	}
}

// run matches ready tasks with free slots of this replica's workers
// whenever woken (a task became ready, a slot came free, a worker arrived),
// and at least every Poll.
func (d *dispatcher) run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Poll)
	defer t.Stop()
	// left (readyLeft): the last round may have left ready tasks
	// unclaimed (it had fewer slots than tasks, read as many candidates as
	// it could, or could not look).
	left := true
	defer d.readyLeft.Store(true)
	for {
		d.readyLeft.Store(left)
		select {
		case <-ctx.Done():
			return
		case <-d.wakeC:
			if !d.tasksWake.Swap(false) && !left {
				d.metrics.rounds.WithLabelValues("skipped").Inc()
				continue
			}
		case <-t.C:
			d.tasksWake.Store(false)
			d.cands.drop() // the poll reads the queue anew
		}
		if failing, _ := d.health.state(); failing {
			// Claims would fail too: the round waits for the database
			// to write again (writeHealth wakes the dispatcher then).
			left = true
			continue
		}
		d.readyLeft.Store(true) // until this round has claimed what it could
		for races := 0; ctx.Err() == nil; {
			slots := d.hub.reserve(1000)
			if len(slots) == 0 {
				left = true
				break
			}
			d.metrics.rounds.WithLabelValues("run").Inc()
			widen := d.widen
			n, planned, more, err := d.assign(ctx, slots)
			if err != nil || planned > 0 {
				d.health.observe("claim", err) // a round that planned nothing wrote nothing
			}
			left = more
			if err != nil {
				left = true
				if ctx.Err() == nil {
					d.log.Log(ctx, d.health.level(err), "dispatch", "err", err)
				}
				break
			}
			if n < planned && races < 3 {
				// Another replica claimed some of the planned tasks: plan
				// again with what is left.
				races++
				continue
			}
			// Slots left idle wait for the next wake-up, unless this round
			// widened the window (a wider one may find work for them now)
			// or claimed what its short window held of some owners' tasks
			// while others' waited past their turns: with those claimed,
			// the next read reaches the others'.
			if n < len(slots) && d.widen <= widen && !(d.shortWindow && n > 0) {
				break
			}
		}
	}
}

// submit writes a workflow. When this replica's workers have idle slots
// and its dispatcher left no older ready task waiting, a small workflow's
// ready tasks are planned for those slots before it is written, claimed in
// the submission's own transaction (store.CreateWorkflowClaiming), and
// sent before that transaction starts (or before its COMMIT, for replicas
// of a task): on the path of every interactive task, that saves the
// dispatcher's wake-up and the claim's own transaction, and the workflow's
// statements and the commit's WAL flush run while the attempts travel and
// run. Their ids, drawn ahead, are newer than any the slots' workers hold
// (hub.newestAttempt).
// What the workers say of them meanwhile waits for the commit (claimGates);
// if it fails, they are taken back. Ready tasks it leaves, and those of any
// other submission, wake every replica's dispatcher by the commit's
// notification.
func (d *dispatcher) submit(ctx context.Context, ownerID int64, nw *store.NewWorkflow) (string, error) {
	var slots []*conn
	var cands []store.Candidate
	now := time.Now()
	// Not while ready tasks may wait: those the last round left, those a
	// round under way has not claimed yet, those a wake-up announced.
	if nw.Claimable() && !d.readyLeft.Load() && !d.tasksWake.Load() {
		if cands = d.store.SubmissionCandidates(ownerID, nw, now); len(cands) > 0 {
			// Two slots a replica, spread over the workers (reserve): the
			// plan has a choice, and concurrent submissions find slots too.
			pending := 0
			for _, c := range cands {
				pending += c.Pending
			}
			slots = d.hub.reserve(min(2*pending, 1000))
		}
	}
	if len(slots) == 0 {
		return d.store.CreateWorkflow(ctx, ownerID, nw)
	}
	reserved := byWorker(slots)
	picks := d.plan(now, cands, d.planWorkers(reserved), d.hub.runningByOwner())
	sp := make([]store.SubmitPick, len(picks))
	for i, p := range picks {
		sp[i] = store.SubmitPick{Task: int(p.TaskID), Worker: p.Worker, CkptMS: p.CkptMS, Solo: p.Solo}
	}
	// Not the request's context: once its claims may have committed, they
	// must reach their workers even if the owner hangs up.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	var (
		sent          []store.Claimed
		undeliverable []store.Completion
		release       func()
		sendPanic     any // what a panic in send carried
	)
	takeBack := func() {
		ids := make([]int64, len(sent))
		for i := range sent {
			ids[i] = sent[i].Attempt
		}
		d.hub.cancel(ids, "the submission that claimed it did not commit", true)
	}
	send := func(claimed []store.Claimed) {
		workers := make([]string, 0, len(reserved))
		for w := range reserved {
			workers = append(workers, w)
		}
		release = d.hub.gates.hold(workers) // before any attempt can reach its worker
		sent = claimed
		defer func() {
			// The COMMIT is on its way already: a panic let through
			// would leave it to commit attempts taken back from their
			// workers. Caught, the store reads its answer.
			if r := recover(); r != nil {
				sendPanic = r
				d.log.Error("sending a submission's attempts", "panic", r, "stack", string(debug.Stack()))
			}
		}()
		undeliverable = d.send(cctx, claimed, nil, reserved)
		if d.afterSend != nil {
			d.afterSend()
		}
	}
	settled := false
	defer func() {
		if release != nil && !settled { // a panic: the gate must not stay shut
			takeBack()
			release()
		}
	}()
	id, claimed, err := d.store.CreateWorkflowClaiming(cctx, ownerID, nw, sp, d.cfg.Lease, d.hub.newestAttempt(reserved), send)
	settled = true
	if release != nil && err == nil && claimed != nil && len(sent) > len(claimed) {
		// Sent before the claim ran, and refused by it (the store's
		// claim of a fresh task refuses none; in case it ever does):
		// those attempts do not exist, and are taken back.
		sent, undeliverable = notClaimed(sent, undeliverable, claimed)
		takeBack()
	}
	if release != nil && err == nil && claimed != nil && sendPanic != nil {
		// Committed, but some attempts may not have reached their
		// workers: all are ended without counting against anyone, and
		// taken back. Their tasks are ready again.
		ends := make([]store.Completion, len(claimed))
		for i, c := range claimed {
			ends[i] = store.Completion{Attempt: c.Attempt, Worker: c.Worker, Reason: protocol.ReasonWorker, End: store.EndUnstarted,
				Message: "the server failed while sending it: taken back"}
		}
		d.endUndeliverable(cctx, ends)
		claimed = nil
	}
	if release != nil {
		if err != nil || claimed == nil {
			// Not committed, or committed and its attempts ended since
			// (store.CreateWorkflowClaiming): none of them holds a lease.
			takeBack()
			undeliverable = nil // no attempt to end
		}
		release()
	}
	if err != nil {
		if release == nil {
			for _, cs := range reserved {
				d.hub.release(cs)
			}
		}
		d.wakeSlots()
		return "", err
	}
	if len(claimed) > 0 {
		d.metrics.rounds.WithLabelValues("submission").Inc()
	}
	d.metrics.observeBatch("submission", len(claimed), now)
	if release == nil {
		undeliverable = d.send(cctx, claimed, nil, reserved)
	}
	d.metrics.dispatched.Add(float64(len(claimed) - len(undeliverable)))
	d.endUndeliverable(cctx, undeliverable)
	switch {
	case len(claimed) < len(sp):
		d.wake() // a refused pick left its task ready, and nobody was told
	case len(claimed) < len(slots):
		d.wakeSlots() // a round that ran meanwhile found these slots taken
	}
	return id, nil
}

// notClaimed returns the attempts of sent that are not among claimed, and
// those of undeliverable that are.
func notClaimed(sent []store.Claimed, undeliverable []store.Completion, claimed []store.Claimed) ([]store.Claimed, []store.Completion) {
	ids := make(map[int64]bool, len(claimed))
	for _, c := range claimed {
		ids[c.Attempt] = true
	}
	var gone []store.Claimed
	for _, c := range sent {
		if !ids[c.Attempt] {
			gone = append(gone, c)
		}
	}
	var kept []store.Completion
	for _, u := range undeliverable {
		if ids[u.Attempt] {
			kept = append(kept, u)
		}
	}
	return gone, kept
}

// assign plans which ready tasks go to the reserved slots (plan), claims
// them and sends them out; it returns how many were claimed and how many
// were planned, and whether ready tasks may be left unclaimed; it gives
// back the slots it did not use.
func (d *dispatcher) assign(ctx context.Context, slots []*conn) (claimedN, plannedN int, more bool, err error) {
	reserved := byWorker(slots)
	start := time.Now()
	limit := candidateWindow(len(slots), d.widen)
	running := d.hub.runningByOwner() // one count for the round's read and plan
	cands, full, err := d.candidates(ctx, limit, running)
	if err != nil {
		for _, cs := range reserved {
			d.hub.release(cs)
		}
		return 0, 0, true, err
	}
	pending := 0
	for _, c := range cands {
		pending += c.Pending
	}
	workers := d.planWorkers(reserved)
	picks := d.plan(time.Now(), cands, workers, running)
	claimed, err := d.store.ClaimPicks(ctx, picks, d.cfg.Lease)
	d.metrics.observeBatch("claim", len(claimed), start)
	undelivered := d.deliver(ctx, claimed, err, reserved)
	more = full || len(claimed) < pending || undelivered > 0
	// excluding: the plan could not give some worker some candidate for
	// the candidate's sake (the worker ran a replica of it, the task has a
	// setup the worker's build cannot lay out, or the worker takes only
	// tasks short enough for its stability); tasks behind the window may
	// fit that worker.
	noSetup := slices.ContainsFunc(workers, func(w planWorker) bool { return !w.setup })
	excluding := false
	for i := range cands {
		excluding = excluding || len(cands[i].Exclude) > 0 ||
			noSetup && (cands[i].Setup || d.needsSetup.has(cands[i].TaskID))
	}
	if !excluding && full && len(picks) < len(slots) {
		excluding = d.choosy(time.Now(), workers)
	}
	d.widen = nextWiden(d.widen, limit, full, len(picks), len(slots), excluding)
	d.shortWindow = full && len(cands) < limit
	d.cands.claimed(claimed, len(picks), len(slots), err, time.Now())
	return len(claimed), len(picks), more, err
}

// candidates returns the window of ready tasks a round plans with, in the
// queue's order between owners (store.Candidates): the first limit of
// those the dispatcher read before and has not claimed, while no task
// became ready since (readyGen) and they fill the window (or were the
// whole queue), or else the first limit of a fresh read of twice as many.
// Each task is then read about once before its claim rather than at every
// round that does not reach it. While the cache is off
// (candidateCache.off), every round reads its window anew. full reports
// that more ready tasks may follow the window. running has the attempts
// this replica's workers run, by owner.
func (d *dispatcher) candidates(ctx context.Context, limit int, running map[int64]int) (cands []store.Candidate, full bool, err error) {
	gen := d.readyGen.Load()
	c := &d.cands
	if time.Now().Before(c.offUntil) {
		c.drop()
		return d.store.Candidates(ctx, limit, running)
	}
	if !c.ok || c.gen != gen || (len(c.tasks) < limit && c.full) {
		read := min(2*limit, maxCandidates)
		tasks, more, err := d.store.Candidates(ctx, read, running)
		if err != nil {
			c.drop()
			return nil, false, err
		}
		*c = candidateCache{tasks: tasks, gen: gen, full: more, ok: true}
	}
	return c.tasks[:min(limit, len(c.tasks))], len(c.tasks) > limit || c.full, nil
}

// candidateCache holds the ready tasks the dispatcher read and has not
// claimed, in dispatch order.
type candidateCache struct {
	tasks []store.Candidate
	gen   uint64 // Server.readyGen when read
	full  bool   // more ready tasks may follow (store.Candidates' more)
	ok    bool
	// offUntil: no cache before then (claimed says why).
	offUntil time.Time
}

// cacheOff is how long the cache stays off after a round found it wrong.
const cacheOff = 10 * time.Second

func (c *candidateCache) drop() { *c = candidateCache{offUntil: c.offUntil} }

// claimed updates the cache after a round planned picks for its slots and
// claimed claimed (err: the claim's error) at now. Claimed tasks leave it.
// It is dropped when it may hide better candidates: after an error, or
// when slots were left idle (the tasks behind the cached ones may fit
// them). It is also turned off for a while (cacheOff) when it proves
// wrong, so that rounds read no more than their window: after a pick that
// was not claimed (another replica took the task: replicas' claims send
// no notification, so caches would keep offering what others took) or
// with a replicated task in it (whose replicas left and exclusions change
// with every claim).
func (c *candidateCache) claimed(claimed []store.Claimed, picks, slots int, err error, now time.Time) {
	off := func() {
		c.drop()
		c.offUntil = now.Add(cacheOff)
	}
	switch {
	case err != nil || picks < slots:
		c.drop()
		return
	case len(claimed) < picks:
		off()
		return
	}
	for i := range c.tasks {
		if t := &c.tasks[i]; t.Replicas > 1 || t.Pending > 1 || len(t.Exclude) > 0 {
			off()
			return
		}
	}
	if !c.ok {
		return
	}
	gone := make(map[int64]bool, len(claimed))
	for i := range claimed {
		gone[claimed[i].TaskID] = true
	}
	c.tasks = slices.DeleteFunc(c.tasks, func(t store.Candidate) bool { return gone[t.TaskID] })
}

// maxCandidates bounds the candidate window of a round.
const maxCandidates = 4096

// candidateWindow is how many ready tasks a round of n slots reads: twice
// as many as it has slots (the plan chooses among them: longest first,
// replicas on distinct workers), plus a few for the smallest rounds, and
// 2^widen times that after rounds whose full window could not fill the
// slots (nextWiden). The read costs PostgreSQL and this process per task
// read, and a round claims at most one task per slot: with four times as
// many (4n+64), each task was read about five times before its claim,
// 10 to 15% of the CPU both spent per task in the dispatch benchmark.
func candidateWindow(n, widen int) int {
	return min((2*n+16)<<min(widen, 12), maxCandidates)
}

// nextWiden is the widening of the next round's window after a round read
// a window of limit (full: more ready tasks may follow it) and planned
// picks for its slots,
// excluding some workers from some candidates (replicas they ran, tasks
// with a setup that their build cannot lay out). A full window that could
// not fill the slots for that reason may hide ready tasks that could (the
// oldest ready tasks may all be replicas that these workers ran already,
// or another owner's tasks with files): the next round, at once, reads
// twice as many, up to maxCandidates. A round that filled its slots, saw the whole queue,
// or left slots idle for another reason (fairness, a worker too unstable
// for any task: a wider window would not change that) goes back to the
// usual window.
func nextWiden(widen, limit int, full bool, picks, slots int, excluding bool) int {
	switch {
	case !full || picks >= slots || !excluding:
		return 0
	case limit < maxCandidates:
		return widen + 1
	}
	return widen
}

// choosy reports whether some of workers takes a task or not by its run
// time (sched.Stability.Fits): an unstable worker only short tasks, one on
// a battery only tasks it outlasts. A window of tasks too long for them
// may hide tasks short enough.
func (d *dispatcher) choosy(now time.Time, workers []planWorker) bool {
	cfg := d.schedConfig()
	if !cfg.DeviceAware {
		return false
	}
	for _, w := range workers {
		st := sched.Classify(now, w.w.Samples, w.w.History, cfg.Stability)
		if st.Class == sched.Unstable || (st.Class != sched.TooUnstable && st.TimeToEmpty >= 0) {
			return true
		}
	}
	return false
}

// byWorker groups reserved slots by worker id.
func byWorker(slots []*conn) map[string][]*conn {
	reserved := map[string][]*conn{} // worker id -> its reserved slots
	for _, c := range slots {
		reserved[c.id] = append(reserved[c.id], c)
	}
	return reserved
}

// deliver sends claimed attempts to the reserved slots of their workers
// and gives back the slots left unused. An attempt that cannot be sent
// (its worker left meanwhile, its inputs are missing or too large for a
// frame, or the claim committed but its inputs could not be read: err)
// is ended at once; it returns how many were, after waking the dispatcher
// for their tasks.
func (d *dispatcher) deliver(ctx context.Context, claimed []store.Claimed, err error, reserved map[string][]*conn) (undelivered int) {
	undeliverable := d.send(ctx, claimed, err, reserved)
	d.metrics.dispatched.Add(float64(len(claimed) - len(undeliverable)))
	d.endUndeliverable(ctx, undeliverable)
	return len(undeliverable)
}

// send is deliver but for the attempts that cannot be sent: it returns
// them, for endUndeliverable once their claim has committed.
func (d *dispatcher) send(ctx context.Context, claimed []store.Claimed, err error, reserved map[string][]*conn) (undeliverable []store.Completion) {
	byConn := map[*conn][]protocol.Assign{}
	owners := map[*conn][]int64{} // of byConn's attempts
	settled := map[*conn]bool{}   // of byConn: its attempts started, or its worker gone
	defer func() {
		// A panic part of the way keeps no slot reserved for good: those
		// not taken and those taken for attempts not started go back
		// (the caller takes the attempts back).
		if r := recover(); r != nil {
			for w, cs := range reserved {
				d.hub.release(cs)
				reserved[w] = nil
			}
			for c, as := range byConn {
				for range as {
					if !settled[c] {
						d.hub.release([]*conn{c})
					}
				}
			}
			panic(r)
		}
	}()
	end := func(cl *store.Claimed, c *conn, comp store.Completion) {
		comp.Attempt, comp.Worker = cl.Attempt, cl.Worker
		undeliverable = append(undeliverable, comp)
		d.hub.release([]*conn{c})
	}
	blobURL := func(id string) (string, error) {
		tok, err := d.blobToken(ctx, id)
		return "/blobs/" + id + "?k=" + tok, err
	}
	for i := range claimed {
		cl := &claimed[i]
		c := reserved[cl.Worker][0]
		reserved[cl.Worker] = reserved[cl.Worker][1:]
		switch {
		case err != nil: // the claim committed but its inputs could not be read
			end(cl, c, store.Completion{Reason: protocol.ReasonWorker, Message: "the server could not read the task's inputs; retried", End: store.EndServerFault})
		case cl.Missing != "":
			end(cl, c, store.Completion{Reason: "input", Message: cl.Missing, End: store.EndTaskFinal})
		case assignSize(cl) > d.cfg.MaxFrameBytes:
			end(cl, c, store.Completion{Reason: "input", End: store.EndTaskFinal, Message: fmt.Sprintf(
				"inputs, stdin and checkpoint take %d MiB, more than the %d MiB one assignment can carry", assignSize(cl)>>20, d.cfg.MaxFrameBytes>>20)})
		default:
			a, err := toAssign(cl, assignee{upload: c.upload, browser: c.kind == protocol.KindBrowser, blobURL: blobURL})
			switch {
			case err != nil:
				end(cl, c, store.Completion{Reason: protocol.ReasonWorker, Message: "the server could not sign the task's data addresses; retried", End: store.EndServerFault})
			case a.Setup != nil && !c.setup:
				d.needsSetup.add(cl.TaskID)
				end(cl, c, store.Completion{Reason: protocol.ReasonWorker, End: store.EndUnstarted,
					Message: "the task reads an output uploaded over HTTP, which this worker's build cannot download; queued again"})
			default:
				if byConn[c] == nil {
					// Room for every slot still reserved on c's worker:
					// its attempts are no more than that.
					byConn[c] = make([]protocol.Assign, 0, 1+len(reserved[cl.Worker]))
				}
				byConn[c] = append(byConn[c], a)
				owners[c] = append(owners[c], cl.Owner)
			}
		}
	}
	for w, cs := range reserved {
		d.hub.release(cs)
		reserved[w] = nil
	}
	if d.beforeStart != nil && len(byConn) > 0 {
		d.beforeStart(ctx)
	}
	for c, as := range byConn {
		undeliverable = d.start(c, as, owners[c], undeliverable)
		settled[c] = true
	}
	return undeliverable
}

// start records attempts as (of owners) on c and queues their frames,
// in one step for c (assignMu), and returns undeliverable with those that
// cannot go: all of them when the worker left (or reconnected) meanwhile,
// and any older than an attempt c holds already (hub.started). Their
// tasks go back at once, without using up an attempt.
func (d *dispatcher) start(c *conn, as []protocol.Assign, owners []int64, undeliverable []store.Completion) []store.Completion {
	c.assignMu.Lock()
	defer c.assignMu.Unlock()
	stale, ok := d.hub.started(c, as, owners)
	if !ok {
		for i := range as {
			undeliverable = append(undeliverable, store.Completion{Attempt: as[i].Attempt, Worker: c.id, Reason: protocol.ReasonWorker,
				Message: "the worker disconnected before the task reached it; queued again", End: store.EndUnstarted})
		}
		return undeliverable
	}
	if len(stale) > 0 {
		slots := make([]*conn, len(stale)) // reserved for them, free again
		for k, i := range stale {
			undeliverable = append(undeliverable, store.Completion{Attempt: as[i].Attempt, Worker: c.id, Reason: protocol.ReasonWorker,
				Message: "claimed for the worker before an attempt it got first; queued again", End: store.EndUnstarted})
			slots[k] = c
		}
		d.hub.release(slots)
		kept := make([]protocol.Assign, 0, len(as)-len(stale))
		for i := range as {
			if !slices.Contains(stale, i) {
				kept = append(kept, as[i])
			}
		}
		as = kept
	}
	for _, batch := range assignFrames(as, d.cfg.MaxFrameBytes) {
		c.enqueue(&protocol.Frame{Type: protocol.TypeAssign, Assign: batch})
	}
	return undeliverable
}

// endUndeliverable ends the attempts send could not send, charged as each
// says, and wakes the dispatcher for their tasks.
func (d *dispatcher) endUndeliverable(ctx context.Context, undeliverable []store.Completion) {
	if len(undeliverable) == 0 {
		return
	}
	if _, err := d.store.Complete(ctx, undeliverable); err != nil {
		d.log.Error("end undeliverable attempts", "err", err)
	}
	d.wake()
}

// assignFrames splits one worker's attempts into assign frames: several to
// a frame (a worker decodes and handles one frame at a time, which matters
// most for a browser), as long as the frame stays well under the limits of
// a whole frame (maxFrame) and of its JSON header (1 MiB).
func assignFrames(as []protocol.Assign, maxFrame int) [][]protocol.Assign {
	const maxPerFrame, maxHeader = 64, 256 << 10
	var out [][]protocol.Assign
	for i := 0; i < len(as); {
		j, data, head := i, 0, 0
		for ; j < len(as) && j-i < maxPerFrame; j++ {
			a := &as[j]
			d := 64<<10 + len(a.Stdin.Data) + len(a.Restore.Data)
			h := 1024 + len(a.Task) + len(a.Module)
			for _, in := range a.Inputs {
				d += len(in.Data)
				h += 64 + len(in.Name)
			}
			for _, arg := range a.Args {
				h += 8 + 2*len(arg) // JSON may escape
			}
			if j > i && (data+d > maxFrame || head+h > maxHeader) {
				break
			}
			data, head = data+d, head+h
		}
		out = append(out, as[i:j])
		i = j
	}
	return out
}

// assignSize is about the size of the assign frame of a claimed task.
func assignSize(c *store.Claimed) int {
	n := 64<<10 + len(c.Stdin) + len(c.Restore)
	for _, in := range c.Inputs {
		n += len(in.Data)
	}
	return n
}

// assignee is what toAssign needs to know of the worker an attempt goes
// to.
type assignee struct {
	// upload: the worker uploads large outputs (protocol.FeatureUpload);
	// without it, output limits are at most what a result frame carries.
	upload  bool
	browser bool
	// blobURL is the address a worker downloads blob id from.
	blobURL func(id string) (string, error)
}

// toAssign is the assignment of a claimed attempt for worker w. An input
// uploaded over HTTP becomes a file of the task's setup, at /in/NAME (or
// its own path), which the worker downloads.
func toAssign(c *store.Claimed, w assignee) (protocol.Assign, error) {
	a := protocol.Assign{
		Attempt: c.Attempt, Task: c.WorkflowID + "/" + c.Name, Module: c.Module, Args: c.Args,
		Stdin: protocol.Blob{Data: c.Stdin}, Restore: protocol.Blob{Data: c.Restore},
		Seed: uint64(c.Seed), CkptMS: c.CkptMS, Priority: c.Priority,
		Limits: protocol.Limits{MemoryPages: uint32(c.MemoryPages), WallMS: c.TimeoutMS, OutputBytes: c.OutputBytes, LogBytes: c.LogBytes},
	}
	if !w.upload {
		a.Limits.OutputBytes = min(a.Limits.OutputBytes, protocol.InlineOutputBytes)
	}
	if w.browser {
		a.Limits.OutputBytes = min(a.Limits.OutputBytes, protocol.BrowserOutputBytes)
	}
	if c.Setup != nil {
		// Written by toNewWorkflow from a protocol.Setup: it decodes.
		a.Setup = new(protocol.Setup)
		if err := json.Unmarshal(c.Setup, a.Setup); err != nil {
			a.Setup = nil
		}
	}
	if c.RestoreBlob != "" && w.upload {
		// (A worker of a build without uploads would not download it:
		// it starts from the beginning, which is always correct.)
		u, err := w.blobURL(c.RestoreBlob)
		if err != nil {
			return a, err
		}
		a.RestoreFrom = &protocol.File{Blob: c.RestoreBlob, Size: c.RestoreSize, URL: u}
	}
	for _, in := range c.Inputs {
		if in.Blob == "" {
			a.Inputs = append(a.Inputs, protocol.Blob{Name: in.Name, Data: in.Data})
			continue
		}
		u, err := w.blobURL(in.Blob)
		if err != nil {
			return a, err
		}
		if a.Setup == nil {
			a.Setup = new(protocol.Setup)
		}
		p := in.Name
		if !strings.HasPrefix(p, "/") {
			p = "/in/" + p
		}
		a.Setup.Files = append(a.Setup.Files, protocol.File{Path: p, Blob: in.Blob, Size: in.Size, URL: u})
	}
	return a, nil
}
