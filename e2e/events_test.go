package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// A subscriber to a workflow's event stream sees the whole status first,
// then each task's progress and state changes, then the workflow's end.
func TestEventStreamReportsProgressAndStates(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	counter := push(t, p.client, "counter")
	noop := push(t, p.client, "noop")
	id := submit(t, p.client, workflow("events",
		task{"name": "slow", "module": counter, "args": []string{"40", "50"}},
		task{"name": "after", "module": noop, "inputs": map[string]any{"x": map[string]any{"from": "slow"}}},
	))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events, errc := p.client.Events(ctx, id)
	first := <-events
	if first.Type != "status" {
		t.Fatalf("first event is %q, want status", first.Type)
	}
	startWorker(t, "worker", 1, p.srv.url) // only now, so that the stream sees everything happen
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
