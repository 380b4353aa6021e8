//go:build unix

package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// A headless worker's queue grows while its tasks are short, as the
// browser worker's does (--max-queue, by default 32 per slot): a worker
// with one slot and a queue of one asks for a longer queue, so that under
// load the server can claim and commit its tasks in larger batches; with
// --max-queue no larger than --queue, the queue stays as it is.
func TestHeadlessQueueGrowsForShortTasks(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	grows := start(t, "worker", "worker", "--server", p.srv.url, "--slots", "1", "--queue", "1", "--cache-dir", compileCache())
	fixed := start(t, "fixed worker", "worker", "--server", p.srv.url, "--slots", "1", "--queue", "1", "--max-queue", "1",
		"--cache-dir", compileCache())
	noop := push(t, p.client, "noop")
	const n = 400
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("t%03d", i), "module": noop})
	}
	id := submit(t, p.client, workflow("short", tasks...))
	if st := wait(t, p.client, id, 90*time.Second); st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s", st.State)
	}
	// About 100 ms of work per slot, at most 32 for one slot: 32 for a
	// no-op task on a quiet machine, fewer on a busy one, where one takes
	// longer; more than the 1 it started with either way.
	adapted := regexp.MustCompile(`msg="queue adapted to the tasks" queue=(\d+)`)
	q, ok := grows.out.waitFor(adapted, 10*time.Second)
	if n, err := strconv.Atoi(q); !ok || err != nil || n < 2 || n > 32 {
		t.Errorf("the worker's queue became %q, want 2 to 32 (it started at 1; 32 is its longest for one slot)", q)
	}
	if countLines(fixed.out, adapted) > 0 {
		t.Errorf("the queue of the worker with --max-queue 1 changed:\n%s", fixed.out)
	}
}
