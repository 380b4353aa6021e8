//go:build unix

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// A subscriber to a workflow's event stream sees the whole status first,
// then each task's progress and state changes, then the workflow's end.
func TestEventStreamReportsProgressAndStates(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	counter := push(t, p.client, "counter")
	noop := push(t, p.client, "noop")
	id := submit(t, p.client, workflow("events",
		task{"name": "slow", "module": counter, "args": []string{"40", heldStep(50)}},
		task{"name": "after", "module": noop, "inputs": map[string]any{"x": map[string]any{"from": "slow"}}},
	))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, errc := p.client.Events(ctx, id)
	first := <-events
	if first.Type != "status" {
		t.Fatalf("first event is %q, want status", first.Type)
	}
	startHeldWorker(t, "worker", 1, p.srv.url) // only now, so that the stream sees everything happen
	states := map[string][]string{}
	sawProgress := false
	var end map[string]string
	for ev := range events {
		switch ev.Type {
		case "task":
			var tk struct {
				Name     string  `json:"name"`
				State    string  `json:"state"`
				Progress float64 `json:"progress"`
			}
			if err := json.Unmarshal(ev.Data, &tk); err != nil {
				t.Fatal(err)
			}
			if s := states[tk.Name]; len(s) == 0 || s[len(s)-1] != tk.State {
				states[tk.Name] = append(states[tk.Name], tk.State)
			}
			if tk.State == "running" && tk.Progress > 0 && tk.Progress < 1 {
				sawProgress = true
			}
		case "workflow":
			if err := json.Unmarshal(ev.Data, &end); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := <-errc; err != nil {
		t.Fatalf("stream ended with %v", err)
	}
	if end["state"] != "done" || end["id"] != id {
		t.Fatalf("workflow event %v, want done", end)
	}
	if got := states["slow"]; len(got) < 2 || got[len(got)-2] != "running" || got[len(got)-1] != "done" {
		t.Errorf("slow went through %v, want ... running, done", got)
	}
	if got := states["after"]; len(got) == 0 || got[len(got)-1] != "done" {
		t.Errorf("after went through %v, want ... done", got)
	}
	if !sawProgress {
		t.Errorf("no progress between 0 and 1 was streamed for the running task")
	}
}

// GET /api/v1/workflows/{id}?wait= answers as soon as the workflow ends
// (woken by the database's notification, not at a poll), answers with the
// workflow still running when the wait runs out, refuses a bad wait, and
// keeps other owners out like the plain status request.
func TestStatusWaitAnswersWhenTheWorkflowEnds(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	counter := push(t, p.client, "counter")
	id := submit(t, p.client, workflow("long-poll", task{"name": "count", "module": counter, "args": []string{"20", heldStep(50)}}))

	// No worker yet: the wait runs out and the answer says running.
	began := time.Now()
	st, err := p.client.StatusWhenFinished(ctx, id, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); st.State != "running" || took < 250*time.Millisecond {
		t.Errorf("short wait: state %s after %v, want running after about 300ms", st.State, took)
	}

	// The client sends only valid waits: send bad ones by hand.
	for _, bad := range []string{"soon", "-1s", "61s"} {
		if code, body := p.request(ctx, t, http.MethodGet, "/api/v1/workflows/"+id+"?wait="+bad, nil); code != 400 ||
			!strings.Contains(body, "wait must be a duration") {
			t.Errorf("wait=%s: HTTP %d %q, want 400 naming the wait", bad, code, body)
		}
	}
	out, err := runCLI(t, p.db, "token", "create", "eve")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	var apiErr *client.APIError
	if _, err := client.New(p.srv.url, strings.TrimSpace(out)).StatusWhenFinished(ctx, id, time.Second); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("another owner's wait: %v, want 404", err)
	}

	type answer struct {
		st  *client.Status
		err error
		at  time.Time
	}
	ans := make(chan answer, 1)
	go func() {
		// Upper case, which the API accepts too: the wake-up still finds it.
		st, err := p.client.StatusWhenFinished(ctx, strings.ToUpper(id), time.Minute)
		ans <- answer{st, err, time.Now()}
	}()
	startHeldWorker(t, "worker", 1, p.srv.url)
	a := <-ans
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.st.State != "done" || a.st.FinishedAt == nil || len(a.st.Tasks) != 1 || len(a.st.Tasks[0].Outputs) == 0 {
		t.Fatalf("long poll answered %+v, want the done workflow with its outputs", a.st)
	}
	// The status the completion read for the long poll is the one a
	// request reads afterwards.
	if after, err := p.client.Status(ctx, id); err != nil || !reflect.DeepEqual(after, a.st) {
		t.Errorf("long poll answered\n%+v\na status read after is\n%+v (%v)", a.st, after, err)
	}
	// Well before the minute: the end was told, not found by a poll.
	if late := a.at.Sub(*a.st.FinishedAt); late > 5*time.Second {
		t.Errorf("long poll answered %v after the workflow finished", late)
	}
}

// POST /api/v1/workflows?wait= submits a workflow and waits for its end in
// one request: with no worker, the wait runs out and the answer (201) says
// the workflow, written, is running; with one, the answer is the done
// workflow with its outputs, the same status a request reads afterwards.
// A bad wait is refused before anything is written.
func TestSubmitAndWait(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	counter := push(t, p.client, "counter")
	wf := func(name string) []byte {
		b, err := json.Marshal(workflow(name, task{"name": "count", "module": counter, "args": []string{"3", "1"}}))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	total := func() int {
		l, err := p.client.List(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Total
	}

	st, err := p.client.SubmitAndWait(ctx, wf("no-worker"), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "running" || st.ID == "" || len(st.Tasks) != 1 {
		t.Fatalf("with no worker: %+v, want the running workflow", st)
	}
	if _, err := p.client.Status(ctx, st.ID); err != nil {
		t.Fatalf("the workflow answered running was not written: %v", err)
	}

	before := total()
	if code, body := p.request(ctx, t, http.MethodPost, "/api/v1/workflows?wait=soon", wf("bad-wait")); code != 400 ||
		!strings.Contains(body, "wait must be a duration") {
		t.Errorf("wait=soon: HTTP %d %q, want 400 naming the wait", code, body)
	}
	if n := total(); n != before {
		t.Errorf("%d workflows written by a refused submission", n-before)
	}

	startHeldWorker(t, "worker", 1, p.srv.url)
	st, err = p.client.SubmitAndWait(ctx, wf("with-worker"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "done" || st.FinishedAt == nil || len(st.Tasks) != 1 || len(st.Tasks[0].Outputs) == 0 {
		t.Fatalf("with a worker: %+v, want the done workflow with its outputs", st)
	}
	if after, err := p.client.Status(ctx, st.ID); err != nil || !reflect.DeepEqual(after, st) {
		t.Errorf("submit and wait answered\n%+v\na status read after is\n%+v (%v)", st, after, err)
	}
}

// request sends an API request by hand, as the owner (the client sends
// only valid ones), and returns the answer's status and body.
func (p *platform) request(ctx context.Context, t *testing.T, method, path string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, p.srv.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+p.srv.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
