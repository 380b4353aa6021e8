// Package pgembed runs a private PostgreSQL cluster from the PostgreSQL
// binaries installed on the machine: the database `cyclepool serve` uses when
// it is given no --database-url.
//
// The cluster lives in a directory (Config.Dir):
//
//	Dir/data/          PGDATA, created by initdb on first use
//	Dir/run/           the unix socket
//	Dir/password       the generated password of the "cyclepool" role (0600)
//	Dir/postgres.log   the server log
//	Dir/lock           held (flock) while a Cluster runs
//
// The server listens on 127.0.0.1 only (password, scram-sha-256) and on the
// unix socket in Dir/run (trust; the directory is private to the user running
// the server). When the caller is root, PostgreSQL refuses to run as root, so
// initdb and postgres run as the "postgres" user (or "nobody"), which is made
// the owner of Dir/data and Dir/run.
//
// A Cluster supervises its server: when the postmaster exits without
// having been told to (a crash, the OOM killer's SIGKILL), the Cluster
// starts it again on the same directory and port, with PostgreSQL's own
// crash recovery replaying the WAL, retrying with exponential back-off until
// it runs (see supervise). Stop and Crash end the supervision first.
//
// It runs on Linux and macOS (sys_linux.go, sys_darwin.go); elsewhere Start
// returns an error that names --database-url. On Linux the server is told
// to shut down when this process dies; on macOS a server orphaned by a
// crash is shut down by the next Start, which recognises it by its name
// and start time.
package pgembed

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Role and Database are the superuser role and the database the cluster
// serves.
const (
	Role     = "cyclepool"
	Database = "cyclepool"
)

// Config configures Start.
type Config struct {
	// Dir holds the cluster; it is created if missing.
	Dir string
	// Port is the TCP port on 127.0.0.1; 0 picks a free one (the port of
	// the previous run when it is still free).
	Port int
	// Logger receives progress messages; nil discards them.
	Logger *slog.Logger
	// BinDir is the directory of initdb, pg_ctl and postgres; empty finds
	// the newest installation (see FindBinDir).
	BinDir string
	// Ephemeral trades durability for speed (fsync, synchronous_commit and
	// full_page_writes off, initdb --no-sync). For tests only.
	Ephemeral bool
	// StartTimeout bounds the wait for the server to accept connections;
	// 0 means 60 seconds.
	StartTimeout time.Duration
	// Settings are extra server settings ("name=value", each passed as
	// -c), e.g. to load pg_stat_statements for a measurement.
	Settings []string
}

// Cluster is a running PostgreSQL server, restarted by the Cluster when it
// exits on its own, until Stop or Crash.
type Cluster struct {
	dir, dataDir, sockDir string
	bin                   string
	settings              []string
	port                  int
	password              string
	cred                  *credential
	startTimeout          time.Duration
	log                   *slog.Logger
	lock                  *os.File

	mu       sync.Mutex
	pm       *postmaster // the current postmaster, or the last one
	restarts int         // postmasters started by supervise

	// cancelSupervision ends supervise, which closes supervised when it
	// returns. Both are set once by Start, before the Cluster is shared.
	cancelSupervision context.CancelFunc
	supervised        chan struct{}
	stopped           chan struct{} // closed when Stop or Crash has finished

	stopOnce sync.Once
	stopErr  error
}

// postmaster is one run of the postgres server process.
type postmaster struct {
	cmd      *exec.Cmd
	started  time.Time
	logStart int64         // its first byte in the server log
	exited   chan struct{} // closed when it has exited and been reaped
	err      error         // cmd.Wait's result, set before exited closes
}

// Supervision timings: the first restart waits minRestartDelay after the
// exit, and every attempt doubles the wait before the next one up to
// maxRestartDelay, whether the attempt failed or the server it started soon
// died again; a postmaster that stayed up for stableAfter starts the
// sequence again from minRestartDelay when it dies. A restart waits at least
// minRestartTimeout for the server to accept connections, as crash
// recovery may have much WAL to replay.
const (
	minRestartDelay   = 100 * time.Millisecond
	maxRestartDelay   = 10 * time.Second
	stableAfter       = time.Minute
	minRestartTimeout = 10 * time.Minute
)

