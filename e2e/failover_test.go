//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/pgembed"
)

// PostgreSQL fails over in the middle of a workflow, as Patroni or
// CloudNativePG do it: the primary, with a synchronous streaming standby,
// stops dead, and the standby is promoted. Two replicas, given both hosts
// with target_session_attrs=read-write, are not ready while neither takes
// writes, find the new primary by themselves, and the workflow finishes with
// every task done once and correct; every output an owner read before the
// failover is still there, the same.
func TestPostgresFailoverToStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	base := t.TempDir()
	primary, err := pgembed.Start(ctx, pgembed.Config{Dir: filepath.Join(base, "primary"), Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })
	// Ephemeral spares the disk (fsync off); commits still wait for their
	// WAL, and below for the standby's too.
	sql(t, primary.URLFor("postgres"), `ALTER SYSTEM SET synchronous_commit = on`, `SELECT pg_reload_conf()`)
	standby := startStandby(t, primary, filepath.Join(base, "standby"), "standby1")
	t.Cleanup(func() { _ = standby.Stop(context.Background()) })
	// Commits wait for the standby to have the WAL: what was acknowledged
	// survives the primary's loss.
	sql(t, primary.URLFor("postgres"),
		`ALTER SYSTEM SET synchronous_standby_names = 'standby1'`,
		`SELECT pg_reload_conf()`)
	eventually(t, 30*time.Second, "the standby to be synchronous", func() bool {
		return queryString(t, primary.URLFor("postgres"),
			`SELECT coalesce(max(sync_state), '') FROM pg_stat_replication WHERE application_name = 'standby1'`) == "sync"
	})

	pw, _ := url.Parse(primary.URL())
	db := fmt.Sprintf("postgres://%s@127.0.0.1:%d,127.0.0.1:%d/%s?target_session_attrs=read-write",
		pw.User.String(), primary.Port(), standby.Port(), pgembed.Database)
	srv := startServer(t, "server", db, t.TempDir(), 0)
	srv2 := startServer(t, "server2", db, t.TempDir(), 0)
	c := client.New(srv.url, srv.token)
	startHeldWorker(t, "worker", 2, srv.url, srv2.url)
	startHeldWorker(t, "worker2", 2, srv2.url, srv.url)
	counter := push(t, c, "counter")
	const n = 16
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("c%02d", i), "module": counter,
			"args": []string{strconv.Itoa(failoverSteps(i)), heldStep(100)}, "checkpoint_interval": "1s", "max_attempts": 1})
	}
	id := submit(t, c, workflow("failover", tasks...))
	eventually(t, 60*time.Second, "some tasks done", func() bool {
		st, err := c.Status(ctx, id)
		return err == nil && st.Counts.Done >= 3 && st.Counts.Done < n
	})
	// What the owner has read before the failover.
	read := map[string]string{}
	st, err := c.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range st.Tasks {
		if tk.State == client.TaskDone {
			read[tk.Name] = output(t, c, id, tk.Name, "stdout")
		}
	}

	maxID, _ := strconv.ParseInt(queryString(t, primary.URL(), `SELECT coalesce(max(id), 0)::text FROM attempts`), 10, 64)
	if st, err := c.Status(ctx, id); err != nil || st.Counts.Done == n {
		t.Fatalf("the workflow finished before the failover (%v): the test is too short to say anything", err)
	}

	primary.Crash()
	readyz := func() int { code, _ := get(t, srv.url+"/readyz"); return code }
	eventually(t, 30*time.Second, "/readyz to say 503 with no primary", func() bool {
		return readyz() == http.StatusServiceUnavailable
	})
	if code, body := get(t, srv.url+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "database") {
		t.Errorf("/readyz with no primary: %d %q, want 503 naming the database", code, body)
	} else {
		t.Logf("/readyz with no primary: %s", strings.TrimSpace(body))
	}
	sql(t, standby.URLFor("postgres"), `SELECT pg_promote()`)
	eventually(t, 60*time.Second, "/readyz of both replicas to answer 200 on the new primary", func() bool {
		code, _ := get(t, srv2.url+"/readyz")
		return readyz() == http.StatusOK && code == http.StatusOK
	})
	st = wait(t, c, id, 2*time.Minute)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	checkFailoverTasks(t, c, id, n)
	// Nobody was charged for the failover: no attempt was lost, and no
	// worker counts a loss.
	if lost := queryString(t, standby.URL(), `SELECT (SELECT count(*) FROM attempts WHERE state = 'lost')
		+ (SELECT coalesce(sum(tasks_lost), 0) FROM workers)`); lost != "0" {
		t.Errorf("%s lost attempts and workers' losses after the failover, want none", lost)
	}
	for name, out := range read {
		if got := output(t, c, id, name, "stdout"); got != out {
			t.Errorf("task %s: the owner read %q before the failover and %q after", name, out, got)
		}
	}
	t.Logf("%d tasks were done and read before the failover", len(read))
	// Claims commit without waiting for the standby: attempt ids handed
	// out just before the failover may be unknown to the new primary, so
	// its sequence jumped past them (the unlogged guard table is empty on
	// a promoted standby), and no id is given twice.
	seq, _ := strconv.ParseInt(queryString(t, standby.URL(), `SELECT last_value::text FROM attempts_id_seq`), 10, 64)
	if seq < 1_000_000 || seq <= maxID {
		t.Errorf("the attempt id sequence is at %d on the new primary, want it to have jumped a million, past %d", seq, maxID)
	}
}

