// Package sdk is the task author's side of the cyclepool task ABI
// (docs/TASK_ABI.md). A task is a WASI preview 1 command built with
// GOOS=wasip1 GOARCH=wasm; it reads argv, stdin and files under /in, writes
// stdout and files under /out, and uses this package to report progress and
// to checkpoint and restore its state.
//
// Built for any other GOOS, the functions work without a platform: progress
// is discarded, a checkpoint is never due and Restore finds nothing. That lets
// a task run natively, for tests and for comparing wasm with native speed.
package sdk

import "errors"

// ErrCheckpointRefused is returned by Checkpoint when the platform did not
// save the state (the attempt lost its lease, or the state is too large).
var ErrCheckpointRefused = errors.New("cyclepool: checkpoint refused")

// Progress reports the fraction of the task done, from 0 to 1.
func Progress(fraction float64) {
	if fraction < 0 {
		fraction = 0
	}
	if fraction > 1 {
		fraction = 1
	}
	progress(fraction)
}

// CheckpointDue reports whether the platform wants a checkpoint now. Tasks
// call it often (it is cheap) and call Checkpoint when it returns true.
func CheckpointDue() bool { return checkpointDue() != 0 }

// Checkpoint saves state so that a later attempt of this task, possibly on
// another worker, can continue from it. It returns once the platform has the
// state.
func Checkpoint(state []byte) error {
	if checkpoint(state) != 0 {
		return ErrCheckpointRefused
	}
	return nil
}

// Restore returns the latest state saved by Checkpoint in an earlier attempt
// of this task, and false when there is none.
func Restore() ([]byte, bool) {
	n := restore(nil)
	if n == 0 {
		return nil, false
	}
	buf := make([]byte, n)
	if m := restore(buf); m != n {
		return nil, false
	}
	return buf, true
}