// URL returns the postgres:// URL of the database "cyclepool" over TCP.
func (c *Cluster) URL() string { return c.URLFor(Database) }

// URLFor returns the postgres:// URL of database db on this cluster.
func (c *Cluster) URLFor(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(Role, c.password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// SocketURL returns a connection string for database db over the unix socket
// (trust authentication; usable only by this user and root).
func (c *Cluster) SocketURL(db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", c.sockDir, c.port, Role, db)
}

// Port returns the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Dir returns the cluster directory.
func (c *Cluster) Dir() string { return c.dir }

// LogPath returns the path of the server log.
func (c *Cluster) LogPath() string { return filepath.Join(c.dir, "postgres.log") }

// Start starts the cluster in cfg.Dir, initialising it on first use, and
// returns when it accepts connections and the database "cyclepool" exists.
// A data directory made by pg_basebackup -R (with Dir/password copied from
// the primary) starts as a streaming standby of that primary.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := supported(); err != nil {
		return nil, err
	}
	if cfg.Dir == "" {
		return nil, errors.New("pgembed: no directory given")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("pgembed: %w", err)
	}
	c := &Cluster{dir: dir, dataDir: filepath.Join(dir, "data"), sockDir: filepath.Join(dir, "run"), log: log, settings: cfg.Settings,
		stopped: make(chan struct{})}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pgembed: create %s: %w", dir, err)
	}
	if err := c.acquireLock(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			c.lock.Close()
		}
	}()

	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	c.cred = cred
	if err := prepareDirs(c, cred, log); err != nil {
		return nil, err
	}

	// Binaries: an existing cluster needs binaries of its major version.
	major := ""
	if b, err := os.ReadFile(filepath.Join(c.dataDir, "PG_VERSION")); err == nil {
		major = strings.TrimSpace(string(b))
	}
	c.bin = cfg.BinDir
	if c.bin == "" {
		if c.bin, err = FindBinDir(major); err != nil {
			return nil, err
		}
	}

	if c.password, err = readOrCreatePassword(filepath.Join(dir, "password")); err != nil {
		return nil, err
	}
	if major == "" {
		t0 := time.Now()
		if err := c.initdb(ctx, cred, cfg.Ephemeral); err != nil {
			return nil, err
		}
		log.Info("initialised PostgreSQL cluster", "dir", c.dataDir, "bin", c.bin, "took", time.Since(t0).Round(time.Millisecond))
	}
	if err := writeConf(c.dataDir, cfg.Ephemeral, cred); err != nil {
		return nil, err
	}
	if err := c.clearStalePid(); err != nil {
		return nil, err
	}

	c.startTimeout = cfg.StartTimeout
	if c.startTimeout == 0 {
		c.startTimeout = 60 * time.Second
	}
	// A picked port may be taken between the check and the bind: retry.
	// So may the shared memory of a server that was killed (a crash, or
	// kill -9): its other processes notice their postmaster's death and
	// exit, but under load not always before the next start looks, which
	// then refuses to run.
	for binds, shm := 0, 0; ; {
		if c.port, err = pickPort(cfg.Port, dir); err != nil {
			return nil, err
		}
		var pm *postmaster
		pm, err = c.startServer(ctx, c.startTimeout)
		if err == nil {
			c.pm = pm
			break
		}
		switch {
		case strings.Contains(err.Error(), "pre-existing shared memory block") && shm < 50:
			shm++
			log.Info("processes of a killed PostgreSQL server still hold its shared memory; waiting for them", "dir", dir)
			select {
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				return nil, err
			}
		case cfg.Port == 0 && binds < 2 && strings.Contains(err.Error(), "could not bind"):
			binds++
		default:
			return nil, err
		}
	}
	if err := c.setup(ctx); err != nil {
		_ = c.Stop(context.Background())
		return nil, err
	}
	_ = os.WriteFile(filepath.Join(dir, "port"), []byte(strconv.Itoa(c.port)+"\n"), 0o600)
	log.Info("PostgreSQL started", "dir", dir, "port", c.port, "pid", c.pid())
	// Supervision outlives ctx, which only bounds the start: it ends with
	// Stop or Crash.
	sctx, cancel := context.WithCancel(context.Background())
	c.cancelSupervision, c.supervised = cancel, make(chan struct{})
	go c.supervise(sctx)
	ok = true
	return c, nil
}

