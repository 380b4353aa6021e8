package server

import (
	"context"
	"errors"
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
type turns struct {
	mu       sync.Mutex
	limit    int64           // units at once, at most
	perOwner int64           // of one owner
	busy     int64           // units taken
	owners   map[int64]int64 // of them, by owner
	freed    chan struct{}   // closed (and replaced) when a turn is given back
	waiting  atomic.Int64    // requests waiting for a turn, for tests
}

func newTurns(limit, perOwner int64) *turns {
	return &turns{limit: limit, perOwner: perOwner, owners: map[int64]int64{}, freed: make(chan struct{})}
}

// acquire waits for a turn of n units (at most perOwner) of owner's, and
// returns the function that gives it back; the error is ctx's.
func (u *turns) acquire(ctx context.Context, owner, n int64) (func(), error) {
	n = min(max(n, 1), u.perOwner)
	u.waiting.Add(1)
	defer u.waiting.Add(-1)
	for {
		u.mu.Lock()
		if u.busy+n <= u.limit && u.owners[owner]+n <= u.perOwner {
			u.busy += n
			u.owners[owner] += n
			u.mu.Unlock()
			var once sync.Once
			return func() { once.Do(func() { u.release(owner, n) }) }, nil
		}
		freed := u.freed
		u.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-freed:
		}
	}
}

// release gives back a turn of n units of owner's.
func (u *turns) release(owner, n int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.busy -= n
	if u.owners[owner] -= n; u.owners[owner] <= 0 {
		delete(u.owners, owner)
	}
	close(u.freed)
	u.freed = make(chan struct{})
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
