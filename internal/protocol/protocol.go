// Package protocol holds the frames that workers and servers exchange over the
// worker WebSocket (/ws/worker) and the codec that turns them into bytes.
//
// Every frame is a JSON header. A frame that carries payloads (task inputs,
// checkpoints, outputs, logs) is sent as a binary WebSocket message laid out
// as a 4-byte big-endian header length, the JSON header, then the payload
// bytes of every Blob in the header, concatenated in the order they appear.
// A frame without payload may be sent as a text message holding only the JSON
// header. docs/PROTOCOL.md is the normative description.
package protocol

// Version is the protocol version spoken by this build. A hello with another
// version is refused with an error frame.
const Version = 1

// Frame types.
const (
	TypeHello      = "hello"
	TypeWelcome    = "welcome"
	TypeAssign     = "assign"
	TypeHeartbeat  = "heartbeat"
	TypeCheckpoint = "checkpoint"
	TypeResult     = "result"
	TypeFail       = "fail"
	TypeCancel     = "cancel"
	TypeAck        = "ack"
	TypeError      = "error"
)

// Worker kinds reported in hello.
const (
	KindHeadless = "headless"
	KindBrowser  = "browser"
)

// Frame is one protocol message. Type says which of the other fields is set.
type Frame struct {
	Type       string      `json:"t"`
	Hello      *Hello      `json:"hello,omitempty"`
	Welcome    *Welcome    `json:"welcome,omitempty"`
	Assign     []Assign    `json:"assign,omitempty"`
	Heartbeat  *Heartbeat  `json:"heartbeat,omitempty"`
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	Results    []Result    `json:"results,omitempty"`
	Fails      []Fail      `json:"fails,omitempty"`
	Cancel     *Cancel     `json:"cancel,omitempty"`
	Acks       []Ack       `json:"acks,omitempty"`
	Error      *Error      `json:"error,omitempty"`
}

// Blob is a named payload. Only Name and Size travel in the header; Data is
// the matching slice of the frame's payload, filled in by Decode.
type Blob struct {
	Name string `json:"name,omitempty"`
	Size int    `json:"size"`
	Data []byte `json:"-"`
}

// Unknown is the value a worker reports for a device property it cannot
// observe; it never guesses.
const Unknown = "unknown"

// Device is what a worker knows of the machine it runs on. String fields hold
// Unknown when the platform does not expose the property; numeric fields are
// pointers and are nil when unknown.
type Device struct {
	Battery       *float64 `json:"battery,omitempty"`  // 0..1
	Charging      string   `json:"charging,omitempty"` // "yes", "no" or "unknown"
	Connection    string   `json:"connection,omitempty"`
	DownlinkMbps  *float64 `json:"downlink_mbps,omitempty"`
	RTTMillis     *float64 `json:"rtt_ms,omitempty"`
	SaveData      string   `json:"save_data,omitempty"`  // "yes", "no" or "unknown"
	Online        string   `json:"online,omitempty"`     // "yes", "no" or "unknown"
	Visibility    string   `json:"visibility,omitempty"` // "visible", "hidden" or "unknown"
	Cores         int      `json:"cores,omitempty"`
	MemoryGiB     *float64 `json:"memory_gib,omitempty"`
	UserAgent     string   `json:"user_agent,omitempty"`
	Paused        bool     `json:"paused,omitempty"` // the volunteer's settings forbid work now
	PausedBecause string   `json:"paused_because,omitempty"`
}

