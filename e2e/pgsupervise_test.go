//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/pgembed"
)

// The embedded PostgreSQL of `cyclepool serve` (no --database-url) is
// killed with SIGKILL in the middle of a workflow, as the OOM killer would
// kill it: serve starts it again by itself, says so in its log, and the
// workflow finishes with every task done exactly once and every output
// right. Nobody restarts anything by hand.
func TestEmbeddedPostgresKilledMidWorkflow(t *testing.T) {
	t.Parallel()
	if _, err := pgembed.FindBinDir(""); err != nil {
		t.Skip(err)
	}
	// Not t.TempDir: its name is long, and the cluster's unix socket path
	// must be short.
	data, err := os.MkdirTemp("", "cp-e2e")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	// --database-url= overrides a DATABASE_URL in the environment: serve
	// starts its embedded PostgreSQL under data/postgres.
	srv := start(t, "server", "serve", "--addr", fmt.Sprintf("127.0.0.1:%d", port), "--database-url=",
		"--data-dir", data, "--lease", "2s", "--replica", "server")
	tok, ok := srv.out.waitFor(tokenRE, 2*time.Minute)
	if !ok {
		t.Fatalf("server did not start:\n%s", srv.out)
	}
	c := client.New(url, tok)
	startHeldWorker(t, "worker", 2, url)
	counter := push(t, c, "counter")
	const n = 8
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("c%02d", i), "module": counter,
			"args": []string{strconv.Itoa(steps(i)), heldStep(300)}, "checkpoint_interval": "1s"})
	}
	id := submit(t, c, workflow("embedded-pg-killed", tasks...))
	var before *client.Status
	eventually(t, 60*time.Second, "some tasks done", func() bool {
		st, err := c.Status(context.Background(), id)
		before = st
		return err == nil && st.Counts.Done >= 2
	})

	if before.Counts.Done >= n {
		t.Fatalf("every task was done before the kill: the test says nothing of a workflow cut in the middle")
	}
	pidFile := filepath.Join(data, "postgres", "data", "postmaster.pid")
	pid := postmasterPID(t, pidFile)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the postmaster (pid %d): %v", pid, err)
	}
	t.Logf("killed the postmaster (pid %d) with %d of %d tasks done", pid, before.Counts.Done, n)

	hc := &http.Client{Timeout: 10 * time.Second}
	readyz := func() int {
		resp, err := hc.Get(url + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Whether /readyz sees the outage depends on how fast the restart is:
	// only note it.
	if code := readyz(); code != http.StatusOK {
		t.Logf("/readyz answered %d right after the kill", code)
	}
	if _, ok := srv.out.waitFor(regexp.MustCompile(`level=WARN msg="embedded PostgreSQL exited; restarting" status="signal: killed"`), time.Minute); !ok {
		t.Fatalf("the server did not log the restart:\n%s", srv.out)
	}
	if _, ok := srv.out.waitFor(regexp.MustCompile(`level=INFO msg="embedded PostgreSQL restarted and accepts connections"`), 2*time.Minute); !ok {
		t.Fatalf("the server did not log that PostgreSQL runs again:\n%s", srv.out)
	}
	if now := postmasterPID(t, pidFile); now == pid {
		t.Errorf("postmaster.pid still names the killed postmaster %d", pid)
	}
	eventually(t, time.Minute, "/readyz to answer 200 again", func() bool { return readyz() == http.StatusOK })

	st := wait(t, c, id, 3*time.Minute)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	checkCounterTasks(t, c, id, n)
	if code := readyz(); code != http.StatusOK {
		t.Errorf("/readyz answered %d at the end, want 200", code)
	}
	if k := strings.Count(srv.out.String(), `msg="embedded PostgreSQL exited; restarting"`); k != 1 {
		t.Errorf("the server restarted PostgreSQL %d times, want once", k)
	}
}

// postmasterPID reads the postmaster's pid from the first line of its
// postmaster.pid.
func postmasterPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		t.Fatalf("%s: no pid on its first line: %q", path, b)
	}
	return pid
}
