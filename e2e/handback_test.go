//go:build unix

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// A worker stopped on purpose (SIGTERM, Ctrl-C) hands its attempts back,
// running and queued: their tasks are ready again at once, without using
// up an attempt, instead of when the leases lapse (here 30 s), as lost
// attempts that count. Tasks allowed one attempt each would otherwise end
// failed; here another worker then runs them.
func TestStoppedWorkerHandsItsAttemptsBack(t *testing.T) {
	t.Parallel()
	p := newPlatform(t, "--lease", "30s")
	srv, c := p.srv, p.client
	w := startWorker(t, "worker", 1, srv.url) // one running, one queued
	spin := push(t, c, "spin")
	noop := push(t, c, "noop")
	var tasks []task
	for i := range 3 {
		// spin without arguments loops until stopped.
		tasks = append(tasks, task{"name": fmt.Sprintf("t%d", i), "module": spin, "max_attempts": 1})
	}
	id := submit(t, c, workflow("handback", tasks...))
	held := func() (running int, all []client.Attempt) {
		for i := range 3 {
			as := attempts(t, c, id, fmt.Sprintf("t%d", i))
			running += countState(as, "running")
			all = append(all, as...)
		}
		return running, all
	}
	eventually(t, 20*time.Second, "the worker to hold two attempts", func() bool {
		n, _ := held()
		return n == 2
	})
	stopped := time.Now()
	w.stop()
	eventually(t, 10*time.Second, "the attempts to come back", func() bool {
		n, _ := held()
		return n == 0
	})
	if d := time.Since(stopped); d > 10*time.Second {
		t.Errorf("the attempts came back after %v; the lease is 30 s", d)
	}
	_, all := held()
	for _, a := range all {
		if a.State != "failed" || !strings.Contains(a.Reason, "shutting down") {
			t.Errorf("attempt %d ended %s (%q), want failed, handed back by a worker shutting down", a.ID, a.State, a.Reason)
		}
	}
	st, err := c.Status(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range st.Tasks {
		if tk.State != client.TaskReady {
			t.Errorf("task %s is %s after the hand-back, want ready (its one attempt not used up)", tk.Name, tk.State)
		}
	}
	// The tasks run again on another worker, which has a slot left for
	// more work.
	startWorker(t, "second worker", 4, srv.url)
	eventually(t, 20*time.Second, "another worker to run the tasks", func() bool {
		n, _ := held()
		return n == 3
	})
	if done := submit(t, c, workflow("after", task{"name": "n", "module": noop})); wait(t, c, done, 30*time.Second).State != client.WorkflowDone {
		t.Errorf("a workflow after the hand-back did not finish")
	}
}

// serve's local worker (make run) hands its attempts back too when the
// server stops: after a restart their tasks are ready, with none of their
// one attempt used up.
func TestStoppedServerHandsItsLocalWorkersAttemptsBack(t *testing.T) {
	t.Parallel()
	db := migratedDB(t)
	data := t.TempDir()
	shareCompileCache(t, data)
	srv := startServer(t, "server", db, data, 0, "--lease", "30s", "--local-worker", "1")
	c := client.New(srv.url, srv.token)
	spin := push(t, c, "spin")
	id := submit(t, c, workflow("local", task{"name": "a", "module": spin, "max_attempts": 1},
		task{"name": "b", "module": spin, "max_attempts": 1}))
	eventually(t, 20*time.Second, "the local worker to hold both tasks", func() bool {
		st, err := c.Status(t.Context(), id)
		return err == nil && st.Counts.Running == 2
	})
	srv.stop()
	srv2 := startServer(t, "server2", db, data, 0, "--lease", "30s") // a port of its own: another test may have taken the first's
	c = client.New(srv2.url, srv2.token)
	st, err := c.Status(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range st.Tasks {
		if tk.State != client.TaskReady || tk.Attempts != 0 {
			t.Errorf("task %s is %s with %d attempts used after the restart, want ready with none", tk.Name, tk.State, tk.Attempts)
		}
	}
}
