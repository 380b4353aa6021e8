package wasmworker

import (
	"slices"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// How much an adaptive queue (Config.MaxQueue) holds: about queueAhead of
// work per slot, and at most queueBytes of payload (stdin, inputs and
// checkpoints of the waiting attempts).
const (
	queueAhead = 100 * time.Millisecond
	queueBytes = 16 << 20
)

// recentRuns is a moving average of the run time and payload of the
// attempts that ended.
type recentRuns struct {
	n     int
	run   float64 // ns
	bytes float64
}

func (r *recentRuns) add(run time.Duration, bytes int) {
	const weight = 1.0 / 8
	if r.n == 0 {
		r.run, r.bytes = float64(run), float64(bytes)
	} else {
		r.run += weight * (float64(run) - r.run)
		r.bytes += weight * (float64(bytes) - r.bytes)
	}
	r.n++
}

// queueFor is the queue for slots slots whose attempts run for run and
// carry bytes of payload on average: enough to keep every slot busy for
// queueAhead, no more than queueBytes of payload, between one per slot and
// most.
func queueFor(slots, most int, run time.Duration, bytes float64) int {
	q := float64(most)
	if run > 0 {
		q = min(q, float64(slots)*float64(queueAhead)/float64(run))
	}
	if bytes > 0 {
		q = min(q, queueBytes/bytes)
	}
	return min(max(int(q), slots), most)
}

// adaptQueue records an ended attempt and, with an adaptive queue, sets the
// queue it asks for when the attempts call for a clearly different one
// (twice as much, or half as much: run times jitter). It reports whether
// to announce it now, in a heartbeat before the next tick: at most once a
// second, as a heartbeat renews every lease the worker holds. A change
// within the second is announced when the second is over: otherwise the
// server would go on with the queue it last heard of until the next tick
// (3 s with a 15 s lease), and a queue shrunk by shrinkQueueForRunning and
// grown back at once stayed short for that long. w.mu is held.
func (w *Worker) adaptQueue(run time.Duration, bytes int) bool {
	if w.cfg.MaxQueue <= w.cfg.Queue {
		return false
	}
	now := time.Now()
	w.lastEnd = now
	w.recent.add(run, bytes)
	if w.recent.n < 4 {
		return false
	}
	q := queueFor(w.cfg.Slots, w.cfg.MaxQueue, time.Duration(w.recent.run), w.recent.bytes)
	if q == w.queue || (q < 2*w.queue && 2*q > w.queue && q != w.cfg.MaxQueue && q != w.cfg.Slots) {
		return false
	}
	w.queue = q
	if wait := w.announced.Add(time.Second).Sub(now); wait > 0 {
		if !w.announceLater {
			w.announceLater = true
			time.AfterFunc(wait, func() {
				w.mu.Lock()
				w.announceLater = false
				w.announced = time.Now()
				queue := w.queue
				w.mu.Unlock()
				w.log.Info("queue adapted to the tasks", "queue", queue, "slots", w.cfg.Slots)
				w.DeviceChanged() // the heartbeat carries the queue as it is then
			})
		}
		return false
	}
	w.announced = now
	return true
}

// shrinkQueueForRunning shrinks an adaptive queue when the attempts now
// running have already run far longer than those that ended (w.mu held):
// after a burst of short attempts the queue is long, and would stay so
// until the first of the long ones that follow ends, while the server
// fills it with more of them that then wait here as other workers idle.
// The run time it goes by is the median of the running attempts' ages,
// once at least half the slots run one, so that one straggler among short
// attempts does not shrink it. It only shrinks: adaptQueue grows it again
// as attempts end. (The browser's runner queues attempts itself, so the
// worker does not know when they start: not there.)
//
// Nor does it shrink while attempts still end (one did within that long
// run time): the running attempts are then old only because they wait,
// for a slot process that starts (the first attempts of a worker wait
// 100 ms and more) or for the CPU, not because they run long. It shrank
// the queue of the dispatch benchmark's workers from 512 to 16 at their
// first heartbeat, and the server kept the short queue until the next.
func (w *Worker) shrinkQueueForRunning(now time.Time) {
	if w.cfg.MaxQueue <= w.cfg.Queue || w.cfg.RunnerQueues {
		return
	}
	var ages []time.Duration
	for _, a := range w.running {
		if !a.started.IsZero() {
			ages = append(ages, now.Sub(a.started))
		}
	}
	if len(ages) == 0 || 2*len(ages) < w.cfg.Slots {
		return
	}
	slices.Sort(ages)
	age := ages[len(ages)/2]
	long := max(queueAhead, time.Duration(2*w.recent.run))
	if age < long || now.Sub(w.lastEnd) < long {
		return
	}
	if q := queueFor(w.cfg.Slots, w.cfg.MaxQueue, age, w.recent.bytes); q < w.queue {
		w.queue = q
	}
}

// PayloadBytes is about the size of an assignment's data: stdin, inputs,
// the checkpoint to restore and the arguments.
func PayloadBytes(as *protocol.Assign) int {
	n := len(as.Stdin.Data) + len(as.Restore.Data)
	for _, in := range as.Inputs {
		n += len(in.Name) + len(in.Data)
	}
	for _, a := range as.Args {
		n += len(a)
	}
	return n
}