// current returns the current postmaster (the last one started).
func (c *Cluster) current() *postmaster {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pm
}

// pid returns the process id of the current postmaster.
func (c *Cluster) pid() int { return c.current().cmd.Process.Pid }

// Restarts returns how many times the Cluster has started its server again
// after it exited on its own (crashed or was killed) and the new server
// accepted connections. A restart that needed several attempts counts once.
func (c *Cluster) Restarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restarts
}

// supervise restarts the postmaster whenever it exits, until ctx ends
// (Stop and Crash cancel it, and wait for it to return, before they touch
// the postmaster). A restart reuses the directory, port and settings;
// PostgreSQL's crash recovery replays the WAL. The other processes of a
// killed postmaster may still hold its shared memory for a moment, and
// PostgreSQL then refuses to start ("pre-existing shared memory block is
// still in use"): like every other failure, that is retried with
// exponential back-off, for as long as it takes.
func (c *Cluster) supervise(ctx context.Context) {
	defer close(c.supervised)
	delay := minRestartDelay
	for {
		pm := c.current()
		select {
		case <-ctx.Done():
			return
		case <-pm.exited:
		}
		up := time.Since(pm.started)
		c.log.Warn("embedded PostgreSQL exited; restarting",
			"status", exitStatus(pm.err), "pid", pm.cmd.Process.Pid, "up", up.Round(time.Millisecond),
			"log", c.LogPath(), "log_tail", c.logTail(pm.logStart, 10))
		if up >= stableAfter {
			delay = minRestartDelay
		}
		down := time.Now()
		for attempt := 1; ; attempt++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, maxRestartDelay)
			next, err := c.restart(ctx)
			if ctx.Err() != nil {
				if err == nil { // started as Stop came: Stop stops it
					c.mu.Lock()
					c.pm = next
					c.mu.Unlock()
				}
				return
			}
			if err == nil {
				c.mu.Lock()
				c.pm = next
				c.restarts++
				n := c.restarts
				c.mu.Unlock()
				c.log.Info("embedded PostgreSQL restarted and accepts connections",
					"pid", next.cmd.Process.Pid, "port", c.port, "attempts", attempt,
					"down", time.Since(down).Round(time.Millisecond), "restarts", n)
				break
			}
			c.log.Warn("embedded PostgreSQL did not restart; retrying",
				"attempt", attempt, "retry_in", delay, "err", err)
		}
	}
}

// restart starts a postmaster again after the last one exited.
func (c *Cluster) restart(ctx context.Context) (*postmaster, error) {
	if err := c.clearStalePid(); err != nil {
		return nil, err
	}
	return c.startServer(ctx, max(c.startTimeout, minRestartTimeout))
}

// stopSupervision ends supervise and waits for it to return: after it, the
// current postmaster is the last one.
func (c *Cluster) stopSupervision() {
	if c.cancelSupervision == nil {
		return // Start failed before supervising
	}
	c.cancelSupervision()
	<-c.supervised
}

// exitStatus describes how a postmaster ended, from cmd.Wait's result.
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// lockPatience is how long acquireLock retries a lock that is taken. A
// process this one forks holds a copy of every descriptor, the lock's
// included, until it executes its program (a moment, longer on a busy
// machine): a cluster stopped and started again while another goroutine
// starts a process would otherwise find its own lock taken.
const lockPatience = 2 * time.Second

