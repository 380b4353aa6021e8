package app

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/internal/store"
)

// bigWorkflow is 4,900 independent tasks and 100 that each read 49 of them.
func bigWorkflow() (names, states []string, edges [][2]string) {
	for i := range 4900 {
		names = append(names, fmt.Sprintf("part-%d", i))
		states = append(states, "done")
	}
	for i := range 100 {
		names = append(names, fmt.Sprintf("merge-%d", i))
		states = append(states, "blocked")
		for j := range 49 {
			edges = append(edges, [2]string{fmt.Sprintf("part-%d", i*49+j), names[len(names)-1]})
		}
	}
	return
}

func TestLayoutGroupsBigWorkflows(t *testing.T) {
	names, states, edges := bigWorkflow()
	g, unitOf := layout(names, states, edges)
	if !g.Grouped || len(g.Nodes) != 2 || len(g.Edges) != 1 {
		t.Fatalf("grouped=%v nodes=%d edges=%d, want 2 groups and 1 edge", g.Grouped, len(g.Nodes), len(g.Edges))
	}
	if unitOf[0] != unitOf[4899] || unitOf[0] == unitOf[4900] {
		t.Errorf("tasks in the wrong groups: %v %v %v", unitOf[0], unitOf[4899], unitOf[4900])
	}
	if g.Nodes[0].State != "done" || g.Nodes[0].Done != 4900 || g.Nodes[1].State != "blocked" {
		t.Errorf("group states: %+v %+v", g.Nodes[0], g.Nodes[1])
	}
}

func TestLayoutSmall(t *testing.T) {
	g, _ := layout([]string{"a", "b", "c"}, []string{"done", "running", "blocked"}, [][2]string{{"a", "c"}, {"b", "c"}})
	if g.Grouped || len(g.Nodes) != 3 || len(g.Edges) != 2 {
		t.Fatalf("grouped=%v nodes=%d edges=%d", g.Grouped, len(g.Nodes), len(g.Edges))
	}
	if g.Nodes[2].X <= g.Nodes[0].X {
		t.Errorf("c is not right of a: %+v", g.Nodes)
	}
}

// The whole workflow page of 5,000 tasks renders in well under a second on
// the server.
func TestRenderBigWorkflowPage(t *testing.T) {
	names, states, edges := bigWorkflow()
	g, unitOf := layout(names, states, edges)
	d := WorkflowData{ID: "x", Name: "big", State: "running", Graph: g}
	for i, n := range names {
		d.Tasks = append(d.Tasks, TaskRow{Task: api.Task{Name: n, State: states[i]}, Node: unitOf[i]})
	}
	start := time.Now()
	var b bytes.Buffer
	if err := WorkflowPage(Layout{}, d).Render(context.Background(), &b); err != nil {
		t.Fatal(err)
	}
	t.Logf("rendered %d KiB in %v", b.Len()>>10, time.Since(start))
}

// A disputed result is marked in its row and counted above the graph, from
// the workflow's status as the backend gives it.
func TestWorkflowPageShowsDisputedResults(t *testing.T) {
	tests := []struct {
		name     string
		disputed []bool
		notice   string // "" for no notice
	}{
		{"none", []bool{false, false}, ""},
		{"one", []bool{true, false}, "1 of this workflow&#39;s results is disputed"},
		{"two", []bool{true, true}, "2 of this workflow&#39;s results are disputed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := &api.Status{ID: "x", Name: "wf", State: "done", CreatedAt: time.Now()}
			want := 0
			for i, disp := range tc.disputed {
				st.Tasks = append(st.Tasks, api.Task{Name: fmt.Sprint("t", i), State: "done", Disputed: disp})
				if disp {
					want++
				}
			}
			hd := New(statusBackend{st: st}, Options{Key: make([]byte, 32)})
			sess := session{OwnerID: 1, Owner: "ada", Expires: time.Now().Add(time.Hour).Unix(), Nonce: "n"}
			req := httptest.NewRequest(http.MethodGet, "http://localhost/app/workflows/x", nil)
			req.AddCookie(&http.Cookie{Name: sessionCookie, Value: hd.(*handler).sign("session", sess)})
			rec := httptest.NewRecorder()
			hd.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("GET the workflow page: %d %s", rec.Code, rec.Body)
			}
			page := rec.Body.String()
			if got := strings.Count(page, `class="badge st-disputed"`); got != want {
				t.Errorf("%d disputed badges, want %d", got, want)
			}
			if has := strings.Contains(page, `id="disputed"`); has != (tc.notice != "") || !strings.Contains(page, tc.notice) {
				t.Errorf("notice shown %v, want %q in the page", has, tc.notice)
			}
		})
	}
}

// statusBackend serves one workflow's status, with no edges.
type statusBackend struct {
	fakeBackend
	st *api.Status
}

func (b statusBackend) Status(context.Context, store.Owner, string) (*api.Status, error) {
	return b.st, nil
}

func (b statusBackend) Edges(context.Context, store.Owner, string) ([][2]string, error) {
	return nil, nil
}