// failoverSteps is the step count (of 100 ms) of failover task i: enough
// that some tasks still run when the primary dies.
func failoverSteps(i int) int { return 8 + i%3 }

// checkFailoverTasks is checkCounterTasks for failoverSteps.
func checkFailoverTasks(t *testing.T, c *client.Client, id string, n int) {
	t.Helper()
	st, err := c.Status(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := fmt.Sprintf("c%02d", i)
		tk := st.Task(name)
		if tk == nil || tk.State != client.TaskDone || tk.Attempts != 1 {
			t.Errorf("task %s: %+v, want done in its one attempt", name, tk)
			continue
		}
		if out := output(t, c, id, name, "stdout"); !regexp.MustCompile(fmt.Sprintf(`^counted %d from \d+\n$`, failoverSteps(i))).MatchString(out) {
			t.Errorf("task %s stdout = %q", name, out)
		}
	}
}

// startStandby makes a streaming standby of primary in dir
// (pg_basebackup -R, with application name name) and starts it.
func startStandby(t *testing.T, primary *pgembed.Cluster, dir, name string) *pgembed.Cluster {
	t.Helper()
	ctx := context.Background()
	bin, err := pgembed.FindBinDir("")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(primary.URL())
	pw, _ := u.User.Password()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=%s password=%s application_name=%s",
		primary.Port(), u.User.Username(), pw, name)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"), "-d", conninfo, "-D", data,
		"-R", "-X", "stream", "-c", "fast", "--no-sync")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	// The standby names itself to the primary, which waits for it by name.
	f, err := os.OpenFile(filepath.Join(data, "postgresql.auto.conf"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "primary_conninfo = '%s'\n", conninfo)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	// The same password, and the same owner as the primary's files (the
	// server runs as another user when the tests run as root).
	if b, err := os.ReadFile(filepath.Join(primary.Dir(), "password")); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(filepath.Join(dir, "password"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(primary.Dir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := filepath.Walk(data, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, int(sys.Uid), int(sys.Gid))
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(data, 0o700); err != nil {
		t.Fatal(err)
	}
	c, err := pgembed.Start(ctx, pgembed.Config{Dir: dir, Ephemeral: true})
	if err != nil {
		t.Fatalf("start the standby: %v", err)
	}
	if queryString(t, c.URLFor("postgres"), `SELECT pg_is_in_recovery()::text`) != "true" {
		t.Fatal("the standby is not in recovery")
	}
	return c
}

// sql runs statements on the database at url.
func sql(t *testing.T, url string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range stmts {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// queryString runs a query of one text value on the database at url.
func queryString(t *testing.T, url, q string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, q).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return s
}
