package bench

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// The hostile workers of the hostile part (issue 21), as an attacker would
// write them: each speaks the protocol itself, with no reconnect token, so
// every connection is a fresh identity.
const (
	// hostileSlots is what the failer and the staller say they have.
	hostileSlots = 8
	// hostileForgeBytes is the output of each forged result, and
	// hostileForgeInFlight how many are sent before their acks come.
	hostileForgeBytes    = 32 << 20
	hostileForgeInFlight = 3
	// hostileFloodConns is how many flood connections are open at once.
	hostileFloodConns = 20
	// hostileBackoff is how long a refused hostile worker waits before it
	// tries again.
	hostileBackoff = time.Second
	// hostileStarved is how long the failer goes without an assignment
	// before it drops its identity for a new one.
	hostileStarved = 3 * time.Second
)

// hostileRun is what one run of the hostile part's honest workflow gave.
type hostileRun struct {
	id       string
	makespan time.Duration // submission request to the end of the workflow
	state    string        // the workflow's state at the end ("" if it did not end)
	notDone  int           // its tasks that did not end done
	peakKiB  int64         // the server's peak resident memory meanwhile
	cpu      cpuShare      // CPU time by role meanwhile
	wall     time.Duration // how long the CPU time was counted
}

// hostile measures what four hostile workers cost an honest workflow: one
// of Config.HostileTasks counter tasks (Config.HostileTaskMS each) on
// Config.Workers honest headless worker processes, run alone (the
// baseline), then while a failer, a forger, a flooder and a staller (see
// attack) run from before its submission to after its end, then alone
// again. It prints the attacked run's makespan over the mean of the two
// baselines', the server's peak resident memory during the runs, the
// database's growth during the first baseline and during the attacked run,
// and the tasks of the attacked workflow that did not end done, and
// returns an error when there are any.
//
// The honest workers connect first, and keep their identities (they
// reconnect with their tokens); the hostile ones come from the same
// address, as new identities each time they connect, so a limit on new
// identities per address refuses them, not the honest ones.
func (b *bench) hostile(ctx context.Context) error {
	log := b.cfg.Logger.With("part", "hostile")
	mod, err := b.pushTask(ctx, "counter")
	if err != nil {
		return err
	}
	slots := max(1, runtime.NumCPU()/b.cfg.Workers)
	since, err := b.dbNow(ctx)
	if err != nil {
		return err
	}
	for i := range b.cfg.Workers {
		w, err := b.startWorkerArgs(fmt.Sprintf("hostile-honest-%d", i), "--slots", strconv.Itoa(slots))
		if err != nil {
			return err
		}
		defer w.stop()
	}
	if err := b.waitNewWorkers(ctx, since, b.cfg.Workers); err != nil {
		return err
	}
	// The honest workers compile the module and start their slot
	// processes before anything is measured.
	warm := b.hostileWorkflow("hostile-warm-up", mod.ID, 8*slots*b.cfg.Workers, b.cfg.HostileTaskMS)
	if run, err := b.runHostile(ctx, warm, time.Minute, nil); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	} else if run.notDone > 0 {
		return fmt.Errorf("warm-up: %d tasks did not end done; %s", run.notDone, b.taskStates(ctx, run.id))
	}

	wf := b.hostileWorkflow("hostile", mod.ID, b.cfg.HostileTasks, b.cfg.HostileTaskMS)
	log.Info("baseline run", "tasks", b.cfg.HostileTasks, "task_ms", b.cfg.HostileTaskMS, "workers", b.cfg.Workers, "slots", slots)
	size0, err := b.dbSize(ctx)
	if err != nil {
		return err
	}
	base, err := b.runHostile(ctx, wf, 5*time.Minute, nil)
	if err != nil {
		return fmt.Errorf("baseline run: %w", err)
	}
	if base.notDone > 0 {
		return fmt.Errorf("baseline run: %d tasks did not end done (without any attack); %s",
			base.notDone, b.taskStates(ctx, base.id))
	}
	time.Sleep(2 * time.Second) // as after the attack run (below)
	size1, err := b.dbSize(ctx)
	if err != nil {
		return err
	}

	log.Info("attack run")
	a := b.attack(ctx)
	run, err := b.runHostile(ctx, wf, max(time.Minute, 3*base.makespan), a)
	if err != nil {
		return fmt.Errorf("attack run: %w", err)
	}
	// What the server does as the hostile workers leave (their queues
	// given back, their records) is the attack's too.
	time.Sleep(2 * time.Second)
	size2, err := b.dbSize(ctx)
	if err != nil {
		return err
	}
	// The baseline again, so that the makespan the attack run is compared
	// with is from the same minutes (a machine whose other load drifts
	// moves both alike).
	log.Info("second baseline run")
	after, err := b.runHostile(ctx, wf, 5*time.Minute, nil)
	if err != nil {
		return fmt.Errorf("second baseline run: %w", err)
	}
	if after.notDone > 0 {
		return fmt.Errorf("second baseline run: %d tasks did not end done (after the attack); %s",
			after.notDone, b.taskStates(ctx, after.id))
	}
	baseline := (base.makespan + after.makespan) / 2

	mib := func(kib int64) float64 { return float64(kib) / 1024 }
	b.printf("hostile_tasks: %d", b.cfg.HostileTasks)
	b.printf("hostile_task_ms: %d", b.cfg.HostileTaskMS)
	b.printf("hostile_baseline_makespan_s: %.1f (before %.1f, after %.1f)", baseline.Seconds(), base.makespan.Seconds(),
		after.makespan.Seconds())
	slowdown := run.makespan.Seconds() / baseline.Seconds()
	if run.state == "" {
		b.printf("hostile_makespan_s: over %.0f (the workflow did not end; cancelled)", run.makespan.Seconds())
		b.printf("hostile_honest_slowdown: over %.2f", slowdown)
	} else {
		b.printf("hostile_makespan_s: %.1f", run.makespan.Seconds())
		b.printf("hostile_honest_slowdown: %.2f", slowdown)
	}
	b.printf("hostile_server_baseline_peak_mib: %.0f", mib(max(base.peakKiB, after.peakKiB)))
	b.printf("hostile_server_peak_mib: %.0f", mib(run.peakKiB))
	b.printf("hostile_db_growth_baseline_mib: %.2f", float64(size1-size0)/(1<<20))
	b.printf("hostile_db_growth_mib: %.2f", float64(size2-size1)/(1<<20))
	b.printf("hostile_db_growth_over_baseline_mib: %.2f", float64((size2-size1)-(size1-size0))/(1<<20))
	b.printf("hostile_honest_failed: %d", run.notDone)
	if run.notDone > 0 {
		b.printf("hostile_honest_tasks: %s", b.taskStates(ctx, run.id))
	}
	if err := b.printHostileAttempts(ctx, run.id); err != nil {
		return err
	}
	for _, l := range a.summary() {
		b.printf("%s", l)
	}
	cores := func(d time.Duration, wall time.Duration) float64 { return float64(d) / float64(wall) }
	b.printf("hostile_baseline_cpu_cores: %.2f (server %.2f, postgres %.2f, workers and slots %.2f)", cores(base.cpu.total(), base.wall),
		cores(base.cpu.server, base.wall), cores(base.cpu.postgres, base.wall), cores(base.cpu.workers+base.cpu.slots, base.wall))
	b.printf("hostile_cpu_cores: %.2f (server %.2f, postgres %.2f, workers and slots %.2f, the hostile workers %.2f)", cores(run.cpu.total(), run.wall),
		cores(run.cpu.server, run.wall), cores(run.cpu.postgres, run.wall), cores(run.cpu.workers+run.cpu.slots, run.wall),
		cores(run.cpu.bench, run.wall))
	if run.notDone > 0 {
		return fmt.Errorf("%d tasks of the honest workflow did not end done while hostile workers ran", run.notDone)
	}
	return nil
}

