//go:build unix

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// liar makes a fake worker answer every assignment at once with a wrong
// result, and heartbeat so that it stays connected. It returns a function
// that reports how many results it sent.
func (f *fakeWorker) liar(t *testing.T) func() int {
	t.Helper()
	sent := make(chan int, 1)
	sent <- 0
	go func() {
		for fr := range f.frames {
			if fr.Type != protocol.TypeAssign {
				continue
			}
			for _, a := range fr.Assign {
				data, bin, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
					Attempt: a.Attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: []byte("forged\n")}}, DurationMS: 1}}})
				if err != nil {
					return
				}
				typ := websocket.MessageText
				if bin {
					typ = websocket.MessageBinary
				}
				wctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
				err = f.ws.Write(wctx, typ, data)
				cancel()
				if err != nil {
					return
				}
				sent <- <-sent + 1
			}
		}
	}()
	return func() int {
		n := <-sent
		sent <- n
		return n
	}
}

type apiWorker struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"`
	Stability *struct {
		Class   string   `json:"class"`
		Reasons []string `json:"reasons"`
	} `json:"stability"`
	Reputation struct {
		Valid   int64   `json:"valid"`
		Invalid int64   `json:"invalid"`
		Score   float64 `json:"score"`
	} `json:"reputation"`
}

// getJSON reads an owner API endpoint into v.
func getJSON(t *testing.T, srv *server, path string, v any) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+srv.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

func listWorkers(t *testing.T, srv *server) []apiWorker {
	t.Helper()
	var body struct {
		Workers []apiWorker `json:"workers"`
	}
	getJSON(t, srv, "/api/v1/workers", &body)
	return body.Workers
}

// verdictAttempt is an attempt with the verdict of its result.
type verdictAttempt struct {
	ID      int64  `json:"id"`
	State   string `json:"state"`
	Worker  string `json:"worker"`
	Verdict string `json:"verdict"`
}

