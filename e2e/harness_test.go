//go:build unix

// Package e2e tests cyclepool end to end: the real binary runs as separate
// server and worker processes, on a real PostgreSQL (internal/pgtest), talking
// over real WebSockets and running tasks with real wazero.
// They run on Unix only: they stop and kill process groups with signals.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/pgtest"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
)

// binary is the cyclepool binary built once for the package.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "cyclepool-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "cyclepool")
	root, err := taskbuild.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cmd := exec.Command("go", "build", "-o", binary, "./cmd/cyclepool")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build cyclepool:", err)
		os.Exit(1)
	}
	// Every server started here accepts this operator key, and every
	// worker presents it: the tests' workers are the operator's own
	// machines unless a test starts one with --key= (a volunteer).
	os.Setenv("CYCLEPOOL_WORKER_KEY", "cwk_e2e_"+strconv.FormatInt(time.Now().UnixNano(), 36))
	code := 0
	func() {
		defer pgtest.Shutdown()
		defer stopChromium()
		code = m.Run()
	}()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a cyclepool process started by a test.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *lineLog
	done chan struct{}
}

// lineLog keeps a process's output for failure reports and lets tests wait
// for a line.
type lineLog struct {
	mu    sync.Mutex
	lines []string
	cond  *sync.Cond
}

func newLineLog() *lineLog {
	l := &lineLog{}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *lineLog) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
	l.cond.Broadcast()
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// waitFor returns the first submatch of re in any line, waiting up to
// patience times d.
func (l *lineLog) waitFor(re *regexp.Regexp, d time.Duration) (string, bool) {
	d *= patience
	deadline := time.Now().Add(d)
	go func() {
		time.Sleep(d)
		l.cond.Broadcast()
	}()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for _, s := range l.lines {
			if m := re.FindStringSubmatch(s); m != nil {
				if len(m) > 1 {
					return m[1], true
				}
				return m[0], true
			}
		}
		if time.Now().After(deadline) {
			return "", false
		}
		l.cond.Wait()
	}
}

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	p := &proc{t: t, name: name, cmd: cmd, out: newLineLog(), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	var wg sync.WaitGroup
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				p.out.add(sc.Text())
			}
		}()
	}
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if t.Failed() && os.Getenv("CYCLEPOOL_E2E_STACKS") != "" {
			// Ask the Go runtime for every goroutine's stack before stopping.
			_ = p.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-p.done:
			case <-time.After(3 * time.Second):
			}
		}
		p.stop()
		if t.Failed() {
			t.Logf("--- output of %s ---\n%s", name, p.out)
		}
	})
	return p
}

// kill ends the process with SIGKILL, as a crash would.
func (p *proc) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// stop ends the process gracefully (SIGTERM), then kills it.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

// freePort returns a TCP port free on 127.0.0.1 right now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// server is a running `cyclepool serve`.
type server struct {
	*proc
	url   string
	token string
}

var tokenRE = regexp.MustCompile(`CYCLEPOOL_TOKEN=(\S+)`)