// hostileWorkflow is a workflow of n counter tasks of one step of ms
// milliseconds, with the default limits and max_attempts.
func (b *bench) hostileWorkflow(name, module string, n, ms int) []byte {
	type task struct {
		Name   string   `json:"name"`
		Module string   `json:"module"`
		Args   []string `json:"args"`
	}
	tasks := make([]task, n)
	for i := range tasks {
		tasks[i] = task{Name: fmt.Sprintf("h%04d", i), Module: module, Args: []string{"1", strconv.Itoa(ms)}}
	}
	data, _ := json.Marshal(map[string]any{"name": name, "tasks": tasks})
	return data
}

// runHostile submits a workflow and waits up to limit for its end, while
// the server's memory is sampled. With a non-nil attack, the attack is
// under way when the workflow is submitted (runHostile waits for each of
// its workers to have tried once) and is stopped once the workflow ends.
// A workflow that does not end within limit is cancelled, and its tasks
// not done are counted in notDone.
func (b *bench) runHostile(ctx context.Context, wf []byte, limit time.Duration, a *attack) (hostileRun, error) {
	var run hostileRun
	peak := samplePeak(b.server.cmd.Process.Pid)
	cpu0, began := b.cpuNow(), time.Now()
	stop := func() {
		if a != nil {
			a.stop()
		}
		run.peakKiB = peak.stop()
		run.cpu, run.wall = b.cpuNow().sub(cpu0), time.Since(began)
	}
	if a != nil {
		if err := a.ready(ctx, 15*time.Second); err != nil {
			stop()
			return run, err
		}
	}
	start := time.Now()
	s, err := b.client.Submit(ctx, wf)
	if err != nil {
		stop()
		return run, err
	}
	run.id = s.ID
	err = b.waitDone(ctx, s.ID, limit)
	run.makespan = time.Since(start)
	stop()
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	if qerr := b.db.QueryRow(ctx, `SELECT state FROM workflows WHERE id = $1`, s.ID).Scan(&run.state); qerr != nil {
		return run, qerr
	}
	switch run.state {
	case "done", "failed":
	default: // waitDone gave up
		b.cfg.Logger.Warn("hostile: the workflow did not end", "workflow", s.ID, "state", run.state, "err", err)
		run.state = ""
		if _, cerr := b.client.Cancel(ctx, s.ID); cerr != nil {
			b.cfg.Logger.Warn("hostile: cancel the unfinished workflow", "workflow", s.ID, "err", cerr)
		}
	}
	if err := b.db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE workflow_id = $1 AND state <> 'done'`,
		s.ID).Scan(&run.notDone); err != nil {
		return run, err
	}
	return run, nil
}

// printHostileAttempts prints the attempts of the attacked workflow by
// state, and on how many workers they ran.
func (b *bench) printHostileAttempts(ctx context.Context, id string) error {
	rows, err := b.db.Query(ctx, `SELECT a.state, count(*), count(DISTINCT a.worker_id)
		FROM attempts a JOIN tasks t ON t.id = a.task_id WHERE t.workflow_id = $1 GROUP BY a.state ORDER BY a.state`, id)
	if err != nil {
		return fmt.Errorf("read the attempts of workflow %s: %w", id, err)
	}
	defer rows.Close()
	var made int
	var states []string
	for rows.Next() {
		var state string
		var n, workers int
		if err := rows.Scan(&state, &n, &workers); err != nil {
			return fmt.Errorf("read the attempts of workflow %s: %w", id, err)
		}
		made += n
		states = append(states, fmt.Sprintf("%s=%d on %d workers", state, n, workers))
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the attempts of workflow %s: %w", id, err)
	}
	b.printf("hostile_attempts: %d (%s)", made, strings.Join(states, ", "))
	return nil
}

// dbSize is the size of the benchmark's database on disk.
func (b *bench) dbSize(ctx context.Context) (int64, error) {
	var n int64
	if err := b.db.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read the database's size: %w", err)
	}
	return n, nil
}

// peakSampler follows a process's resident memory.
type peakSampler struct {
	quit chan struct{}
	peak chan int64
}

// samplePeak starts following the resident memory of process pid: every
// 100 ms, and through its high-water mark (VmHWM), reset now where the
// kernel allows it (writing 5 to /proc/PID/clear_refs), so that what came
// before is not counted.
func samplePeak(pid int) *peakSampler {
	hwm := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) == nil
	p := &peakSampler{quit: make(chan struct{}), peak: make(chan int64, 1)}
	go func() {
		var peak int64
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if kib, err := procStatusKiB(pid, "VmRSS"); err == nil {
				peak = max(peak, kib)
			}
			select {
			case <-t.C:
				continue
			case <-p.quit:
			}
			if kib, err := procStatusKiB(pid, "VmHWM"); err == nil && hwm {
				peak = max(peak, kib)
			}
			p.peak <- peak
			return
		}
	}()
	return p
}

// stop ends the sampling and returns the peak seen, in KiB.
func (p *peakSampler) stop() int64 {
	close(p.quit)
	return <-p.peak
}

// attack is the four hostile workers of the hostile part, running until
// stop:
//
//   - the failer says hello with hostileSlots slots, heartbeats, and
//     answers every attempt it is assigned with a fail frame (reason
//     exit) at once; given nothing for hostileStarved, it closes its
//     socket to come back as a new identity, as an attacker would once the
//     server stops trusting the one it has;
//   - the forger (a paused worker, given nothing) sends results of
//     hostileForgeBytes for attempts it never held, guessed (attempt ids
//     are sequential) or made up, hostileForgeInFlight at a time,
//     continuously;
//   - the flooder keeps hostileFloodConns connections opening, each with
//     one frame the server must refuse: a hello over its size limit, a
//     hello with values out of bounds, garbage in a binary message or in
//     a text one;
//   - the staller says hello with hostileSlots slots, takes what it is
//     assigned and never says anything again (no heartbeat, no outcome),
//     so the leases of its attempts lapse.
//
// The failer, the forger and the staller connect again when their socket
// closes, as a new identity (no reconnect token); when refused they wait
// hostileBackoff before they try again.
type attack struct {
	url    string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	failer, forger, staller hostileStats
	flood                   floodStats
	// forged counts the results the forger sent; forgedRefused and
	// forgedAccepted the acks it got for them.
	forged, forgedRefused, forgedAccepted atomic.Int64
}

// hostileStats counts what one hostile worker did.
type hostileStats struct {
	tries    atomic.Int64 // connections tried
	welcomed atomic.Int64 // identities it was given
	refused  atomic.Int64 // hellos refused with an error frame
	unopened atomic.Int64 // connections that failed otherwise (refused before the upgrade, closed, ...)
	assigned atomic.Int64 // attempts it was assigned
	failed   atomic.Int64 // fail items it sent
	failOK   atomic.Int64 // of which the server acked as committed
	starved  atomic.Int64 // identities dropped for want of work
	mu       sync.Mutex
	lastErr  string // the last refusal or error frame
}

func (s *hostileStats) noteError(msg string) {
	s.mu.Lock()
	s.lastErr = msg
	s.mu.Unlock()
}

func (s *hostileStats) last() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// floodStats counts the flooder's connections by what the server did.
type floodStats struct {
	conns    atomic.Int64 // connections opened
	errors   atomic.Int64 // answered with an error frame
	welcomed atomic.Int64 // answered with a welcome (it should not be)
	other    atomic.Int64 // answered with anything else
	closed   atomic.Int64 // closed without an answer
	dials    atomic.Int64 // connections that could not be opened
}

// attack starts the hostile workers.
func (b *bench) attack(ctx context.Context) *attack {
	ctx, cancel := context.WithCancel(ctx)
	a := &attack{url: "ws" + strings.TrimPrefix(b.url, "http") + "/ws/worker", cancel: cancel}
	a.wg.Add(3 + hostileFloodConns)
	go func() { defer a.wg.Done(); a.runFailer(ctx) }()
	go func() { defer a.wg.Done(); a.runForger(ctx) }()
	go func() { defer a.wg.Done(); a.runStaller(ctx) }()
	for i := range hostileFloodConns {
		go func() { defer a.wg.Done(); a.runFlooder(ctx, i) }()
	}
	return a
}

// ready waits until each hostile worker has tried to connect, and the
// flooder has opened a connection, up to limit.
func (a *attack) ready(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		tried := func(s *hostileStats) bool { return s.welcomed.Load()+s.refused.Load()+s.unopened.Load() > 0 }
		if tried(&a.failer) && tried(&a.forger) && tried(&a.staller) && a.flood.conns.Load()+a.flood.dials.Load() > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the hostile workers did not all connect within %v: %s", limit, strings.Join(a.summary(), "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop ends the attack and waits for its workers to be gone.
func (a *attack) stop() {
	a.cancel()
	a.wg.Wait()
}

// summary is one line per hostile worker: what it did and what it got.
func (a *attack) summary() []string {
	quoted := func(s *hostileStats) string {
		var q string
		if n := s.unopened.Load(); n > 0 {
			q = fmt.Sprintf(", not connected otherwise %d", n)
		}
		if l := s.last(); l != "" {
			q += fmt.Sprintf("; last error frame %q", l)
		}
		return q
	}
	return []string{
		fmt.Sprintf("hostile_failer_fails: %d (assigned %d, acked as committed %d; identities %d, dropped for want of work %d, refused %d%s)",
			a.failer.failed.Load(), a.failer.assigned.Load(), a.failer.failOK.Load(), a.failer.welcomed.Load(),
			a.failer.starved.Load(), a.failer.refused.Load(), quoted(&a.failer)),
		fmt.Sprintf("hostile_forger_results: %d of %d MiB (refused %d, accepted %d; identities %d, refused %d%s)",
			a.forged.Load(), hostileForgeBytes>>20, a.forgedRefused.Load(), a.forgedAccepted.Load(),
			a.forger.welcomed.Load(), a.forger.refused.Load(), quoted(&a.forger)),
		fmt.Sprintf("hostile_flooder_conns: %d (answered with an error frame %d, a welcome %d, something else %d; closed unanswered %d; not opened %d)",
			a.flood.conns.Load(), a.flood.errors.Load(), a.flood.welcomed.Load(), a.flood.other.Load(), a.flood.closed.Load(),
			a.flood.dials.Load()),
		fmt.Sprintf("hostile_staller_attempts: %d (identities %d, refused %d%s)",
			a.staller.assigned.Load(), a.staller.welcomed.Load(), a.staller.refused.Load(), quoted(&a.staller)),
	}
}

// errRefused is a hello answered with an error frame.
var errRefused = errors.New("refused")

// hello connects a hostile worker, says hello and reads the answer.
func (a *attack) hello(ctx context.Context, s *hostileStats, h *protocol.Hello) (*websocket.Conn, *protocol.Welcome, error) {
	s.tries.Add(1)
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(dctx, a.url, nil)
	if err != nil {
		if ctx.Err() == nil {
			s.unopened.Add(1)
		}
		return nil, nil, err
	}
	c.SetReadLimit(protocol.DefaultMaxFrameBytes)
	data, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeHello, Hello: h})
	if err == nil {
		err = c.Write(dctx, websocket.MessageText, data)
	}
	var fr *protocol.Frame
	if err == nil {
		var typ websocket.MessageType
		if typ, data, err = c.Read(dctx); err == nil {
			fr, err = protocol.Decode(data, typ == websocket.MessageBinary)
		}
	}
	switch {
	case err != nil:
	case fr.Type == protocol.TypeError:
		s.refused.Add(1)
		s.noteError(fr.Error.Message)
		err = fmt.Errorf("%w: %s", errRefused, fr.Error.Message)
	case fr.Type != protocol.TypeWelcome:
		err = fmt.Errorf("hello answered with %s", fr.Type)
	}
	if err != nil {
		if !errors.Is(err, errRefused) && ctx.Err() == nil {
			s.unopened.Add(1)
		}
		c.CloseNow()
		return nil, nil, err
	}
	s.welcomed.Add(1)
	return c, fr.Welcome, nil
}

// reconnect waits before a hostile worker's next connection: hostileBackoff
// after a refusal or an error, a little after a socket the server closed.
// It reports whether the attack goes on.
func reconnect(ctx context.Context, err error) bool {
	d := 100 * time.Millisecond
	if err != nil {
		d = hostileBackoff
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// heartbeats sends an empty heartbeat (free slots, nothing running) every
// interval until ctx ends or a write fails.
func heartbeats(ctx context.Context, c *websocket.Conn, interval time.Duration, free int) {
	data, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeHeartbeat,
		Heartbeat: &protocol.Heartbeat{Running: []protocol.Progress{}, Free: free}})
	t := time.NewTicker(max(interval, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.Write(ctx, websocket.MessageText, data); err != nil {
			return
		}
	}
}

// readFrames reads a hostile worker's socket until it closes, handing each
// frame to f.
func readFrames(ctx context.Context, c *websocket.Conn, s *hostileStats, f func(*protocol.Frame) error) {
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		fr, err := protocol.Decode(data, typ == websocket.MessageBinary)
		if err != nil {
			return
		}
		switch fr.Type {
		case protocol.TypeError:
			s.noteError(fr.Error.Message)
		case protocol.TypeAssign:
			s.assigned.Add(int64(len(fr.Assign)))
		}
		if err := f(fr); err != nil {
			return
		}
	}
}

func (a *attack) runFailer(ctx context.Context) {
	s := &a.failer
	for {
		c, w, err := a.hello(ctx, s, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: hostileSlots})
		if err == nil {
			cctx, cancel := context.WithCancel(ctx)
			go heartbeats(cctx, c, time.Duration(w.HeartbeatMS)*time.Millisecond, hostileSlots)
			starved := time.AfterFunc(hostileStarved, func() {
				s.starved.Add(1)
				c.CloseNow()
			})
			readFrames(cctx, c, s, func(fr *protocol.Frame) error {
				switch fr.Type {
				case protocol.TypeAssign:
					starved.Reset(hostileStarved)
					fails := make([]protocol.Fail, len(fr.Assign))
					for i, as := range fr.Assign {
						fails[i] = protocol.Fail{Attempt: as.Attempt, Reason: protocol.ReasonExit, Message: "exit status 1", DurationMS: 1}
					}
					data, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeFail, Fails: fails})
					if err != nil {
						return err
					}
					if err := c.Write(cctx, websocket.MessageText, data); err != nil {
						return err
					}
					s.failed.Add(int64(len(fails)))
				case protocol.TypeAck:
					for _, ack := range fr.Acks {
						if ack.Of == protocol.AckFail && ack.OK {
							s.failOK.Add(1)
						}
					}
				}
				return nil
			})
			starved.Stop()
			cancel()
			c.CloseNow()
		}
		if !reconnect(ctx, err) {
			return
		}
	}
}

func (a *attack) runStaller(ctx context.Context) {
	s := &a.staller
	for {
		c, _, err := a.hello(ctx, s, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: hostileSlots})
		if err == nil {
			readFrames(ctx, c, s, func(*protocol.Frame) error { return nil })
			c.CloseNow()
		}
		if !reconnect(ctx, err) {
			return
		}
	}
}

func (a *attack) runForger(ctx context.Context) {
	s := &a.forger
	payload := make([]byte, hostileForgeBytes)
	for i := range payload {
		payload[i] = byte(i)
	}
	var n int64
	for {
		c, w, err := a.hello(ctx, s, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1,
			Device: protocol.Device{Paused: true}})
		if err == nil {
			cctx, cancel := context.WithCancel(ctx)
			go heartbeats(cctx, c, time.Duration(w.HeartbeatMS)*time.Millisecond, 0)
			inFlight := make(chan struct{}, hostileForgeInFlight)
			go func() {
				defer cancel()
				readFrames(cctx, c, s, func(fr *protocol.Frame) error {
					for _, ack := range fr.Acks {
						if ack.Of != protocol.AckResult {
							continue
						}
						if ack.OK {
							a.forgedAccepted.Add(1)
						} else {
							a.forgedRefused.Add(1)
						}
						select {
						case <-inFlight:
						default:
						}
					}
					return nil
				})
			}()
		send:
			for {
				select {
				case inFlight <- struct{}{}:
				case <-cctx.Done():
					break send
				}
				n++
				attempt := n // guessed: attempt ids are sequential from 1
				if n%2 == 0 {
					attempt = 1<<40 + n // made up
				}
				if err := writeForgedResult(cctx, c, attempt, payload); err != nil {
					break send
				}
				a.forged.Add(1)
			}
			cancel()
			c.CloseNow()
		}
		if !reconnect(ctx, err) {
			return
		}
	}
}

// writeForgedResult sends a result frame for attempt with payload as its
// stdout, streamed: the frame's length prefix and header, then the payload
// as it is (protocol.Encode would copy it into the message).
func writeForgedResult(ctx context.Context, c *websocket.Conn, attempt int64, payload []byte) error {
	w, err := c.Writer(ctx, websocket.MessageBinary)
	if err != nil {
		return err
	}
	if err := writeResultFrame(w, attempt, payload); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// writeResultFrame writes a binary result frame (docs/PROTOCOL.md) for
// attempt, with payload as its stdout and an empty log, to w.
func writeResultFrame(w io.Writer, attempt int64, payload []byte) error {
	hdr, err := json.Marshal(&protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{Attempt: attempt,
		Outputs: []protocol.Blob{{Name: "stdout", Size: len(payload)}}, DurationMS: 1}}})
	if err != nil {
		return err
	}
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(hdr)))
	for _, p := range [][]byte{n[:], hdr, payload} {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// floodFrames are the first frames of the flooder's connections, in turn:
// each one the server must refuse (binary reports whether it goes as a
// binary message).
func floodFrames() []struct {
	data   []byte
	binary bool
} {
	big, _ := json.Marshal(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{Version: protocol.Version,
		Kind: protocol.KindBrowser, Slots: 1, Device: protocol.Device{UserAgent: strings.Repeat("Mozilla/5.0 ", 256<<10/12)}}})
	bad, _ := json.Marshal(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{Version: protocol.Version,
		Kind: protocol.KindHeadless, Slots: 100_000, Queue: 1 << 30}})
	garbage := make([]byte, 4096)
	for i := range garbage {
		garbage[i] = byte(i*7 + 13)
	}
	return []struct {
		data   []byte
		binary bool
	}{
		{big, false},     // a hello over the server's limit for one
		{bad, false},     // a hello with its values out of bounds
		{garbage, true},  // a binary message whose length prefix is nonsense
		{garbage, false}, // a text message that is not JSON
	}
}

func (a *attack) runFlooder(ctx context.Context, i int) {
	frames := floodFrames()
	for k := i; ctx.Err() == nil; k++ {
		fr := frames[k%len(frames)]
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, _, err := websocket.Dial(cctx, a.url, nil)
		if err != nil {
			cancel()
			if ctx.Err() == nil {
				a.flood.dials.Add(1)
				reconnect(ctx, err)
			}
			continue
		}
		a.flood.conns.Add(1)
		typ := websocket.MessageText
		if fr.binary {
			typ = websocket.MessageBinary
		}
		// The server may answer, and close, before it has read it all.
		go c.Write(cctx, typ, fr.data)
		mt, data, err := c.Read(cctx)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				a.flood.closed.Add(1)
			}
		default:
			switch f, derr := protocol.Decode(data, mt == websocket.MessageBinary); {
			case derr == nil && f.Type == protocol.TypeError:
				a.flood.errors.Add(1)
			case derr == nil && f.Type == protocol.TypeWelcome:
				a.flood.welcomed.Add(1)
			default:
				a.flood.other.Add(1)
			}
		}
		c.CloseNow()
		cancel()
	}
}
