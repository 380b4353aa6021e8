//go:build unix

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/pgembed"
)

// PostgreSQL itself restarts in the middle of a workflow: the server
// reconnects (pool, LISTEN, batches sent again) and the workflow completes
// with every task done exactly once. While PostgreSQL is down, /readyz
// says so and /healthz does not, and the replica stops leading the
// maintenance.
func TestPostgresRestartMidWorkflow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "pg")
	pg, err := pgembed.Start(ctx, pgembed.Config{Dir: dir, Ephemeral: false})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pg.Stop(context.Background()) })
	port := pg.Port()
	srv := startServer(t, "server", pg.URL(), t.TempDir(), 0)
	c := client.New(srv.url, srv.token)
	startHeldWorker(t, "worker", 2, srv.url)
	counter := push(t, c, "counter")
	const n = 12
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("c%02d", i), "module": counter,
			"args": []string{strconv.Itoa(steps(i)), heldStep(100)}, "checkpoint_interval": "1s"})
	}
	id := submit(t, c, workflow("pg-restart", tasks...))
	eventually(t, 60*time.Second, "some tasks done", func() bool {
		st, err := c.Status(ctx, id)
		return err == nil && st.Counts.Done >= 2
	})
	if err := pg.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Without its database the server is alive but not ready.
	status := func(path string) int {
		resp, err := http.Get(srv.url + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := status("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz answered %d with PostgreSQL down, want 503", code)
	}
	if code := status("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz answered %d with PostgreSQL down, want 200", code)
	}
	// Unable to renew its lead, the replica stops leading the maintenance.
	eventually(t, 10*time.Second, "the replica to stop leading", func() bool {
		return metric(t, srv.url, "cyclepool_maintenance_leader") == 0
	})
	pg, err = pgembed.Start(ctx, pgembed.Config{Dir: dir, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "/readyz to answer 200 again", func() bool { return status("/readyz") == http.StatusOK })
	st := wait(t, c, id, 2*time.Minute)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	checkCounterTasks(t, c, id, n)
}
