//go:build unix

package pgembed

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// recorder keeps the records logged by a Cluster, and passes them on to
// the test's log.
type recorder struct {
	mu   sync.Mutex
	recs []slog.Record
	next slog.Handler
}

func newRecorder(t *testing.T) *recorder { return &recorder{next: logger(t).Handler()} }

func (r *recorder) logger() *slog.Logger { return slog.New(recHandler{r, r.next}) }

// find returns the records of level with message msg.
func (r *recorder) find(level slog.Level, msg string) []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []slog.Record
	for _, rec := range r.recs {
		if rec.Level == level && rec.Message == msg {
			out = append(out, rec)
		}
	}
	return out
}

type recHandler struct {
	r    *recorder
	next slog.Handler
}

func (h recHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recHandler) Handle(ctx context.Context, rec slog.Record) error {
	h.r.mu.Lock()
	h.r.recs = append(h.r.recs, rec.Clone())
	h.r.mu.Unlock()
	return h.next.Handle(ctx, rec)
}

func (h recHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recHandler{h.r, h.next.WithAttrs(as)}
}

func (h recHandler) WithGroup(name string) slog.Handler {
	return recHandler{h.r, h.next.WithGroup(name)}
}

// attr returns the value of the attribute key of rec, as a string.
func attr(rec slog.Record, key string) string {
	v := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// waitUntil polls cond every 50 ms until it holds or d passes.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tryQuery runs sql on a new connection to url and returns its one text
// value.
func tryQuery(url, sql string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, sql).Scan(&s)
	return s, err
}

// stoppedBackend opens a connection to c and stops (SIGSTOP) its backend,
// which then stays attached to the server's shared memory however its
// postmaster ends, until it is killed: by the function returned, or when
// the test ends.
func stoppedBackend(t *testing.T, c *Cluster) (kill func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	kill = func() {
		once.Do(func() {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Errorf("kill the stopped backend: %v", err)
			}
		})
	}
	t.Cleanup(func() {
		kill()
		_ = conn.Close(ctx)
	})
	return kill
}

// execSQL runs sql (any number of statements) on a new connection to url.
func execSQL(t *testing.T, url, sql string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

const (
	msgExited    = "embedded PostgreSQL exited; restarting"
	msgRestarted = "embedded PostgreSQL restarted and accepts connections"
	msgRetrying  = "embedded PostgreSQL did not restart; retrying"
)

// A postmaster killed with SIGKILL (as by the OOM killer) is restarted by
// its Cluster on the same port, crash recovery keeps committed data, and
// the restart is logged and counted.
func TestRestartsKilledPostmaster(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx := context.Background()
	rec := newRecorder(t)
	c, err := Start(ctx, Config{Dir: dir, Logger: rec.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	execSQL(t, c.URL(), "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('survives')")

	url, old := c.URL(), c.pid()
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var got string
	waitUntil(t, 2*time.Minute, "a new connection to the restarted server", func() bool {
		got, err = tryQuery(url, "SELECT v FROM kept")
		return err == nil
	})
	if got != "survives" {
		t.Errorf("after the restart the row reads %q, want \"survives\"", got)
	}
	if c.URL() != url {
		t.Errorf("URL changed across the restart: %s -> %s", url, c.URL())
	}
	// The count and the new pid are recorded once the supervisor sees the
	// server accept connections, which the query above may see first.
	waitUntil(t, 30*time.Second, "the restart to be counted", func() bool { return c.Restarts() >= 1 })
	if n := c.Restarts(); n != 1 {
		t.Errorf("Restarts() = %d, want 1", n)
	}
	if c.pid() == old {
		t.Errorf("the postmaster is still pid %d", old)
	}
	exits := rec.find(slog.LevelWarn, msgExited)
	if len(exits) != 1 {
		t.Fatalf("%d warnings %q, want 1", len(exits), msgExited)
	}
	if s := attr(exits[0], "status"); s != "signal: killed" {
		t.Errorf("the warning names exit status %q, want \"signal: killed\"", s)
	}
	if attr(exits[0], "log") != c.LogPath() {
		t.Errorf("the warning names log %q, want %q", attr(exits[0], "log"), c.LogPath())
	}
	waitUntil(t, 10*time.Second, "the restart to be logged", func() bool {
		return len(rec.find(slog.LevelInfo, msgRestarted)) == 1
	})

	// Stop ends it for good.
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done is not closed after Stop")
	}
	if _, err := tryQuery(url, "SELECT 'up'"); err == nil {
		t.Error("the server answers after Stop")
	}
	if n := c.Restarts(); n != 1 {
		t.Errorf("Restarts() = %d after Stop, want 1", n)
	}
}

// The processes of a killed postmaster may hold its shared memory a while,
// and PostgreSQL refuses to start until they are gone: the Cluster retries
// until they are, and the server runs again.
func TestRestartWaitsForOldBackends(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx := context.Background()
	rec := newRecorder(t)
	c, err := Start(ctx, Config{Dir: dir, Ephemeral: true, Logger: rec.logger()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	backend := stoppedBackend(t, c)
	if err := syscall.Kill(c.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "two refused restarts", func() bool { return len(rec.find(slog.LevelWarn, msgRetrying)) >= 2 })
	if n := c.Restarts(); n != 0 {
		t.Fatalf("Restarts() = %d while the old backend holds the shared memory, want 0", n)
	}
	log, err := os.ReadFile(c.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "pre-existing shared memory block") {
		t.Errorf("the server log does not say why the restarts failed:\n%s", log)
	}

	backend()
	waitUntil(t, 2*time.Minute, "the server to be restarted", func() bool { return c.Restarts() == 1 })
	if got, err := tryQuery(c.URL(), "SELECT 'up'"); err != nil || got != "up" {
		t.Errorf("after the restart: %q, %v", got, err)
	}
}

// Stop while restarts are failing ends the supervision (nothing restarts
// the server afterwards) and releases the cluster.
func TestStopDuringRestart(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx := context.Background()
	rec := newRecorder(t)
	// Not Ephemeral: the table must survive the crash.
	c, err := Start(ctx, Config{Dir: dir, Logger: rec.logger()})
	if err != nil {
		t.Fatal(err)
	}
	execSQL(t, c.URL(), "CREATE TABLE kept AS SELECT 'kept' AS v")
	backend := stoppedBackend(t, c)
	if err := syscall.Kill(c.pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "a refused restart", func() bool { return len(rec.find(slog.LevelWarn, msgRetrying)) >= 1 })

	if err := c.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	select {
	case <-c.supervised:
	default:
		t.Fatal("the supervision still runs after Stop")
	}
	select {
	case <-c.Done():
	default:
		t.Error("Done is not closed after Stop")
	}
	if err := c.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if n := c.Restarts(); n != 0 {
		t.Errorf("Restarts() = %d, want 0", n)
	}
	select {
	case <-c.current().exited:
	default:
		t.Error("a postmaster runs after Stop")
	}

	// The old backend gone, the cluster starts again, with its data.
	backend()
	c2, err := Start(ctx, Config{Dir: dir, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Stop(ctx)
	if got, err := tryQuery(c2.URL(), "SELECT v FROM kept"); err != nil || got != "kept" {
		t.Errorf("after Stop and Start: %q, %v", got, err)
	}
}
