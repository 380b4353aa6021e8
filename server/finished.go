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
