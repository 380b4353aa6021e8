//go:build unix

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// Owners share the workers: a second owner's small workflow, submitted
// just behind a first owner's backlog, runs at the next free slots rather
// than after the whole backlog. When it is done, most of the backlog is
// still to run (one queue for everyone left it none).
func TestOwnersShareTheWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	out, err := runCLI(t, p.db, "token", "create", "second")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	second := client.New(p.srv.url, strings.TrimSpace(out))
	firstCounter, secondCounter := push(t, p.client, "counter"), push(t, second, "counter")
	startHeldWorker(t, "worker", 2, p.srv.url)

	const backlog = 100
	var tasks []task
	for i := range backlog {
		tasks = append(tasks, task{"name": fmt.Sprintf("b%03d", i), "module": firstCounter, "args": []string{"2", heldStep(50)}})
	}
	first := submit(t, p.client, workflow("backlog", tasks...))
	small := submit(t, second, workflow("small",
		task{"name": "s0", "module": secondCounter, "args": []string{"2", heldStep(50)}},
		task{"name": "s1", "module": secondCounter, "args": []string{"2", heldStep(50)}}))
	if st := wait(t, second, small, 30*time.Second); st.State != "done" {
		t.Fatalf("the second owner's workflow ended %s: %+v", st.State, st.Tasks)
	}
	st, err := p.client.Status(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	waiting := 0
	for _, task := range st.Tasks {
		if task.State == "ready" {
			waiting++
		}
	}
	if waiting < backlog/2 {
		t.Errorf("%d of the backlog's %d tasks still waited when the second owner's workflow was done, want at least %d", waiting, backlog, backlog/2)
	}
	if st := wait(t, p.client, first, time.Minute); st.State != "done" {
		t.Fatalf("the backlog ended %s", st.State)
	}
}
