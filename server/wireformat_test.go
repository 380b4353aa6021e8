package server

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/internal/store"
)

var updateShapes = flag.Bool("update", false, "rewrite server/testdata/api/*.shape from the API's answers")

// The REST API's wire format, endpoint by endpoint: the shape of each
// answer (every field's name and JSON type, nested; an array as its first
// element) must be the one in testdata/api/ENDPOINT.shape, so that a
// change of the format, such as a store field renamed and with it a JSON
// name, shows in review. After a deliberate change, run
// `go test ./server -run TestWireFormat -update` and say so in docs/API.md.
func TestWireFormat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newBlobServer(t, Config{})
	check := func(name string, status, want int, body []byte) {
		t.Helper()
		if status != want {
			t.Fatalf("%s: status %d, want %d: %s", name, status, want, body)
		}
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("%s: not JSON: %v: %s", name, err, body)
		}
		got, _ := json.MarshalIndent(shapeOf(v), "", "  ")
		got = append(got, '\n')
		path := filepath.Join("testdata", "api", name+".shape")
		if *updateShapes {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		golden, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v (run with -update to write it)", name, err)
		}
		if !bytes.Equal(got, golden) {
			t.Errorf("%s: the answer's shape changed:\n%s\nwant (%s):\n%s", name, got, path, golden)
		}
	}
	do := func(method, path string, body string) (int, []byte) {
		t.Helper()
		st, got, _ := b.do(t, method, path, b.alice, strings.NewReader(body))
		return st, got
	}

	st, body := do("POST", "/api/v1/modules?name=min.wasm", string(minimalModule))
	check("modules_push", st, 201, body)
	var mod struct{ ID string }
	json.Unmarshal(body, &mod)
	st, body = do("GET", "/api/v1/modules", "")
	check("modules_list", st, 200, body)

	data := "some data\n"
	st, body = do("PUT", "/api/v1/blobs/"+blobID([]byte(data))+"?name=data.txt", data)
	check("blobs_push", st, 201, body)
	st, body = do("GET", "/api/v1/blobs", "")
	check("blobs_list", st, 200, body)

	wf := fmt.Sprintf(`{"name": "shapes", "tasks": [
		{"name": "a", "module": %q},
		{"name": "b", "module": %q, "inputs": {"x": {"from": "a"}}}]}`, mod.ID, mod.ID)
	st, body = do("POST", "/api/v1/workflows", wf)
	check("workflows_submit", st, 201, body)
	var sub struct{ ID string }
	json.Unmarshal(body, &sub)
	st, body = do("POST", "/api/v1/workflows", `{"name": "bad", "tasks": [{"name": "a"}]}`)
	check("error_bad_workflow", st, 400, body)
	st, body = do("GET", "/api/v1/workflows/00000000-0000-4000-8000-000000000000", "")
	check("error_not_found", st, 404, body)

	// Task a runs and is done on a worker, which stays connected.
	reg, err := b.srv.store.RegisterWorker(ctx, store.WorkerHello{Kind: "headless", Slots: 1, Operator: true}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	socketless(b.srv, reg.ID, 1)
	cands, _, err := b.srv.store.Candidates(ctx, 10, nil)
	if err != nil || len(cands) != 1 {
		t.Fatalf("candidates %v, %v; want task a", cands, err)
	}
	cs, err := b.srv.store.ClaimPicks(ctx, []store.Pick{{TaskID: cands[0].TaskID, Worker: reg.ID}}, time.Minute)
	if err != nil || len(cs) != 1 {
		t.Fatalf("claim: %v, %v", cs, err)
	}
	if acc, err := b.srv.store.Complete(ctx, []store.Completion{{Attempt: cs[0].Attempt, Worker: reg.ID, OK: true,
		Outputs: []store.Output{{Name: "stdout", Data: []byte("hi\n")}}, Duration: time.Millisecond}}); err != nil || !acc[0] {
		t.Fatalf("complete a: %v, %v", acc, err)
	}

	st, body = do("GET", "/api/v1/workflows/"+sub.ID, "")
	check("workflow_status", st, 200, body)
	st, body = do("GET", "/api/v1/workflows", "")
	check("workflows_list", st, 200, body)
	st, body = do("GET", "/api/v1/workflows/"+sub.ID+"/tasks/a/attempts", "")
	check("task_attempts", st, 200, body)
	st, body = do("GET", "/api/v1/workers", "")
	check("workers", st, 200, body)
	st, body = do("GET", "/api/v1/activity", "")
	check("activity", st, 200, body)
	st, body = do("POST", "/api/v1/workflows/"+sub.ID+"/tasks/b/cancel", "")
	check("task_cancel", st, 200, body)
	st, body = do("POST", "/api/v1/workflows/"+sub.ID+"/cancel", "")
	check("workflow_cancel", st, 200, body)
}

// shapeOf is v with every value replaced by its JSON type, and every array
// by its first element's shape.
func shapeOf(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, x := range v {
			m[k] = shapeOf(x)
		}
		return m
	case []any:
		if len(v) == 0 {
			return []any{}
		}
		return []any{shapeOf(v[0])}
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	}
	return "null"
}