// startServer starts a replica on db; port 0 picks one. The replica's data
// dir (which holds the owner token) is dataDir.
func startServer(t *testing.T, name, db, dataDir string, port int, extra ...string) *server {
	t.Helper()
	if port == 0 {
		port = freePort(t)
	}
	args := append([]string{"serve", "--addr", fmt.Sprintf("127.0.0.1:%d", port), "--database-url", db,
		"--data-dir", dataDir, "--lease", "2s", "--replica", name}, extra...)
	p := start(t, name, args...)
	s := &server{proc: p, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	tok, ok := p.out.waitFor(tokenRE, 60*time.Second)
	if !ok {
		t.Fatalf("%s did not start:\n%s", name, p.out)
	}
	s.token = tok
	return s
}

// compileCache is the compiled-module cache every worker of these tests
// shares (across runs too): compiling a task module of a few MiB costs
// wazero a second or two of CPU, and no test here is about that cost.
func compileCache() string { return filepath.Join(os.TempDir(), "cyclepool-e2e-cache") }

// shareCompileCache makes the local worker of a server on dataDir
// (serve --local-worker, which compiles into dataDir/cache) use
// compileCache.
func shareCompileCache(t *testing.T, dataDir string) {
	t.Helper()
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(compileCache(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(compileCache(), filepath.Join(dataDir, "cache")); err != nil {
		t.Fatal(err)
	}
}

// startWorker starts a headless worker on the given servers.
func startWorker(t *testing.T, name string, slots int, servers ...string) *proc {
	t.Helper()
	return startWorkerWith(t, name, slots, servers, nil)
}

// heldShare is the CPU share (--cpu-share) of the workers that run
// counter tasks whose work is there to take time (a kill, a restart or a
// failover must find them running): held to a fifth of the CPU, a step
// of heldStep(100) of computing takes about 100 ms of wall time, and the
// tests beside it get the other four fifths. The share is Linux's only.
const heldShare = 20

// startHeldWorker is startWorker for a worker held to heldShare.
func startHeldWorker(t *testing.T, name string, slots int, servers ...string) *proc {
	t.Helper()
	if runtime.GOOS != "linux" {
		return startWorker(t, name, slots, servers...)
	}
	return startWorkerWith(t, name, slots, servers, []string{"--cpu-share", fmt.Sprint(heldShare)})
}

// heldStep is the counter's MS argument for a step of about ms of wall
// time on a held worker (startHeldWorker).
func heldStep(ms int) string {
	if runtime.GOOS != "linux" {
		return fmt.Sprint(ms)
	}
	return fmt.Sprint(ms * heldShare / 100)
}

// startWorkerWith starts a headless worker with extra flags and waits
// until it is connected.
func startWorkerWith(t *testing.T, name string, slots int, servers, extra []string) *proc {
	t.Helper()
	args := append([]string{"worker", "--server", strings.Join(servers, ","), "--slots", fmt.Sprint(slots),
		"--cache-dir", compileCache()}, extra...)
	p := start(t, name, args...)
	if _, ok := p.out.waitFor(regexp.MustCompile(`msg=connected`), 30*time.Second); !ok {
		t.Fatalf("%s did not connect:\n%s", name, p.out)
	}
	return p
}

// platform is one database with one replica (started with serverArgs
// added to startServer's) and an owner client.
type platform struct {
	db     string
	srv    *server
	client *client.Client
	data   string
}

func newPlatform(t *testing.T, serverArgs ...string) *platform {
	t.Helper()
	db := migratedDB(t)
	data := t.TempDir()
	srv := startServer(t, "server", db, data, 0, serverArgs...)
	return &platform{db: db, srv: srv, data: data, client: client.New(srv.url, srv.token)}
}

// migratedDB returns the URL of a fresh database with every migration
// applied: a copy of one migrated once per test binary, so that each
// server's start finds nothing to do. Migrating an empty database is
// what the examples test's server does (and internal/store's tests).
func migratedDB(t *testing.T) string {
	t.Helper()
	return pgtest.Template(t, "migrated", func(ctx context.Context, url string) error {
		s, err := store.Open(ctx, url)
		if err != nil {
			return err
		}
		s.Close()
		return nil
	})
}

// push uploads the task module called name and returns its id.
func push(t *testing.T, c *client.Client, name string) string {
	t.Helper()
	m, err := c.PushModule(context.Background(), taskbuild.Bytes(t, name))
	if err != nil {
		t.Fatalf("push %s: %v", name, err)
	}
	return m.ID
}

// submit submits a workflow given as a Go value.
func submit(t *testing.T, c *client.Client, wf any) string {
	t.Helper()
	b, err := json.Marshal(wf)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Submit(context.Background(), b)
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return s.ID
}

// wait waits for a workflow to finish (up to patience times d) and returns
// its final status.
func wait(t *testing.T, c *client.Client, id string, d time.Duration) *client.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience*d)
	defer cancel()
	st, err := c.Wait(ctx, id)
	if err != nil {
		last, _ := c.Status(context.Background(), id)
		t.Fatalf("wait for %s: %v (last status: %+v)", id, err, last)
	}
	return st
}

// output reads one output of a task.
func output(t *testing.T, c *client.Client, id, task, name string) string {
	t.Helper()
	r, err := c.Output(context.Background(), id, task, name)
	if err != nil {
		t.Fatalf("output %s/%s: %v", task, name, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// patience multiplies every wait of eventually: d is how long the wait
// takes on a quiet machine at most, and a machine busy with other tests
// (a second make test beside this one) may take several times as long.
// The waits bound how long a test hangs, they claim no speed.
const patience = 3

// eventually polls cond every 50ms until it holds or patience times d
// passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	d *= patience
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// task builds a workflow task object.
type task map[string]any

func workflow(name string, tasks ...task) map[string]any {
	return map[string]any{"name": name, "tasks": tasks}
}

// runCLI runs a cyclepool command with DATABASE_URL set to db and returns
// its standard output.
func runCLI(t *testing.T, db string, args ...string) (string, error) {
	t.Helper()
	return runIn("", []string{"DATABASE_URL=" + db}, 5*time.Minute, args...)
}

// runIn runs a cyclepool command in dir (the test's own when empty) with
// env added, for at most timeout, and returns its standard output (with
// its standard error when it fails).
func runIn(dir string, env []string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

// helloSocket opens a worker socket to the server at url, written by hand
// as a headless worker of one slot: it says hello and reads the welcome;
// from then on it says only what the test writes. It closes when the test
// ends.
func helloSocket(t *testing.T, url string) *websocket.Conn {
	t.Helper()
	ctx := context.Background()
	ws, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(url, "http")+"/ws/worker", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	hello, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{Version: protocol.Version,
		Kind: protocol.KindHeadless, Slots: 1}})
	if err := ws.Write(ctx, websocket.MessageText, hello); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	typ, data, err := ws.Read(rctx)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := protocol.Decode(data, typ == websocket.MessageBinary); err != nil || f.Type != protocol.TypeWelcome {
		t.Fatalf("answer to hello: %v %q, want a welcome", err, data)
	}
	return ws
}

// lockTable runs lock (a LOCK TABLE statement) in a transaction of its own
// on the database at db, and returns the transaction: the lock holds until
// it rolls back, at the latest when the test ends. Its connection
// (tx.Conn()) stays open until then.
func lockTable(t *testing.T, db, lock string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, lock); err != nil {
		t.Fatal(err)
	}
	return tx
}
