// Package pgtest gives each test a fresh, empty PostgreSQL database.
//
// The server is the one named by CYCLEPOOL_TEST_DATABASE_URL (a postgres://
// URL of any database on it, as a role allowed to create databases) when that
// variable is set. Otherwise the first call starts a private, non-durable
// cluster with pgembed in a temporary directory, shared by every test of the
// test binary; a package that uses pgtest should call Main from TestMain so
// that the cluster is stopped and removed when the tests end:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// To share one server among the test binaries of `go test ./...`, start one
// and export CYCLEPOOL_TEST_DATABASE_URL.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/pgembed"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL is the environment variable naming an existing server for tests.
const EnvURL = "CYCLEPOOL_TEST_DATABASE_URL"

var (
	mu      sync.Mutex
	server  *state
	initErr error
)

type state struct {
	admin   *pgxpool.Pool
	baseURL string // URL whose database name is replaced per test
	cluster *pgembed.Cluster
	tmp     string

	tmu       sync.Mutex
	templates map[string]*template // by key (Template)
}

// template is a database that tests' databases are copied from.
type template struct {
	once sync.Once
	name string
	err  error
}

// URL returns the URL of a new, empty database for this test, created from
// template0 and dropped when the test ends. It skips the test when no server
// is configured and no PostgreSQL binaries are installed, unless
// CYCLEPOOL_REQUIRE_POSTGRES=1 (make test sets it): then the test fails,
// saying what is missing, rather than a green run that tested nothing.
func URL(t testing.TB) string {
	t.Helper()
	return create(t, "template0")
}

// Template is URL with a database that starts as a copy of a template,
// made once per test binary and key by prepare, which is given the
// template's URL and must close every connection it opened before it
// returns (PostgreSQL copies a database nobody is connected to). A package
// whose tests each need migrated tables migrates once, not per test.
func Template(t testing.TB, key string, prepare func(ctx context.Context, url string) error) string {
	t.Helper()
	s := state0(t)
	s.tmu.Lock()
	if s.templates == nil {
		s.templates = map[string]*template{}
	}
	tp := s.templates[key]
	if tp == nil {
		tp = &template{}
		s.templates[key] = tp
	}
	s.tmu.Unlock()
	tp.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		tp.name = dbName("template_" + key)
		if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{tp.name}.Sanitize()+" TEMPLATE template0"); err != nil {
			tp.err = fmt.Errorf("create template %s: %w", tp.name, err)
			return
		}
		u, err := withDatabase(s.baseURL, tp.name)
		if err == nil {
			err = prepare(ctx, u)
		}
		if err != nil {
			tp.err = fmt.Errorf("prepare template %s: %w", tp.name, err)
		}
	})
	if tp.err != nil {
		t.Fatalf("pgtest: %v", tp.err)
	}
	return create(t, tp.name)
}

// state0 returns the server's state, or ends the test as URL says.
func state0(t testing.TB) *state {
	t.Helper()
	s, err := get()
	if err != nil {
		if _, ok := err.(noPostgres); ok {
			if os.Getenv("CYCLEPOOL_REQUIRE_POSTGRES") == "1" {
				t.Fatalf("pgtest: %v (CYCLEPOOL_REQUIRE_POSTGRES=1: install PostgreSQL's server binaries, or set CYCLEPOOL_TEST_DATABASE_URL)", err)
			}
			t.Skip(err)
		}
		t.Fatalf("pgtest: %v", err)
	}
	return s
}

// create makes the test's database as a copy of from, dropped when the test
// ends, and returns its URL.
func create(t testing.TB, from string) string {
	t.Helper()
	s := state0(t)
	name := dbName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{from}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := s.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	u, err := withDatabase(s.baseURL, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// Main runs the tests and then stops the cluster pgtest may have started.
// Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	Shutdown()
	os.Exit(code)
}

// Shutdown stops and removes the cluster started by URL, if any. Main calls
// it; call it yourself from a TestMain that must do more after m.Run.
func Shutdown() {
	mu.Lock()
	defer mu.Unlock()
	if server == nil {
		return
	}
	if server.cluster == nil { // a server of the user's: leave no template behind
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for _, tp := range server.templates {
			if tp.name != "" {
				_, _ = server.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{tp.name}.Sanitize()+" WITH (FORCE)")
			}
		}
		cancel()
	}
	server.admin.Close()
	if server.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = server.cluster.Stop(ctx)
		cancel()
	}
	if server.tmp != "" {
		_ = os.RemoveAll(server.tmp)
	}
	server, initErr = nil, nil
}

type noPostgres struct{ error }

func get() (*state, error) {
	mu.Lock()
	defer mu.Unlock()
	if server != nil || initErr != nil {
		return server, initErr
	}
	server, initErr = start()
	return server, initErr
}

func start() (*state, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := &state{}
	if u := os.Getenv(EnvURL); u != "" {
		s.baseURL = u
	} else {
		if _, err := pgembed.FindBinDir(""); err != nil {
			return nil, noPostgres{fmt.Errorf("%s is not set and %w", EnvURL, err)}
		}
		tmp, err := os.MkdirTemp(tempBase(), "pgtest")
		if err != nil {
			return nil, err
		}
		s.tmp = tmp
		dir := filepath.Join(tmp, "pg")
		c, err := pgembed.Start(ctx, pgembed.Config{Dir: dir, Ephemeral: true})
		if err != nil {
			os.RemoveAll(tmp)
			return nil, err
		}
		s.cluster = c
		s.baseURL = c.URLFor("postgres")
	}
	cfg, err := pgxpool.ParseConfig(s.baseURL)
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("%s: %w", EnvURL, err)
	}
	cfg.MaxConns = 4
	if s.admin, err = pgxpool.NewWithConfig(ctx, cfg); err == nil {
		err = s.admin.Ping(ctx)
	}
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("connect to the test server: %w", err)
	}
	return s, nil
}

func (s *state) stop() {
	if s.admin != nil {
		s.admin.Close()
	}
	if s.cluster != nil {
		_ = s.cluster.Stop(context.Background())
	}
	if s.tmp != "" {
		_ = os.RemoveAll(s.tmp)
	}
}

// tempBase is where the private cluster lives: /dev/shm (tmpfs) when there
// is one, since the cluster is thrown away anyway, else os.TempDir().
func tempBase() string {
	f, err := os.CreateTemp("/dev/shm", "pgtest-probe-*") // there, and writable
	if err != nil {
		return ""
	}
	f.Close()
	_ = os.Remove(f.Name())
	return "/dev/shm"
}

// dbName makes a database name (at most 63 bytes) from a test name.
func dbName(test string) string {
	var b strings.Builder
	b.WriteString("t_")
	for _, r := range strings.ToLower(test) {
		if b.Len() >= 44 {
			break
		}
		if 'a' <= r && r <= 'z' || '0' <= r && r <= '9' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	buf := make([]byte, 6)
	_, _ = rand.Read(buf)
	b.WriteByte('_')
	b.WriteString(hex.EncodeToString(buf))
	return b.String()
}

// withDatabase returns base with its database replaced by name. base is a
// postgres:// URL or a keyword/value connection string.
func withDatabase(base, name string) (string, error) {
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		if err != nil {
			return "", fmt.Errorf("%s: %w", EnvURL, err)
		}
		u.Path = "/" + name
		u.RawPath = ""
		q := u.Query()
		q.Del("dbname")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return base + " dbname=" + name, nil
}
