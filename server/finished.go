package server

import (
	"iter"
	"slices"
	"sync"

	"github.com/cyclepool/cyclepool/internal/store"
)

// finishWaiters lets requests wait for a workflow to reach a final state.
// The listener (listenOnce) hears of each workflow that finished, on any
// replica (store.ChannelFinished: the database notifies it when the
// transaction that ended the workflow commits), and wakes its waiters; a
// completion batch of this replica that finished it wakes them sooner,
// with its status when the batch read it (store.CompleteWatching).
type finishWaiters struct {
	mu sync.Mutex
	// byID has the waiters of each workflow, and whether each wants its
	// status (addWatching).
	byID map[string]map[chan wake]bool
	// reading has the workflows whose statuses completion batches of
	// this replica are reading (beginReading), and whether the listener
	// heard them finish meanwhile: their waiters wait for the batch,
	// whose commit's notification would otherwise wake them first,
	// without the status.
	reading map[string]*readingOf
}

// readingOf is a workflow in finishWaiters.reading.
type readingOf struct {
	batches int  // the batches reading it
	heard   bool // the listener heard it finish meanwhile
}

// wake is what a waiter is told: the workflow finished (else it may have:
// look again), and its status when one was read for the waiters.
type wake struct {
	finished bool
	status   *store.FinishedStatus
}

func newFinishWaiters() *finishWaiters {
	return &finishWaiters{byID: map[string]map[chan wake]bool{}, reading: map[string]*readingOf{}}
}

// add registers a waiter for workflow id. The channel receives one wake,
// after which the waiter is gone. Call the returned function when done
// waiting.
func (f *finishWaiters) add(id string) (<-chan wake, func()) {
	return f.register(id, false)
}

// addWatching is add for a waiter that wants the workflow's status: a
// completion batch that finishes the workflow reads it for the waiters
// (beginReading).
func (f *finishWaiters) addWatching(id string) (<-chan wake, func()) {
	return f.register(id, true)
}

func (f *finishWaiters) register(id string, wantStatus bool) (<-chan wake, func()) {
	ch := make(chan wake, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	set := f.byID[id]
	if set == nil {
		set = map[chan wake]bool{}
		f.byID[id] = set
	}
	set[ch] = wantStatus
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if set, ok := f.byID[id]; ok {
			delete(set, ch)
			if len(set) == 0 {
				delete(f.byID, id)
			}
		}
	}
}

// finished wakes the waiters of workflow id: it has finished. status, when
// not nil, is its status, read once it had: the waiters share it.
func (f *finishWaiters) finished(id string, status *store.FinishedStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.finishedLocked(id, status)
}

func (f *finishWaiters) finishedLocked(id string, status *store.FinishedStatus) {
	for ch := range f.byID[id] {
		ch <- wake{finished: true, status: status}
	}
	delete(f.byID, id)
}

// all wakes every waiter to look again: the listener's connection broke,
// and notifications sent meanwhile were lost.
func (f *finishWaiters) all() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, set := range f.byID {
		for ch := range set {
			ch <- wake{}
		}
		delete(f.byID, id)
	}
}

// beginReading returns up to n distinct workflows of ids whose waiters
// want their status, for a completion batch to read the statuses of;
// until endReading, the listener's word that one finished (heard) waits
// for the batch. Call endReading with them when the waiters have been
// told what the batch found.
func (f *finishWaiters) beginReading(ids iter.Seq[string], n int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.byID) == 0 {
		return nil // no waiter: ids is not even looked at
	}
	var out []string
	for id := range ids {
		if len(out) == n {
			break
		}
		if slices.Contains(out, id) {
			continue
		}
		for _, want := range f.byID[id] {
			if want {
				out = append(out, id)
				r := f.reading[id]
				if r == nil {
					r = &readingOf{}
					f.reading[id] = r
				}
				r.batches++
				break
			}
		}
	}
	return out
}

// endReading ends beginReading's hold on ids: the waiters of those the
// listener heard finish meanwhile, and the batch did not wake, are woken
// now.
func (f *finishWaiters) endReading(ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		r := f.reading[id]
		if r == nil {
			continue
		}
		if r.batches--; r.batches > 0 {
			continue
		}
		delete(f.reading, id)
		if r.heard {
			f.finishedLocked(id, nil)
		}
	}
}

// heard is the listener's word that workflow id finished: its waiters are
// woken, or, while a batch reads its status, once the batch is done.
func (f *finishWaiters) heard(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r := f.reading[id]; r != nil {
		r.heard = true
		return
	}
	f.finishedLocked(id, nil)
}

// waiting counts the registered waiters.
func (f *finishWaiters) waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, set := range f.byID {
		n += len(set)
	}
	return n
}