// Hello is the first frame a worker sends.
type Hello struct {
	Version int    `json:"version"`
	Kind    string `json:"kind"`
	Slots   int    `json:"slots"`
	// Queue is how many attempts beyond Slots the worker accepts ahead of
	// time (0 to QueueLimit(Slots)); they wait at the worker for a
	// free slot (and their leases are renewed like running ones), which
	// hides the dispatch round trip. A heartbeat may change it.
	Queue int `json:"queue,omitempty"`
	// WorkerID and ReconnectToken, when set, resume an earlier identity so
	// that attempts held by that identity can still report.
	WorkerID       string `json:"worker_id,omitempty"`
	ReconnectToken string `json:"reconnect_token,omitempty"`
	// Running lists attempts the worker is still running from an earlier
	// connection; the server keeps their leases if they are still held.
	Running []int64 `json:"running,omitempty"`
	// RunningComplete says Running lists every attempt this process was
	// assigned under WorkerID and has not had acknowledged: it was
	// connected before, and cut nothing from the list. An attempt
	// assigned before this hello that it does not list never reached it
	// (its frame was lost with the old socket or server), and ends
	// charged to nobody. A process that resumes an identity kept from an
	// earlier run cannot know what that run held, and says false.
	RunningComplete bool   `json:"running_complete,omitempty"`
	Volunteer       string `json:"volunteer,omitempty"` // browser volunteer id, kept in the browser
	Device          Device `json:"device"`
	// Features lists what this worker can do beyond the protocol's
	// version: FeatureSetup. The server gives a worker only the tasks it
	// can run as they are meant to run.
	Features []string `json:"features,omitempty"`
	// Data lists the data blobs ("sha256:<hex>") the worker keeps in its
	// cache, at most MaxHelloData: the server prefers it for tasks that
	// read them (locality).
	Data []string `json:"data,omitempty"`
	// Build is the worker's build (as `cyclepool version` prints it), for
	// display: a worker of another build than the server's is visible in
	// the workers' list. At most 100 bytes are kept.
	Build string `json:"build,omitempty"`
}

// MaxHelloData bounds Hello.Data; a server reads no more.
const MaxHelloData = 4096

// FeatureSetup says the worker lays out a task's Assign.Setup (env, cwd,
// files, outputs by path). A worker without it gets no task that has one:
// it would run the task without its files.
const FeatureSetup = "setup"

// FeatureUpload says the worker uploads large outputs over HTTP
// (Result.Uploaded). A worker without it is given output limits of at
// most InlineOutputBytes, which a result frame carries.
const FeatureUpload = "upload"

// Welcome answers hello.
type Welcome struct {
	WorkerID       string `json:"worker_id"`
	ReconnectToken string `json:"reconnect_token"`
	HeartbeatMS    int    `json:"heartbeat_ms"`
	LeaseMS        int    `json:"lease_ms"`
	MaxFrameBytes  int    `json:"max_frame_bytes"`
	// IdleHeartbeatMS is the interval of a worker that is paused and
	// holds no attempt (none running, queued or awaiting its ack): it
	// renews nothing, so it heartbeats less often, and at once when that
	// changes (it resumes). 0 (a server before it): HeartbeatMS always.
	IdleHeartbeatMS int `json:"idle_heartbeat_ms,omitempty"`
	// UploadKey is the worker's capability for uploading the outputs of
	// the attempts it holds (Result.Uploaded).
	UploadKey string `json:"upload_key,omitempty"`
	// Lost lists attempts from Hello.Running that no longer hold a lease;
	// the worker must stop them.
	Lost []int64 `json:"lost,omitempty"`
}

// Limits bound one attempt.
type Limits struct {
	MemoryPages uint32 `json:"memory_pages"` // 64 KiB pages
	WallMS      int64  `json:"wall_ms"`
	OutputBytes int64  `json:"output_bytes"` // stdout plus every file under /out
	LogBytes    int64  `json:"log_bytes"`    // stderr
}

// Uploads reports whether an attempt with these limits uploads its large
// outputs over HTTP (see InlineOutputBytes).
func (l Limits) Uploads() bool { return l.OutputBytes > InlineOutputBytes }

