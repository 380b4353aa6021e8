package headless

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cyclepool/cyclepool/wasmworker"
)

// acquire gives job a slot process and a ticket in it. With follow, while
// attempts are short, it queues the attempt behind those of a busy slot
// process that has the module loaded (sending its run request at once);
// otherwise it takes an idle slot process, preferring the most recently
// used one that has the module loaded, or starts one.
func (p *slotPool) acquire(ctx context.Context, job *wasmworker.Job, follow bool) (*slotProc, *ticket, error) {
	t := newTicket()
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, nil, errors.New("runner closed")
		}
		if follow && p.recent.n > 0 && p.recent.avg < p.pipe.short {
			if c := p.followable(job.ModuleID); c != nil {
				p.mu.Unlock()
				if p.follow(c, t, job) {
					return c, t, nil
				}
				continue
			}
		}
		if len(p.idle) == 0 {
			p.mu.Unlock()
			c, err := p.spawn(ctx)
			if err != nil {
				return nil, nil, err
			}
			p.mu.Lock()
			c.tickets = append(c.tickets, t)
			p.mu.Unlock()
			return c, t, nil
		}
		i := len(p.idle) - 1
		for j := i; j >= 0; j-- {
			if p.idle[j].modules[job.ModuleID] {
				i = j
				break
			}
		}
		c := p.idle[i]
		p.idle = slices.Delete(p.idle, i, i+1)
		if c.isDead() {
			p.mu.Unlock()
			continue
		}
		c.tickets = append(c.tickets, t)
		if !c.modules[job.ModuleID] || c.gate == nil || !c.wmu.TryLock() {
			p.mu.Unlock()
			return c, t, nil // attempt loads the module and sends the run request
		}
		// Send the run request now, so that the Runs that come meanwhile
		// can queue behind it (c.wmu, taken before the run request is
		// numbered, keeps them behind).
		c.seq++
		t.seq = c.seq
		t.began = time.Now()
		c.open = true
		t.turn <- true
		p.mu.Unlock()
		err := c.enc.Encode(&slotRequest{Kind: reqRun, ModuleID: job.ModuleID, Assign: job.Assign, Host: job.Host != nil, Seq: t.seq})
		c.wmu.Unlock()
		if err != nil {
			c.kill() // attempt learns it from the reply pipe
		}
		return c, t, nil
	}
}

// releaseLocked makes c idle again; p.mu is held.
func (p *slotPool) releaseLocked(c *slotProc) {
	if c.isDead() {
		return
	}
	if p.closed || c.seq >= maxSeq {
		c.kill()
		return
	}
	c.idleSince = time.Now()
	p.idle = append(p.idle, c)
	if c.idleTimer == nil {
		c.idleTimer = time.AfterFunc(p.idleTimeout, func() { p.retire(c) })
	} else {
		c.idleTimer.Reset(p.idleTimeout)
	}
}

