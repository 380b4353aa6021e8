package headless

// The wire format between the worker (the parent, slot.go) and a slot
// process (the child, slotchild.go).
//
// The parent starts the child from its own executable (os.Executable) with
// CYCLEPOOL_SLOT_PROCESS=1 in the environment and two pipes: the child reads
// requests from its stdin and writes replies to its stdout (the only
// descriptors a child inherits on every system: Windows passes no others).
// Its stderr goes to the parent, which keeps the last few KiB to explain a
// crash.
//
// Each pipe carries a sequence of messages, each prefixed by its length and
// written with one write (wirecodec.go). Every message is one slotRequest
// (parent to child) or one slotReply (child to parent); Kind says which
// fields are set. Byte payloads (module, stdin, inputs, restore state,
// outputs, log chunks, checkpoint state) travel as a length, then the raw
// bytes. A message is limited to 1 GiB, far above any limit of an attempt.
//
// The conversation, after the child has started:
//
//	parent: init{Version, CacheDir, Dir}
//	child:  hello{Version, Pid}            (or hello{Err}, then it exits)
//	then, any number of times, one at a time:
//	parent: load{ModuleID, Module}         only when this child lacks the module
//	child:  loaded{Err, ModuleErr}
//	parent: run{ModuleID, Assign, Host}
//	child:  log{Data}*  progress{Fraction}*  memory{Message}?
//	        checkpoint{Data} -> parent: checkpointed{Err}   (zero or more; the
//	                                                        child waits for each)
//	child:  done{Outputs, Files, Reason, Message, Took}
//
// log carries, in order, every byte of stderr the attempt keeps (so a child
// that is killed loses no log); done therefore carries no log. The child
// reads its requests on the goroutine that runs the attempts (a hand-off
// between goroutines would cost a thread wake-up per message): while an
// attempt runs it reads nothing but the answer to its checkpoint, which is
// all the parent sends then. memory says
// that the memory limit refused a request (so that a child killed at its
// wall time still fails with limit_memory). The child keeps every module it
// has loaded, compiled, until it exits. It exits when its request pipe is
// closed; the parent kills it (SIGKILL) to cancel an attempt, at the wall
// time limit, and when it has been idle too long.
//
// Pipelined attempts. With a gate (init's Gate: an 8-byte word in a file
// both processes map, passed as file descriptor 3 on Unix), the parent may send the
// run requests of further attempts (up to pipelineDepth in all, of modules
// the child has loaded) while one runs: the child reads them after the
// attempt (or while it waits for a checkpoint's answer, which keeps them in
// order) and runs them one after the other, without sleeping on its pipe in
// between; each attempt's replies follow the previous attempt's done. Before
// it starts run{Seq}, the child records Seq as started in the gate, unless
// the gate's floor is at or above Seq: the parent revoked it (to cancel it,
// or to run it elsewhere because the attempt before it runs long), and the
// child then drops it without a word. Both sides change the gate with
// compare-and-swap, so an attempt either starts here or, once revoked, never
// does: the parent learns which at the moment it revokes, without waiting
// for the child, which may be busy in compiled code.

import (
	"time"

	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/wasmworker"
)

// slotEnv is the environment variable that makes a process a slot process.
const slotEnv = "CYCLEPOOL_SLOT_PROCESS"

// wireVersion changes with any incompatible change of the messages below.
// Parent and child are the same executable, so it only guards against a
// binary replaced on disk while the worker runs.
const wireVersion = 6

type requestKind uint8

const (
	reqInit requestKind = iota + 1
	reqLoad
	reqRun
	reqCheckpointed
)

// slotRequest is a message from the parent to a slot process.
type slotRequest struct {
	Kind requestKind

	// init
	Version  int
	CacheDir string // wazero's compilation cache; "" = in memory only
	Dir      string // the child's own directory, made and removed by the parent
	DataDir  string // the worker's data cache (data.go)
	Gate     bool   // file descriptor 3 holds the gate (gate_unix.go)

	// load and run
	ModuleID string
	Module   []byte // load: the module's bytes, already checked against ModuleID

	// run
	Assign *protocol.Assign
	Host   bool   // the job has a Host: relay progress and checkpoints
	Seq    uint32 // the attempt's number in this slot process, from 1; it names the outputs the attempt spills (spillPrefix)

	// checkpointed
	Err string // "" = saved
}

type replyKind uint8

const (
	repHello replyKind = iota + 1
	repLoaded
	repLog
	repProgress
	repMemory
	repCheckpoint
	repDone
)

// slotReply is a message from a slot process to the parent.
type slotReply struct {
	Kind replyKind

	// hello
	Version int
	Pid     int

	// hello, loaded: what went wrong ("" = nothing)
	Err string
	// loaded: Err is the module's fault (reason module), not the child's
	ModuleErr bool

	// log: stderr bytes; checkpoint: the state to save
	Data []byte

	// progress
	Fraction float64

	// memory, done
	Message string

	// done
	Outputs []protocol.Blob
	Files   []wasmworker.OutputFile // outputs left in files for the worker to upload
	Reason  string
	Took    time.Duration // how long the attempt ran in the child
}

// maxSlotCheckpoint bounds the state of a checkpoint a slot process hands
// to its worker: what a checkpoint message carries, less room for its
// other fields.
const maxSlotCheckpoint = maxWireMessage - 1<<10