// Assign gives one task attempt to the worker.
type Assign struct {
	Attempt  int64    `json:"attempt"`
	Task     string   `json:"task"`     // "<workflow id>/<task name>", for logs and display
	Module   string   `json:"module"`   // "sha256:<hex>"
	Args     []string `json:"args"`     // argv[1..]
	Stdin    Blob     `json:"stdin"`    // may be empty
	Inputs   []Blob   `json:"inputs"`   // files under /in
	Restore  Blob     `json:"restore"`  // latest checkpoint, may be empty
	Seed     uint64   `json:"seed"`     // seeds the deterministic random source
	Limits   Limits   `json:"limits"`   //
	CkptMS   int64    `json:"ckpt_ms"`  // wanted checkpoint interval; 0 = never due
	Priority string   `json:"priority"` // "interactive" or "batch"
	// Setup is the task's environment and file system beyond /in and
	// /out (docs/DATA.md); nil for most tasks.
	Setup *Setup `json:"setup,omitempty"`
	// RestoreFrom, when set, is the checkpoint to restore, uploaded over
	// HTTP by an earlier attempt: the worker downloads it (and checks its
	// hash) in place of Restore.
	RestoreFrom *File `json:"restore_from,omitempty"`
}

// Setup is a task's environment, working directory and the files mounted
// into its file system, as the workflow file's env, cwd, files and outputs
// give them (docs/WORKFLOW.md).
type Setup struct {
	Env []string `json:"env,omitempty"` // "NAME=value", sorted by name
	Cwd string   `json:"cwd,omitempty"` // absolute; "" is "/"
	// Files are sorted by path, so that a mount inside another comes
	// after it. An input from an upstream task is not here: it travels
	// as an entry of Assign.Inputs named by its absolute path.
	Files []File `json:"files,omitempty"`
	// Outputs are paths outside /out whose files are outputs too, named
	// by their absolute path.
	Outputs []string `json:"outputs,omitempty"`
	// ScratchBytes bounds what the task writes outside /out.
	ScratchBytes int64 `json:"scratch_bytes,omitempty"`
}

// File is one entry of a task's file system: inline Data, or the blob
// Blob of Size bytes, which the worker downloads from URL (relative to
// the server's address) and checks against its hash.
type File struct {
	Path     string  `json:"path"`
	Data     *string `json:"data,omitempty"`
	Blob     string  `json:"blob,omitempty"`
	Size     int64   `json:"size,omitempty"`
	URL      string  `json:"url,omitempty"`
	Archive  bool    `json:"archive,omitempty"`  // a tar archive unpacked at Path
	Writable bool    `json:"writable,omitempty"` // the task writes a private copy
}

// Progress reports one running attempt in a heartbeat.
type Progress struct {
	Attempt  int64   `json:"attempt"`
	Fraction float64 `json:"fraction"`
}

// Heartbeat renews the leases of the listed attempts and reports device state.
type Heartbeat struct {
	Running []Progress `json:"running"`
	Free    int        `json:"free"` // idle slots
	Device  *Device    `json:"device,omitempty"`
	// Queue, when set, replaces hello's queue from now on (0 to
	// QueueLimit(slots)): a worker may queue more attempts ahead of
	// time when they turn out short and small, and fewer when long.
	Queue *int `json:"queue,omitempty"`
}

// MaxQueuePerSlot and MaxQueue bound a worker's queue (Hello.Queue,
// Heartbeat.Queue): at most MaxQueuePerSlot attempts per slot, and
// MaxQueue in all, wait at a worker ahead of time. The total bound keeps
// what one worker that goes silent can hold (each of its attempts then
// waits for its lease to lapse and uses up one of its task's attempts).
const (
	MaxQueuePerSlot = 32
	MaxQueue        = 1024
)

// QueueLimit is the longest queue a worker of slots slots may ask for.
func QueueLimit(slots int) int { return min(MaxQueuePerSlot*slots, MaxQueue) }

// Checkpoint saves the state of a running attempt; its Blob carries the state.
type Checkpoint struct {
	Attempt int64 `json:"attempt"`
	Seq     int   `json:"seq"` // 1, 2, ... per attempt
	State   Blob  `json:"state"`
	// Blob, when set, is a state the worker uploaded over HTTP first
	// (PUT /checkpoints/{attempt}, docs/PROTOCOL.md), of Size bytes;
	// State is then empty.
	Blob string `json:"blob,omitempty"`
	Size int64  `json:"size,omitempty"`
}