// retire ends c if it is still idle and has been for idleTimeout.
func (p *slotPool) retire(c *slotProc) {
	p.mu.Lock()
	i := slices.Index(p.idle, c)
	if i < 0 || time.Since(c.idleSince) < p.idleTimeout {
		p.mu.Unlock()
		return
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	p.mu.Unlock()
	p.log.Debug("slot process idle too long: ending it", "slot", c.id)
	c.kill()
}

// spawn starts a slot process and waits for its hello.
func (p *slotPool) spawn(ctx context.Context) (c *slotProc, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errors.New("runner closed")
	}
	p.nextID++
	c = &slotProc{id: p.nextID, dir: filepath.Join(p.baseDir, fmt.Sprintf("slot-%d", p.nextID)),
		stderr: &tailBuffer{max: 8 << 10}, modules: map[string]bool{},
		dead: make(chan struct{}), exited: make(chan struct{})}
	p.all[c] = struct{}{}
	p.procs.Add(1)
	p.mu.Unlock()
	forget := func() {
		os.RemoveAll(c.dir)
		p.mu.Lock()
		delete(p.all, c)
		if c.gate != nil {
			c.gate.unmap()
			c.gate, c.gateGone = nil, true
		}
		p.mu.Unlock()
		c.markDead()
		close(c.exited)
		p.procs.Done()
	}
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		forget()
		return nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		forget()
		return nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		forget()
		return nil, err
	}
	cmd := exec.Command(p.exe, "cyclepool-slot-process")
	cmd.Env = append(os.Environ(), slotEnv+"=1")
	cmd.Stdin, cmd.Stdout = reqR, repW // wire.go
	var gateFile *os.File
	if gateSupported {
		f, g, err := newGateFile(c.dir)
		if err != nil {
			p.log.Warn("slot process without a gate: attempts are not pipelined", "err", err)
		} else {
			gateFile = f
			cmd.ExtraFiles = []*os.File{f} // fd 3
			p.mu.Lock()
			c.gate = g
			p.mu.Unlock()
		}
	}
	cmd.Stderr = c.stderr
	cmd.SysProcAttr = slotSysProcAttr()
	c.cmd, c.reqW, c.enc = cmd, reqW, newWireEncoder(reqW)
	c.repR, c.dec = repR, newWireDecoder(repR)
	err = cmd.Start()
	reqR.Close()
	repW.Close()
	if gateFile != nil {
		gateFile.Close() // the mapping stays
	}
	if err != nil {
		reqW.Close()
		repR.Close()
		forget()
		return nil, err
	}
	c.pmu.Lock()
	c.process = cmd.Process
	if c.killed {
		cmd.Process.Kill()
	}
	c.pmu.Unlock()
	go p.reap(c)

	fail := func(err error) (*slotProc, error) {
		c.kill()
		<-c.exited
		if tail := strings.TrimSpace(string(c.stderr.bytes())); tail != "" {
			err = fmt.Errorf("%w; its stderr: %s", err, lastLines(tail, 3))
		}
		return nil, err
	}
	if err := c.send(&slotRequest{Kind: reqInit, Version: wireVersion, CacheDir: p.cacheDir, Dir: c.dir, DataDir: p.dataDir, Gate: gateFile != nil}); err != nil {
		return fail(err)
	}
	// The hello is read here; the end of ctx, or the time limit, kills the
	// process, which ends the read.
	var late atomic.Bool
	t := time.AfterFunc(helloTimeout, func() { late.Store(true); c.kill() })
	stop := context.AfterFunc(ctx, c.kill)
	m, ok := c.recv()
	t.Stop()
	stop()
	switch {
	case ctx.Err() != nil:
		return fail(ctx.Err())
	case late.Load():
		return fail(fmt.Errorf("slot process did not start within %v", helloTimeout))
	case !ok:
		return fail(fmt.Errorf("slot process exited at start (%s)", c.describeExitWait()))
	case m.Kind != repHello:
		return fail(fmt.Errorf("slot process said %d, not hello", m.Kind))
	case m.Err != "":
		return fail(fmt.Errorf("slot process: %s", m.Err))
	case m.Version != wireVersion:
		return fail(fmt.Errorf("slot process speaks wire version %d, not %d", m.Version, wireVersion))
	}
	p.log.Debug("slot process started", "slot", c.id, "pid", cmd.Process.Pid)
	return c, nil
}

// closeReplies closes the reading end of c's reply pipe, once.
func (c *slotProc) closeReplies() {
	c.repOnce.Do(func() { c.repR.Close() })
}

// reap waits for c to exit and forgets it.
func (p *slotPool) reap(c *slotProc) {
	c.cmd.Wait()
	c.markDead()
	c.reqW.Close()
	// The replies still in the pipe belong to attempts that ended before
	// the process did (a kill for an attempt queued behind them): their
	// Runs read them, then EOF. The pipe is closed once none is left.
	p.mu.Lock()
	drained := len(c.tickets) == 0
	p.mu.Unlock()
	if drained {
		c.closeReplies()
	}
	if err := os.RemoveAll(c.dir); err != nil {
		p.log.Warn("removing a slot directory", "dir", c.dir, "err", err)
	}
	p.mu.Lock()
	delete(p.all, c)
	if i := slices.Index(p.idle, c); i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
	}
	if c.idleTimer != nil {
		c.idleTimer.Stop()
	}
	if c.slow != nil {
		c.slow.Stop()
	}
	if c.gate != nil {
		c.lastStarted, c.gateGone = c.gate.started(), true
		c.gate.unmap()
		c.gate = nil
	}
	p.mu.Unlock()
	close(c.exited)
	p.procs.Done()
}

