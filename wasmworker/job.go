// Package wasmworker is the worker side of cyclepool: it connects to one of
// several servers over the worker WebSocket, keeps a number of slots busy
// with task attempts, heartbeats their progress, uploads checkpoints and
// delivers results. How a task module actually runs is up to a Runner: the
// headless runner (package headless) uses wazero, the browser runner runs
// modules in Web Workers.
package wasmworker

import (
	"context"
	"errors"
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// ErrNoSuchModule is what a Job's Fetch returns, wrapped, when the server
// says it has no such module (404): the task's fault. Any other failure to
// fetch (the network, the server's trouble) is the worker's, and charges
// the task nothing.
var ErrNoSuchModule = errors.New("the server has no such module")

// Runner runs task attempts. Run must return when ctx is cancelled, with an
// Outcome whose Reason is protocol.ReasonCancelled.
type Runner interface {
	Run(ctx context.Context, job *Job) *Outcome
}

// DataHolder is a Runner that keeps data blobs between attempts: the worker
// tells the server which (Hello.Data), so that tasks reading them come to
// it (locality).
type DataHolder interface {
	// Holding returns the ids of the blobs kept, at most
	// protocol.MaxHelloData.
	Holding() []string
}

// Host is what a running attempt may ask of the worker.
type Host interface {
	// Progress records the fraction of the attempt done (0 to 1).
	Progress(fraction float64)
	// Checkpoint hands state to the server and returns once the server has
	// committed it, or with an error when it was refused or could not be
	// delivered in time.
	Checkpoint(ctx context.Context, state []byte) error
	// Started tells that the attempt begins to run, once it waits no
	// more for a slot process, its module or attempts queued ahead of it.
	// The worker takes a running attempt's age from then, and shrinks its
	// queue when the attempts it runs are long: time spent waiting (for
	// the first slot processes of a fresh worker, say) is not theirs. A
	// Runner that queues attempts itself (Config.RunnerQueues), whose
	// worker never shrinks its queue that way, need not call it.
	Started()
}

// Job is one attempt to run.
type Job struct {
	Assign   *protocol.Assign // what the server sent: args, stdin, inputs, restore, seed, limits
	ModuleID string           // "sha256:<hex>"
	// Fetch returns the module bytes. A runner that already holds a compiled
	// module for ModuleID need not call it. It is nil in the browser, where
	// the page fetches and caches modules itself. A module the server
	// does not have is an error wrapping ErrNoSuchModule.
	Fetch func(ctx context.Context) ([]byte, error)
	Host  Host
	// Server is the address of the server that assigned the attempt, to
	// which the URLs of its data are relative.
	Server string
	// Upload says the worker uploads large outputs over HTTP: the runner
	// may leave outputs of protocol.UploadMinBytes or more in files
	// (Outcome.Files) instead of reading them into memory.
	Upload bool
}

// Outcome is how an attempt ended.
type Outcome struct {
	// Outputs holds "stdout" first, then every file written under /out,
	// named by its path relative to /out, sorted by name.
	Outputs []protocol.Blob
	// Files are outputs the runner left in files of its own (Job.Upload),
	// which the worker uploads and then removes.
	Files []OutputFile
	// Uploaded are the outputs the worker uploaded (set by the worker).
	Uploaded []protocol.Uploaded
	// Log is the task's stderr, at most Limits.LogBytes long.
	Log []byte
	// Reason is empty on success, otherwise one of the protocol.Reason*
	// constants; Message says what happened in words.
	Reason   string
	Message  string
	Duration time.Duration
}

// OutputFile is an output a runner left in a file for the worker to
// upload: the output Name, in the file at Path of Size bytes.
type OutputFile struct {
	Name string
	Path string
	Size int64
}
