//go:build unix

package pgembed

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func testDir(t *testing.T) string {
	t.Helper()
	if _, err := FindBinDir(""); err != nil {
		t.Skip(err)
	}
	// Not t.TempDir: its name is long (unix socket paths are short) and
	// Start may add o+x to it when running as root.
	d, err := os.MkdirTemp("", "pgembed")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return filepath.Join(d, "pg")
}

func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func query(t *testing.T, url, sql string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, sql, args...).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStartStopRestart(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx := context.Background()

	t0 := time.Now()
	c, err := Start(ctx, Config{Dir: dir, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cold start (initdb + start): %s", time.Since(t0))
	if got := query(t, c.URL(), "SELECT current_database()"); got != "cyclepool" {
		t.Errorf("database %q", got)
	}
	if got := query(t, c.URL(), "SHOW synchronous_commit"); got != "on" {
		t.Errorf("synchronous_commit %q", got)
	}
	if got := query(t, c.URL(), "SHOW fsync"); got != "on" {
		t.Errorf("fsync %q", got)
	}
	if got := query(t, c.URL(), "SHOW max_connections"); got != "200" {
		t.Errorf("max_connections %q", got)
	}
	if got := query(t, c.URL(), "SELECT current_setting('listen_addresses')"); got != "127.0.0.1" {
		t.Errorf("listen_addresses %q", got)
	}
	ctx2 := context.Background()
	conn, err := pgx.Connect(ctx2, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx2, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('hello')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx2)

	// A second Start on the same directory is refused while the first runs.
	if _, err := Start(ctx, Config{Dir: dir}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second start: %v", err)
	}
	// A wrong password is refused over TCP.
	bad := strings.Replace(c.URL(), c.password, "wrong", 1)
	if conn, err := pgx.Connect(ctx, bad); err == nil {
		conn.Close(ctx)
		t.Error("wrong password accepted")
	}
	url1 := c.URL()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}

	t0 = time.Now()
	c, err = Start(ctx, Config{Dir: dir, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("warm start: %s", time.Since(t0))
	defer c.Stop(ctx)
	if c.URL() != url1 {
		t.Errorf("URL changed across restarts: %s -> %s", url1, c.URL())
	}
	if got := query(t, c.URL(), "SELECT v FROM kept"); got != "hello" {
		t.Errorf("data lost: %q", got)
	}
}

func TestRunsAsUnprivilegedUserWhenRoot(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("not root")
	}
	dir := testDir(t)
	ctx := context.Background()
	c, err := Start(ctx, Config{Dir: dir, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	cred, _ := runAs()
	fi, err := os.Stat(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != cred.uid {
		t.Errorf("data dir owned by %d, want %d", uid, cred.uid)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), fmt.Sprintf("\nUid:\t%d\t", cred.uid)) {
		t.Errorf("postgres does not run as %s:\n%s", cred.name, st)
	}
}

// A crashed server (SIGKILL) leaves postmaster.pid behind; the next Start
// recovers, and committed data survives.
func TestRecoverAfterCrash(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx := context.Background()
	c, err := Start(ctx, Config{Dir: dir, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('durable')"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	// As if this process had died too: no supervision, the lock released.
	c.stopSupervision()
	pm := c.current()
	_ = pm.cmd.Process.Kill()
	<-pm.exited
	c.lock.Close()
	if _, err := os.Stat(filepath.Join(dir, "data", "postmaster.pid")); err != nil {
		t.Fatalf("expected a stale postmaster.pid: %v", err)
	}

	c, err = Start(ctx, Config{Dir: dir, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	if got := query(t, c.URL(), "SELECT v FROM kept"); got != "durable" {
		t.Errorf("got %q", got)
	}
}

// A postmaster.pid naming a live process that is not PostgreSQL (a pid reused
// after a reboot or in a new container) must not block the start.
func TestStalePidOfOtherProcess(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx := context.Background()
	c, err := Start(ctx, Config{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sleep.Process.Kill(); _ = sleep.Wait() }()
	pid := fmt.Sprintf("%d\n%s/data\n1700000000\n5432\n%s/run\n127.0.0.1\n  5432001  32768\nready   \n", sleep.Process.Pid, dir, dir)
	if err := os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"), []byte(pid), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Start(ctx, Config{Dir: dir, Ephemeral: true, Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(ctx)
	if got := query(t, c.URL(), "SELECT 'ok'"); got != "ok" {
		t.Error(got)
	}
}

// A server that cannot start reports the tail of its log.
func TestStartFailureShowsLog(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx := context.Background()
	c, err := Start(ctx, Config{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Break the configuration.
	f, err := os.OpenFile(filepath.Join(dir, "data", "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(f, "shared_buffers = 'lots'")
	f.Close()
	_, err = Start(ctx, Config{Dir: dir, Ephemeral: true, StartTimeout: 20 * time.Second})
	if err == nil {
		t.Fatal("started with a broken configuration")
	}
	if !strings.Contains(err.Error(), "shared_buffers") {
		t.Errorf("error does not show the log: %v", err)
	}
	t.Log(err)
}

func TestFindBinDir(t *testing.T) {
	d, err := FindBinDir("")
	if err != nil {
		t.Skip(err)
	}
	t.Logf("newest PostgreSQL: %s", d)
	if _, err := FindBinDir("7"); err == nil {
		t.Error("found PostgreSQL 7")
	}
}

// A lock held for a moment, as by a process forked elsewhere in this
// program while the cluster's previous lock was open (the copy of the
// descriptor it holds until it executes keeps the lock), is waited for;
// TestStartStopRestart checks that one held for good is refused.
func TestLockHeldForAMomentIsWaitedFor(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	other, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := lockFile(other); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(100*time.Millisecond, func() { other.Close() })
	c := &Cluster{dir: dir}
	if err := c.acquireLock(); err != nil {
		t.Fatalf("a lock released after 100 ms: %v", err)
	}
	c.lock.Close()
}
