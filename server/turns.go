package server

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cyclepool/cyclepool/internal/workflow"
)

// turns bounds work that holds memory while it runs, such as the bodies of
// uploads and submissions being read and checked: at most limit units at
// once, at most perOwner of them one owner's, so that one owner's work
// does not hold the others' back. Units are whatever the caller counts
// (uploads, bytes). A request waits for its turn until its context ends.
//
// Turns go in the order they were asked for: a request that waits for
// room does not see later, smaller ones take the room as it frees (a
// stream of small requests would otherwise keep a large one waiting until
// its context ended). Only a request past its owner's share steps aside:
// it waits for its owner's turns, not the others'.
type turns struct {
	mu       sync.Mutex
	limit    int64           // units at once, at most
	perOwner int64           // of one owner
	busy     int64           // units taken
	owners   map[int64]int64 // of them, by owner
	queue    []*turnRequest  // requests waiting, oldest first
	waiting  atomic.Int64    // requests waiting for a turn, for tests
}

// turnRequest is a request waiting in turns.queue.
type turnRequest struct {
	owner, n int64
	given    chan struct{} // closed when the turn is given
}

func newTurns(limit, perOwner int64) *turns {
	return &turns{limit: limit, perOwner: perOwner, owners: map[int64]int64{}}
}

// acquire waits for a turn of n units (at most perOwner) of owner's, and
// returns the function that gives it back; the error is ctx's. A turn free
// at once is taken even when ctx has ended.
func (u *turns) acquire(ctx context.Context, owner, n int64) (func(), error) {
	n = min(max(n, 1), u.perOwner)
	var once sync.Once
	release := func() { once.Do(func() { u.release(owner, n) }) }
	r := &turnRequest{owner: owner, n: n, given: make(chan struct{})}
	u.mu.Lock()
	u.queue = append(u.queue, r)
	u.giveLocked()
	u.mu.Unlock()
	select {
	case <-r.given:
		return release, nil
	default:
	}
	u.waiting.Add(1)
	defer u.waiting.Add(-1)
	select {
	case <-r.given:
		return release, nil
	case <-ctx.Done():
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	select {
	case <-r.given: // given as the context ended: given back
		u.releaseLocked(owner, n)
	default:
		u.queue = slices.DeleteFunc(u.queue, func(q *turnRequest) bool { return q == r })
		u.giveLocked() // those it held back may go
	}
	return nil, ctx.Err()
}

// giveLocked gives turns to the waiting requests, oldest first, while they
// fit: one past its owner's share is passed over, one that waits for room
// holds back those behind it. u.mu held.
func (u *turns) giveLocked() {
	for i := 0; i < len(u.queue); {
		r := u.queue[i]
		if u.owners[r.owner]+r.n > u.perOwner {
			i++
			continue
		}
		if u.busy+r.n > u.limit {
			return
		}
		u.busy += r.n
		u.owners[r.owner] += r.n
		close(r.given)
		u.queue = slices.Delete(u.queue, i, i+1)
	}
}

// release gives back a turn of n units of owner's.
func (u *turns) release(owner, n int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.releaseLocked(owner, n)
}

// releaseLocked is release with u.mu held.
func (u *turns) releaseLocked(owner, n int64) {
	u.busy -= n
	if u.owners[owner] -= n; u.owners[owner] <= 0 {
		delete(u.owners, owner)
	}
	u.giveLocked()
}

// submissionTurns bounds the workflow files read, checked and written at
// once, by their size: a file takes about 15 times its size in memory
// while it is parsed and written (8 submissions of a 7 MiB file held 821
// MiB at once before). Small files, such as one interactive task, have
// turns of their own, so that large ones do not hold them back.
type submissionTurns struct {
	small, large *turns
}

// Submission turns: files of at most smallSubmission bytes share
// smallSubmissions bytes at once (an owner's at most a quarter of them);
// larger ones share two of the largest workflow files, an owner's one.
const (
	smallSubmission  = 64 << 10
	smallSubmissions = 8 << 20
	submissionWait   = 30 * time.Second
)

func newSubmissionTurns() submissionTurns {
	return submissionTurns{
		small: newTurns(smallSubmissions, smallSubmissions/4),
		large: newTurns(2*workflow.MaxFileSize, workflow.MaxFileSize),
	}
}

// errSubmissionsBusy says a submission waited submissionWait for a turn.
var errSubmissionsBusy = errors.New("too many workflows are being submitted at once; try again shortly")

// acquire waits up to submissionWait for a turn for owner's file of size
// bytes (negative: not known, counted as the largest), and returns the
// function that gives it back.
func (t submissionTurns) acquire(ctx context.Context, owner, size int64) (func(), error) {
	if size < 0 || size > workflow.MaxFileSize {
		size = workflow.MaxFileSize
	}
	u := t.large
	if size <= smallSubmission {
		u = t.small
	}
	wctx, cancel := context.WithTimeout(ctx, submissionWait)
	defer cancel()
	release, err := u.acquire(wctx, owner, size)
	if err != nil {
		return nil, errSubmissionsBusy
	}
	return release, nil
}