// Result ends an attempt successfully.
type Result struct {
	Attempt    int64  `json:"attempt"`
	Outputs    []Blob `json:"outputs"` // "stdout" and every file under /out
	Log        Blob   `json:"log"`     // stderr, capped
	DurationMS int64  `json:"duration_ms"`
	// Uploaded are the outputs the worker uploaded over HTTP before the
	// result (docs/PROTOCOL.md, "Outputs over HTTP"), by name and blob
	// id; their names are not in Outputs.
	Uploaded []Uploaded `json:"uploaded,omitempty"`
}

// Uploaded names an output uploaded over HTTP: PUT
// /outputs/{attempt}?name=NAME&w=WORKER&k=UPLOAD_KEY answered its Blob id
// ("sha256:<hex>") and Size.
type Uploaded struct {
	Name string `json:"name"`
	Blob string `json:"blob"`
	Size int64  `json:"size"`
}

// Output sizes. An attempt whose Limits.OutputBytes is above
// InlineOutputBytes (a task that is not replicated, given to a worker
// with FeatureUpload) uploads each output of UploadMinBytes or more over
// HTTP with Welcome.UploadKey, and as many smaller ones as keep the rest
// within InlineOutputBudget; the rest travel in the result frame. A
// browser page holds its task's outputs in memory: its attempts' limits
// are at most BrowserOutputBytes.
const (
	InlineOutputBytes  = 64 << 20
	UploadMinBytes     = 1 << 20
	BrowserOutputBytes = 256 << 20
	// InlineOutputBudget bounds the outputs an uploading attempt keeps in
	// its result frame: smaller outputs that would take it past the
	// budget are uploaded too.
	InlineOutputBudget = 32 << 20
)

// Failure reasons, reported in Fail.Reason.
const (
	ReasonMemory    = "limit_memory"    // memory limit exceeded
	ReasonWallTime  = "limit_wall_time" // wall time limit exceeded
	ReasonOutput    = "limit_output"    // output size limit exceeded
	ReasonLog       = "limit_log"       // log size limit exceeded
	ReasonExit      = "exit"            // non-zero exit code
	ReasonTrap      = "trap"            // the module trapped (panic, unreachable, ...)
	ReasonModule    = "module"          // the module does not compile or instantiate, or the server has none such
	ReasonCancelled = "cancelled"       // stopped because the server said cancel
	ReasonWorker    = "worker"          // the worker stopped it (volunteer paused, shutting down)
	// ReasonCrashed: the process (or browser thread) running the attempt
	// died with no limit the worker knows of passed (killed by the
	// kernel's out-of-memory killer, say): as far as the worker can tell,
	// the task brought it down.
	ReasonCrashed = "crashed"
)

// Fail ends an attempt unsuccessfully.
type Fail struct {
	Attempt    int64  `json:"attempt"`
	Reason     string `json:"reason"`
	Message    string `json:"message"`
	Log        Blob   `json:"log"`
	DurationMS int64  `json:"duration_ms"`
}

// Cancel tells a worker to stop attempts.
type Cancel struct {
	Attempts []int64 `json:"attempts"`
	Reason   string  `json:"reason"`
}

// Ack kinds.
const (
	AckCheckpoint = "checkpoint"
	AckResult     = "result"
	AckFail       = "fail"
)

// Ack answers a checkpoint, result or fail after it is committed, or refuses
// it (OK false) when the attempt no longer holds its lease.
type Ack struct {
	Attempt int64  `json:"attempt"`
	Of      string `json:"of"`
	Seq     int    `json:"seq,omitempty"`
	OK      bool   `json:"ok"`
	// Retry, with OK false, means the server could not commit it now (a
	// database error): the worker should send it again shortly.
	Retry bool   `json:"retry,omitempty"`
	Error string `json:"error,omitempty"`
}

// Error is sent before the server closes a socket for a protocol violation.
type Error struct {
	Message string `json:"message"`
}
