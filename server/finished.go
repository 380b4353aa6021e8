package server

import "sync"

// finishWaiters lets requests wait for a workflow to reach a final state.
// The listener (listenOnce) hears of each workflow that finished, on any
// replica (store.ChannelFinished: the database notifies it when the
// transaction that ended the workflow commits), and wakes its waiters.
type finishWaiters struct {
	mu   sync.Mutex
	byID map[string]map[chan bool]struct{}
}

func newFinishWaiters() *finishWaiters {
	return &finishWaiters{byID: map[string]map[chan bool]struct{}{}}
}

// add registers a waiter for workflow id. The channel receives true when
// the workflow finished, false when it may have (notifications may have
// been missed: look again); either way the waiter is then gone. Call the
// returned function when done waiting.
func (f *finishWaiters) add(id string) (<-chan bool, func()) {
	ch := make(chan bool, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	set := f.byID[id]
	if set == nil {
		set = map[chan bool]struct{}{}
		f.byID[id] = set
	}
	set[ch] = struct{}{}
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

// finished wakes the waiters of workflow id: it has finished.
func (f *finishWaiters) finished(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.byID[id] {
		ch <- true
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
			ch <- false
		}
		delete(f.byID, id)
	}
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

// echoes pairs the two wake-ups a submission on this replica gives the
// dispatcher: the submit handler's, after the commit, and the ready
// notification the commit sends to every replica, this one included
// (store.ReadyPayload names the replica and workflow). Whichever comes
// second is dropped: the round the first started reads the new tasks, and
// a second round would only read the ready tasks again, on the latency
// path of the next submission. Ids whose notification never comes (the
// listener was down) are forgotten when the listener reconnects.
type echoes struct {
	mu   sync.Mutex
	seen map[string]struct{}
}

// maxEchoes bounds the ids echoes keeps.
const maxEchoes = 4096

func newEchoes() *echoes { return &echoes{seen: map[string]struct{}{}} }

// first reports whether this is the first of the two wake-ups for
// workflow id.
func (e *echoes) first(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.seen[id]; ok {
		delete(e.seen, id)
		return false
	}
	if len(e.seen) >= maxEchoes {
		clear(e.seen) // lost notifications: waking twice is harmless
	}
	e.seen[id] = struct{}{}
	return true
}

// reset forgets every id: notifications may have been lost.
func (e *echoes) reset() {
	e.mu.Lock()
	defer e.mu.Unlock()
	clear(e.seen)
}