// With replicas 2 and quorum 2, a worker that forges its results cannot
// get one accepted: every task ends with the honest workers' output, each
// replica ran on a different worker, the forged results are marked
// invalid, and the liar's reputation drops (GET /api/v1/workers).
func TestReplicasOutvoteLyingWorker(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	fake := dialFake(t, p.srv.url)
	liarID := fake.welcome.WorkerID
	forged := fake.liar(t)
	echo := push(t, p.client, "echo")
	const n = 6
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("e%d", i), "module": echo,
			"stdin": map[string]any{"data": fmt.Sprintf("honest %d\n", i)}})
	}
	wf := workflow("verified", tasks...)
	wf["replicas"], wf["quorum"] = 2, 2
	id := submit(t, p.client, wf)

	// The liar is alone at first: it takes one replica of some tasks, and
	// nothing can be accepted without a second, matching result.
	eventually(t, 20*time.Second, "the liar to answer an assignment", func() bool { return forged() >= 1 })
	time.Sleep(500 * time.Millisecond)
	if st, err := p.client.Status(context.Background(), id); err != nil || st.Counts.Done != 0 {
		t.Fatalf("tasks done on the liar's word alone: %+v, %v", st, err)
	}

	startWorker(t, "honest1", 1, p.srv.url)
	startWorker(t, "honest2", 1, p.srv.url)
	st := wait(t, p.client, id, 90*time.Second)
	if st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v", st.State, st.Tasks)
	}
	var raw struct {
		Replicas int `json:"replicas"`
		Quorum   int `json:"quorum"`
	}
	getJSON(t, p.srv, "/api/v1/workflows/"+id, &raw)
	if raw.Replicas != 2 || raw.Quorum != 2 {
		t.Errorf("status replicas/quorum = %d/%d, want 2/2", raw.Replicas, raw.Quorum)
	}
	invalid := 0
	for i := range n {
		name := fmt.Sprintf("e%d", i)
		if got, want := output(t, p.client, id, name, "stdout"), fmt.Sprintf("honest %d\n", i); got != want {
			t.Errorf("task %s stdout = %q, want %q", name, got, want)
		}
		var body struct {
			Attempts []verdictAttempt `json:"attempts"`
		}
		getJSON(t, p.srv, "/api/v1/workflows/"+id+"/tasks/"+name+"/attempts", &body)
		as := body.Attempts
		seen := map[string]bool{}
		valid := 0
		for _, a := range as {
			if a.State == "succeeded" || a.State == "running" {
				if seen[a.Worker] {
					t.Errorf("task %s: two replicas on worker %s: %+v", name, a.Worker, as)
				}
				seen[a.Worker] = true
			}
			switch a.Verdict {
			case "valid":
				valid++
				if a.Worker == liarID {
					t.Errorf("task %s: the liar's result was judged valid: %+v", name, a)
				}
			case "invalid":
				invalid++
				if a.Worker != liarID {
					t.Errorf("task %s: an honest result was judged invalid: %+v", name, a)
				}
			}
		}
		if valid < 2 {
			t.Errorf("task %s: %d valid results, want a quorum of 2: %+v", name, valid, as)
		}
		for _, a := range as {
			if a.State == "running" {
				t.Errorf("task %s is done but replica %d still runs (siblings are cancelled): %+v", name, a.ID, as)
			}
		}
	}
	if invalid == 0 {
		t.Fatalf("no result was judged invalid, though the liar sent %d", forged())
	}
	// The liar's reputation, read through the Go client and checked
	// against the raw API.
	wl, err := p.client.Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var liar *client.Worker
	honest := 0
	for i := range wl.Workers {
		w := &wl.Workers[i]
		if w.ID == liarID {
			liar = w
			continue
		}
		honest++
		if w.Reputation.Invalid != 0 || w.Reputation.Valid == 0 || w.Reputation.Score <= 0.5 {
			t.Errorf("honest worker %s: reputation %+v, want valid results only and a score above a new worker's 0.5", w.ID, w.Reputation)
		}
	}
	if liar == nil || honest != 2 {
		t.Fatalf("the liar %s and two honest workers are not all in GET /api/v1/workers: %+v", liarID, wl.Workers)
	}
	if liar.Reputation.Invalid != int64(invalid) || liar.Reputation.Valid != 0 || liar.Reputation.Score >= 0.5 || liar.Reputation.Trusted {
		t.Errorf("liar reputation = %+v, want %d invalid, none valid, score below a new worker's 0.5", liar.Reputation, invalid)
	}
	if liar.Stability == nil || liar.Stability.Class == "" {
		t.Errorf("liar has no stability class in the API: %+v", liar)
	}
	for _, w := range listWorkers(t, p.srv) {
		if w.ID == liarID && w.Reputation.Invalid != liar.Reputation.Invalid {
			t.Errorf("client and API disagree: %+v vs %+v", w.Reputation, liar.Reputation)
		}
	}
	// Verification shows in the status object the client reads.
	if st, err := p.client.Status(context.Background(), id); err != nil || st.Replicas != 2 || st.Quorum != 2 || st.Efficiency == nil {
		t.Errorf("status through the client: %+v, %v; want replicas 2, quorum 2 and an efficiency", st, err)
	}
}

// A replicated workflow with fewer workers connected than each task needs
// says so in its status, rather than leaving its tasks ready with no word;
// once enough workers are there it runs, and the notice goes.
func TestReplicatedWorkflowSaysItWaitsForWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	startWorker(t, "one", 1, p.srv.url)
	echo := push(t, p.client, "echo")
	wf := workflow("replicated", task{"name": "e", "module": echo, "stdin": map[string]any{"data": "x\n"}})
	wf["replicas"] = 2
	id := submit(t, p.client, wf)
	eventually(t, 30*time.Second, "the status to say the tasks wait for workers", func() bool {
		st, err := p.client.Status(ctx, id)
		return err == nil && strings.Contains(st.Notice, "each task runs on 2 distinct workers") &&
			strings.Contains(st.Notice, "1 worker is connected")
	})
	startWorker(t, "two", 1, p.srv.url)
	st := wait(t, p.client, id, 60*time.Second)
	if st.State != client.WorkflowDone || st.Notice != "" {
		t.Fatalf("with two workers: %s, notice %q", st.State, st.Notice)
	}
}