// acquireLock takes the cluster's lock (an exclusive flock on dir/lock),
// which another Start, in this process or another, holds while its
// server runs.
func (c *Cluster) acquireLock() error {
	f, err := os.OpenFile(filepath.Join(c.dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	deadline := time.Now().Add(lockPatience)
	for {
		err := lockFile(f)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			f.Close()
			return fmt.Errorf("pgembed: cluster %s is in use by another process: %w", c.dir, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.lock = f
	return nil
}

// credential is who runs the PostgreSQL processes; nil means the caller.
type credential struct {
	uid, gid uint32
	name     string
}

func runAs() (*credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &credential{uid: uint32(uid), gid: uint32(gid), name: name}, nil
	}
	return nil, errors.New("pgembed: running as root and neither user \"postgres\" nor \"nobody\" exists to run PostgreSQL")
}

func (cr *credential) chown(path string) error {
	if cr == nil {
		return nil
	}
	return os.Lchown(path, int(cr.uid), int(cr.gid))
}

// prepareDirs creates Dir/run and, for a non-root server user, makes the
// cluster reachable by that user.
func prepareDirs(c *Cluster, cred *credential, log *slog.Logger) error {
	_ = os.RemoveAll(c.dataDir + ".initdb") // a half-done initdb
	if err := os.MkdirAll(c.sockDir, 0o700); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if len(c.sockDir)+len("/.s.PGSQL.65535.lock") > 107 {
		return fmt.Errorf("pgembed: directory %s is too long for a unix socket path (at most about 80 bytes)", c.dir)
	}
	if cred == nil {
		return nil
	}
	for _, p := range []string{c.sockDir, c.dataDir} {
		if _, err := os.Stat(p); err == nil {
			if err := chownTree(p, cred); err != nil {
				return err
			}
		}
	}
	// Every ancestor must be searchable by the server user.
	for d := c.dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
		uid, gid := ownerOf(fi)
		searchable := fi.Mode().Perm()&0o001 != 0 ||
			uid == cred.uid && fi.Mode().Perm()&0o100 != 0 ||
			gid == cred.gid && fi.Mode().Perm()&0o010 != 0
		if !searchable {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("pgembed: make %s searchable for user %s: %w", d, cred.name, err)
			}
			log.Warn("granted search permission (o+x) so that PostgreSQL can reach its cluster", "dir", d, "user", cred.name)
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	return nil
}

// chownTree gives a tree to the server user, unless its top already is.
func chownTree(root string, cred *credential) error {
	fi, err := os.Lstat(root)
	if err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if uid, gid := ownerOf(fi); uid == cred.uid && gid == cred.gid {
		return nil
	}
	return filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if err := cred.chown(p); err != nil {
			return fmt.Errorf("pgembed: chown %s: %w", p, err)
		}
		return nil
	})
}

func readOrCreatePassword(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil {
		if p := strings.TrimSpace(string(b)); p != "" {
			return p, nil
		}
	}
	buf := make([]byte, 24)
	if _, err := rand.Read(buf); err != nil {
		return "", fmt.Errorf("pgembed: %w", err)
	}
	p := hex.EncodeToString(buf)
	if err := writeFileSync(path, []byte(p+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("pgembed: write password: %w", err)
	}
	return p, nil
}

func writeFileSync(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// env is the environment of the PostgreSQL processes: nothing inherited
// (PGDATA, PGPORT and friends would confuse them).
func env(cred *credential) []string {
	e := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C", "LANG=C", "TZ=UTC"}
	if cred != nil {
		e = append(e, "HOME=/", "USER="+cred.name)
	} else if h, err := os.UserHomeDir(); err == nil {
		e = append(e, "HOME="+h)
	}
	return e
}

// initdb creates the cluster in Dir/data.initdb and renames it to Dir/data
// when complete, so that a crash never leaves a half-made cluster in place.
func (c *Cluster) initdb(ctx context.Context, cred *credential, ephemeral bool) error {
	tmp := c.dataDir + ".initdb"
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if err := cred.chown(tmp); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	args := []string{"-D", tmp, "-U", Role, "--auth-local=trust", "--auth-host=scram-sha-256",
		"-E", "UTF8", "--no-locale", "--no-instructions"}
	if ephemeral {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "initdb"), args...)
	cmd.Dir = c.sockDir
	cmd.Env = env(cred)
	cmd.SysProcAttr = cred.attr()
	out, err := cmd.CombinedOutput()
	if err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("pgembed: initdb: %w\n%s", err, tail(out, 30))
	}
	if err := os.Rename(tmp, c.dataDir); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if d, err := os.Open(c.dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// writeConf (re)writes Dir/data/cyclepool.conf, included from
// postgresql.conf; ALTER SYSTEM settings still override it.
func writeConf(dataDir string, ephemeral bool, cred *credential) error {
	mem := totalMemory()
	sharedBuffers := clamp(mem/8, 32<<20, 2<<30)
	cacheSize := clamp(mem/2, 128<<20, 64<<30)
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by cyclepool at every start; change settings with ALTER SYSTEM.
max_connections = 200
shared_buffers = '%dMB'
effective_cache_size = '%dMB'
work_mem = '4MB'
maintenance_work_mem = '64MB'
max_wal_size = '1GB'
min_wal_size = '80MB'
checkpoint_completion_target = 0.9
timezone = 'UTC'
log_timezone = 'UTC'
log_destination = 'stderr'
logging_collector = off
log_line_prefix = '%%m [%%p] '
log_min_messages = warning
log_connections = off
log_disconnections = off
`, sharedBuffers>>20, cacheSize>>20)
	if ephemeral {
		b.WriteString("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
	} else {
		b.WriteString("fsync = on\nsynchronous_commit = on\nfull_page_writes = on\n")
	}
	conf := filepath.Join(dataDir, "cyclepool.conf")
	if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if err := cred.chown(conf); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	main := filepath.Join(dataDir, "postgresql.conf")
	pc, err := os.ReadFile(main)
	if err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	const inc = "include_if_exists = 'cyclepool.conf'"
	if !bytes.Contains(pc, []byte(inc)) {
		f, err := os.OpenFile(main, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
		_, err = fmt.Fprintf(f, "\n%s\n", inc)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("pgembed: %w", err)
		}
	}
	return nil
}

func clamp(v, lo, hi int64) int64 { return max(lo, min(v, hi)) }

// clearStalePid removes a postmaster.pid left by a server that is gone. We
// hold Dir/lock, so no live cyclepool owns the cluster: a postgres still
// running on it is an orphan, and is shut down.
func (c *Cluster) clearStalePid() error {
	pidFile := filepath.Join(c.dataDir, "postmaster.pid")
	b, err := os.ReadFile(pidFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	// Its lines: the postmaster's pid, the data directory, its start time
	// (Unix seconds), ...
	lines := strings.Split(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(lines[0]))
	var started int64
	if len(lines) > 2 {
		started, _ = strconv.ParseInt(strings.TrimSpace(lines[2]), 10, 64)
	}
	if pid > 0 && isOurPostmaster(pid, c.dataDir, started) {
		c.log.Warn("shutting down an orphaned PostgreSQL server", "pid", pid)
		stopProcess(pid, 30*time.Second)
	}
	// PostgreSQL detects a dead pid itself, but not one reused by another
	// process (common in containers): remove the file.
	if _, err := os.Stat(pidFile); err == nil {
		c.log.Info("removing stale postmaster.pid", "pid", pid)
		if err := os.Remove(pidFile); err != nil {
			return fmt.Errorf("pgembed: remove stale %s: %w", pidFile, err)
		}
	}
	locks, _ := filepath.Glob(filepath.Join(c.sockDir, ".s.PGSQL.*"))
	for _, l := range locks {
		_ = os.Remove(l)
	}
	return nil
}

// pickPort returns want, or the previous run's port if free, or a free one.
func pickPort(want int, dir string) (int, error) {
	if want != 0 {
		return want, nil
	}
	if b, err := os.ReadFile(filepath.Join(dir, "port")); err == nil {
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 && portFree(p) {
			return p, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgembed: pick a port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// startServer runs postgres as a child process and waits until it accepts
// connections. The server log is closed in this process when the server
// exits.
func (c *Cluster) startServer(ctx context.Context, timeout time.Duration) (*postmaster, error) {
	logPath := c.LogPath()
	if fi, err := os.Stat(logPath); err == nil && fi.Size() > 64<<20 {
		_ = os.Rename(logPath, logPath+".1")
	}
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgembed: %w", err)
	}
	logStart, _ := lf.Seek(0, io.SeekEnd)
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), "-D", c.dataDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(c.port),
		"-c", "unix_socket_directories="+c.sockDir,
		"-c", "unix_socket_permissions=0700")
	for _, set := range c.settings {
		cmd.Args = append(cmd.Args, "-c", set)
	}
	cmd.Dir = c.dataDir
	cmd.Env = env(c.cred)
	cmd.Stdout, cmd.Stderr = lf, lf
	// Pdeathsig: if this process dies, the server gets a fast shutdown.
	cmd.SysProcAttr = c.cred.attr()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("pgembed: start postgres: %w", err)
	}
	pm := &postmaster{cmd: cmd, started: time.Now(), logStart: logStart, exited: make(chan struct{})}
	go func() {
		pm.err = cmd.Wait()
		lf.Close()
		close(pm.exited)
	}()

	failed := func(why string) error {
		return fmt.Errorf("pgembed: PostgreSQL %s; log %s ends:\n%s", why, logPath, c.logTail(logStart, 30))
	}
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, c.SocketURL("postgres"))
		cancel()
		if err == nil {
			conn.Close(ctx)
			return pm, nil
		}
		select {
		case <-pm.exited:
			return nil, failed(fmt.Sprintf("exited at start (%v)", pm.err))
		case <-ctx.Done():
			pm.kill()
			return nil, failed("start cancelled: " + ctx.Err().Error())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			pm.kill()
			return nil, failed(fmt.Sprintf("did not accept connections within %s (last error: %v)", timeout, err))
		}
	}
}

// kill stops the postmaster immediately (SIGQUIT, then SIGKILL) and waits
// for it to exit.
func (pm *postmaster) kill() {
	_ = pm.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-pm.exited:
	case <-time.After(5 * time.Second):
		_ = pm.cmd.Process.Kill()
		<-pm.exited
	}
}

// logTail returns the last lines (at most n) the server wrote since offset.
func (c *Cluster) logTail(offset int64, n int) string {
	f, err := os.Open(c.LogPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	return string(tail(b, n))
}

func tail(b []byte, lines int) []byte {
	b = bytes.TrimRight(b, "\n")
	for i, n := len(b)-1, 0; i >= 0; i-- {
		if b[i] == '\n' {
			if n++; n == lines {
				return b[i+1:]
			}
		}
	}
	return b
}

// setup sets the role's password and creates the database if missing
// (on a primary; a standby has them from its primary).
func (c *Cluster) setup(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.SocketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgembed: connect: %w", err)
	}
	defer conn.Close(ctx)
	// A standby (a copy of another cluster, made with pg_basebackup -R)
	// takes its roles, password and database from its primary, and cannot
	// write them anyway.
	var standby bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if standby {
		c.log.Info("PostgreSQL is a standby: roles and database come from its primary", "dir", c.dir)
		return nil
	}
	// The password file is the truth: set it at every start (cheap, and it
	// heals a lost or regenerated file).
	if _, err := conn.Exec(ctx, "ALTER ROLE "+pgx.Identifier{Role}.Sanitize()+" PASSWORD "+quoteLiteral(c.password)); err != nil {
		return fmt.Errorf("pgembed: set password: %w", err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", Database).Scan(&exists); err != nil {
		return fmt.Errorf("pgembed: %w", err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{Database}.Sanitize()); err != nil {
			return fmt.Errorf("pgembed: create database: %w", err)
		}
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Stop ends the supervision (no restart happens during or after Stop, and a
// restart in progress is abandoned), shuts the server down (fast shutdown:
// open transactions are rolled back, committed data is on disk) and
// releases the cluster. If ctx ends first, the server is stopped
// immediately (crash recovery at next start). Stop may be called more than
// once.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		defer close(c.stopped)
		defer c.lock.Close()
		c.stopSupervision()
		pm := c.current()
		select {
		case <-pm.exited:
			// It had exited on its own and was waiting for a restart.
			c.log.Info("PostgreSQL stopped (it had exited and was not restarted)", "dir", c.dir, "status", exitStatus(pm.err))
			return
		default:
		}
		_ = pm.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-pm.exited:
		case <-ctx.Done():
			c.log.Warn("PostgreSQL fast shutdown did not finish in time; stopping immediately")
			_ = pm.cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-pm.exited:
			case <-time.After(10 * time.Second):
				_ = pm.cmd.Process.Kill()
				<-pm.exited
			}
			c.stopErr = fmt.Errorf("pgembed: stop: %w", ctx.Err())
			return
		}
		var ee *exec.ExitError
		if pm.err != nil && !errors.As(pm.err, &ee) {
			c.stopErr = fmt.Errorf("pgembed: stop: %w", pm.err)
		} else if ee != nil && ee.ExitCode() != 0 {
			c.stopErr = fmt.Errorf("pgembed: postgres exited with %v", pm.err)
		}
		c.log.Info("PostgreSQL stopped", "dir", c.dir)
	})
	return c.stopErr
}

// Crash stops the server the way a crash would, for tests: an immediate
// shutdown (SIGQUIT) without a checkpoint, so the next start runs crash
// recovery and transactions committed asynchronously whose WAL was not yet
// flushed are lost. Like Stop, it ends the supervision first, and releases
// the cluster.
func (c *Cluster) Crash() {
	c.stopOnce.Do(func() {
		defer close(c.stopped)
		defer c.lock.Close()
		c.stopSupervision()
		c.current().kill()
		c.stopErr = errors.New("pgembed: crashed on purpose")
	})
}

// Done is closed once Stop or Crash has stopped the server for good. A
// server that exits on its own is restarted (see Restarts) and does not
// close Done.
func (c *Cluster) Done() <-chan struct{} { return c.stopped }

var versionRe = regexp.MustCompile(`\(PostgreSQL\) (\d+)(?:\.(\d+))?`)

// FindBinDir returns the directory of the newest PostgreSQL installation
// holding initdb, pg_ctl and postgres, looking at /usr/lib/postgresql/*/bin,
// `pg_config --bindir` and PATH. With major non-empty, only installations of
// that major version qualify (an existing cluster needs them).
func FindBinDir(major string) (string, error) {
	var cands []string
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); m != nil {
		cands = append(cands, m...)
	}
	if m, _ := filepath.Glob("/usr/pgsql-*/bin"); m != nil { // RPM layout
		cands = append(cands, m...)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		cands = append(cands, strings.TrimSpace(string(out)))
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		cands = append(cands, filepath.Dir(p))
	}
	type inst struct {
		dir          string
		major, minor int
	}
	var found []inst
	seen := map[string]bool{}
	for _, d := range cands {
		if r, err := filepath.EvalSymlinks(d); err == nil {
			d = r
		}
		if seen[d] {
			continue
		}
		seen[d] = true
		okAll := true
		for _, b := range []string{"initdb", "postgres"} {
			if fi, err := os.Stat(filepath.Join(d, b)); err != nil || fi.IsDir() {
				okAll = false
			}
		}
		if !okAll {
			continue
		}
		out, err := exec.Command(filepath.Join(d, "postgres"), "--version").Output()
		if err != nil {
			continue
		}
		m := versionRe.FindSubmatch(out)
		if m == nil {
			continue
		}
		maj, _ := strconv.Atoi(string(m[1]))
		minr, _ := strconv.Atoi(string(m[2]))
		if major != "" && strconv.Itoa(maj) != major {
			continue
		}
		found = append(found, inst{d, maj, minr})
	}
	if len(found) == 0 {
		if major != "" {
			return "", fmt.Errorf("pgembed: the cluster was made by PostgreSQL %s, and no PostgreSQL %s binaries were found (looked in /usr/lib/postgresql/*/bin, pg_config --bindir and PATH)", major, major)
		}
		return "", errors.New("pgembed: no PostgreSQL binaries found (looked in /usr/lib/postgresql/*/bin, pg_config --bindir and PATH); install PostgreSQL or pass --database-url")
	}
	sort.Slice(found, func(i, j int) bool {
		if found[i].major != found[j].major {
			return found[i].major > found[j].major
		}
		return found[i].minor > found[j].minor
	})
	return found[0].dir, nil
}