// closeAll kills every slot process and waits for the Runs and the
// processes to end.
func (p *slotPool) closeAll(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	procs := make([]*slotProc, 0, len(p.all))
	for c := range p.all {
		procs = append(procs, c)
	}
	p.idle = nil
	p.modules = map[string]*moduleBytes{}
	p.mu.Unlock()
	p.close()
	for _, c := range procs {
		c.kill()
	}
	waited := make(chan struct{})
	go func() { p.runs.Wait(); p.procs.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		return fmt.Errorf("headless: attempts or slot processes still running: %w", ctx.Err())
	}
	return os.RemoveAll(p.baseDir)
}

// pids returns the process ids of the slot processes, only those running
// an attempt when busy is true (for tests).
func (p *slotPool) pids(busy ...bool) []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for c := range p.all {
		if len(busy) > 0 && busy[0] && !c.running.Load() {
			continue
		}
		c.pmu.Lock()
		if c.process != nil {
			pids = append(pids, c.process.Pid)
		}
		c.pmu.Unlock()
	}
	return pids
}

// send writes a request to c.
func (c *slotProc) send(m *slotRequest) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.enc.Encode(m)
}

// recv reads c's next reply; ok is false once its pipe ended (the process
// exited or was killed). Only c's owner calls it.
func (c *slotProc) recv() (m *slotReply, ok bool) {
	m = new(slotReply)
	if err := c.dec.Decode(m); err != nil {
		return nil, false
	}
	return m, true
}

// kill kills the process (SIGKILL); it is reaped by reap.
func (c *slotProc) kill() {
	c.pmu.Lock()
	c.killed = true
	if c.process != nil {
		c.process.Kill()
	}
	c.pmu.Unlock()
	c.markDead()
}

func (c *slotProc) markDead() { c.deadOnce.Do(func() { close(c.dead) }) }

func (c *slotProc) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// wasKilled reports whether kill was called.
func (c *slotProc) wasKilled() bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.killed
}

// describeExit says how c ended, after it was reaped; killed says whether
// the Runner had killed it.
func (c *slotProc) describeExit(killed bool) string {
	st := c.cmd.ProcessState
	msg := "unknown exit"
	if st != nil {
		msg = st.String()
	}
	tail := strings.TrimSpace(string(c.stderr.bytes()))
	switch {
	case strings.Contains(tail, "out of memory"):
		msg += " (out of memory)"
	case !killed && st != nil && strings.Contains(st.String(), "killed"):
		msg += " (SIGKILL from outside the worker, perhaps the kernel's out-of-memory killer)"
	}
	if tail != "" {
		msg += "; stderr: " + lastLines(tail, 3)
	}
	return msg
}

// outOfAddressSpace reports whether c, exited, ran out of the address
// space it limited itself to (limitAddressSpace): the Go runtime, refused
// address space, ends the process with "fatal error: out of memory".
func (c *slotProc) outOfAddressSpace() bool {
	return addressSpaceLimited && strings.Contains(string(c.stderr.bytes()), "fatal error: out of memory")
}

// describeExitWait is describeExit once c has exited.
func (c *slotProc) describeExitWait() string {
	killed := c.wasKilled()
	<-c.exited
	return c.describeExit(killed)
}

// lastLines returns the first line that starts with "fatal error" or
// "panic", else the last n lines of s, joined with " | ".
func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "fatal error") || strings.HasPrefix(l, "panic") {
			return clip(l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return clip(strings.Join(lines, " | "))
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	mu  sync.Mutex
	b   []byte
}

// Write implements io.Writer.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.b...)
}
