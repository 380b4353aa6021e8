package headless

import (
	"fmt"
	"os"
	"time"
)

// dutyPeriod is the period of the CPU share's duty cycle: in each, a slot
// process running an attempt computes for share × dutyPeriod and is
// stopped for the rest. Short enough that progress and checkpoints still
// flow several times a second; long enough that two signals per period
// cost nothing measurable.
const dutyPeriod = 100 * time.Millisecond

// checkCPUShare validates Config.CPUShare for a Runner of the given mode.
func checkCPUShare(share int, inProcess bool) error {
	switch {
	case share < 0 || share > 100:
		return fmt.Errorf("headless: CPU share %d%% is not between 1 and 100", share)
	case share == 0 || share == 100:
		return nil
	case inProcess:
		return fmt.Errorf("headless: a CPU share of %d%% needs slot processes: attempts run in-process cannot be held back", share)
	case !dutyCycleSupported:
		return fmt.Errorf("headless: a CPU share of %d%% is supported on Linux only", share)
	}
	return nil
}

// dutyCycle holds the slot processes running attempts to share percent of
// the CPU time, as BOINC's "use at most N% of CPU time" does: each
// dutyPeriod it lets them compute for share of it, then stops them
// (SIGSTOP) for the rest and continues them (SIGCONT). The clock a task
// sees is its own and does not notice; its wall-time limit does (the
// limit is real time). It returns when the pool closes, having continued
// every process it stopped. Only Linux is supported: there the kernel
// kills a stopped slot process whose worker died (its parent-death
// signal), where elsewhere it would wait, stopped, for good.
func (p *slotPool) dutyCycle(share int) {
	on := dutyPeriod * time.Duration(share) / 100
	off := dutyPeriod - on
	timer := time.NewTimer(on)
	defer timer.Stop()
	var stopped []*os.Process
	resume := func() {
		for _, pr := range stopped {
			_ = pr.Signal(continueSignal) // an error: it has exited meanwhile
		}
		clear(stopped)
		stopped = stopped[:0]
	}
	defer resume()
	for {
		select {
		case <-p.closing.Done():
			return
		case <-timer.C:
		}
		stopped = p.stopRunning(stopped)
		timer.Reset(off)
		select {
		case <-p.closing.Done():
			return
		case <-timer.C:
		}
		resume()
		timer.Reset(on)
	}
}

// stopRunning stops (SIGSTOP) every slot process running an attempt and
// appends it to stopped.
func (p *slotPool) stopRunning(stopped []*os.Process) []*os.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.all {
		if !c.running.Load() {
			continue
		}
		c.pmu.Lock()
		pr := c.process
		c.pmu.Unlock()
		if pr != nil && pr.Signal(stopSignal) == nil {
			stopped = append(stopped, pr)
		}
	}
	return stopped
}
