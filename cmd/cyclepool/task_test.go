package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
)

// A workflow is named by its id or by a unique start of it; a start that
// names none or several is refused, saying which.
func TestResolveIDByPrefix(t *testing.T) {
	ids := []string{"6b0c1111-0000-4000-8000-000000000001", "6b0c2222-0000-4000-8000-000000000002", "9f000000-0000-4000-8000-000000000003"}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Query().Get("id_prefix")
		var l client.WorkflowList
		for _, id := range ids {
			if strings.HasPrefix(id, p) {
				l.Workflows = append(l.Workflows, client.Status{ID: id})
			}
		}
		l.Total = len(l.Workflows)
		json.NewEncoder(w).Encode(l)
	}))
	defer srv.Close()
	c := client.New(srv.URL, "t")
	for _, tc := range []struct {
		in, want, err string
	}{
		{"6b0c1", ids[0], ""},
		{"9F", ids[2], ""},
		{ids[1], ids[1], ""},
		{"6b0c", "", "starts the ids of 2 workflows"},
		{"77", "", `no workflow of yours has an id that starts with "77"`},
	} {
		got, err := c.ResolveID(context.Background(), tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("ResolveID(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestWriteAttempts(t *testing.T) {
	start := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	end := start.Add(1500 * time.Millisecond)
	var b strings.Builder
	if err := writeAttempts(&b, []client.Attempt{
		{ID: 7, State: "failed", Worker: "5d1e0a2b-aaaa-4bbb-8ccc-000000000000", Reason: "exit: exit status 1", StartedAt: &start, EndedAt: &end},
		{ID: 9, State: "running", Worker: "77aa0a2b-aaaa-4bbb-8ccc-000000000000", StartedAt: &start},
	}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ATTEMPT", "7  ", "failed", "5d1e0a2b ", "1.5s", "exit: exit status 1", "running", "77aa0a2b"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("attempts table lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := writeAttempts(&b, nil); err != nil || !strings.Contains(b.String(), "no attempts yet") {
		t.Errorf("no attempts: %q %v", b.String(), err)
	}
}

// version, --version and help's list.
func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		var stderr strings.Builder
		if code := dispatch(context.Background(), args, &stderr); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, stderr.String())
		}
	}
}
