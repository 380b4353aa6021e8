//go:build unix

package e2e

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/wasmtest"
)

// Every kind of bad input gets a clear error, changes nothing, and the
// server keeps serving: a workflow submitted afterwards completes.
func TestBadInputIsRefusedClearly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	noop := push(t, p.client, "noop")

	t.Run("http", func(t *testing.T) {
		tests := []struct {
			name, method, path, token, body string
			status                          int
			want                            string
		}{
			{"no token", "GET", "/api/v1/workflows", "", "", 401, "missing owner token"},
			{"unknown token", "GET", "/api/v1/workflows", "cp_nope", "", 401, "unknown owner token"},
			{"not json", "POST", "/api/v1/workflows", p.srv.token, "{nope", 400, ""},
			{"cycle", "POST", "/api/v1/workflows", p.srv.token, `{"name":"c","tasks":[
				{"name":"a","module":"` + noop + `","inputs":{"x":{"from":"b"}}},
				{"name":"b","module":"` + noop + `","inputs":{"x":{"from":"a"}}}]}`, 400, "cycle"},
			{"unknown task", "POST", "/api/v1/workflows", p.srv.token, `{"name":"u","tasks":[
				{"name":"a","module":"` + noop + `","inputs":{"x":{"from":"zz"}}}]}`, 400, `unknown task \"zz\"`},
			{"duplicate name", "POST", "/api/v1/workflows", p.srv.token, `{"name":"d","tasks":[
				{"name":"a","module":"` + noop + `"},{"name":"a","module":"` + noop + `"}]}`, 400, "duplicate"},
			{"unknown module", "POST", "/api/v1/workflows", p.srv.token, `{"name":"m","tasks":[
				{"name":"a","module":"sha256:` + strings.Repeat("ab", 32) + `"}]}`, 400, "unknown module"},
			{"module path", "POST", "/api/v1/workflows", p.srv.token, `{"name":"m","tasks":[
				{"name":"a","module":"./x.wasm"}]}`, 400, "push it first"},
			{"garbage module", "POST", "/api/v1/modules", p.srv.token, "hello", 400, "not a WebAssembly module"},
			// A valid module that imports env.f: refused for its import.
			{"forbidden import", "POST", "/api/v1/modules", p.srv.token, string(moduleImportingEnv), 400, "env.f"},
			{"unknown workflow", "GET", "/api/v1/workflows/00000000-0000-0000-0000-000000000000", p.srv.token, "", 404, "not found"},
			{"malformed id", "GET", "/api/v1/workflows/x';--", p.srv.token, "", 404, "not found"},
			{"unknown module bytes", "GET", "/modules/sha256:00", "", "", 404, "no module"},
			{"activity minutes", "GET", "/api/v1/activity?minutes=1e9", p.srv.token, "", 400, "from 1 to 1440"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				req, _ := http.NewRequestWithContext(ctx, tc.method, p.srv.url+tc.path, strings.NewReader(tc.body))
				if tc.token != "" {
					req.Header.Set("Authorization", "Bearer "+tc.token)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.want) {
					t.Fatalf("%s %s: %d %s, want %d containing %q", tc.method, tc.path, resp.StatusCode, body, tc.status, tc.want)
				}
			})
		}
		list, err := p.client.List(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if list.Total != 0 {
			t.Fatalf("refused workflows left %d workflows behind", list.Total)
		}
	})

	t.Run("worker socket", func(t *testing.T) {
		wsURL := "ws" + strings.TrimPrefix(p.srv.url, "http") + "/ws/worker"
		frames := []struct {
			name string
			typ  websocket.MessageType
			data []byte
			want string
		}{
			{"garbage", websocket.MessageText, []byte("\x00garbage"), "decode frame"},
			{"binary garbage", websocket.MessageBinary, []byte{0xff, 0xff, 0xff, 0xff, 1}, "decode frame"},
			{"not hello", websocket.MessageText, []byte(`{"t":"heartbeat","heartbeat":{"running":[]}}`), "first frame must be hello"},
			{"old version", websocket.MessageText, []byte(`{"t":"hello","hello":{"version":99,"kind":"headless","slots":1}}`), "protocol version 99"},
			{"no slots", websocket.MessageText, []byte(`{"t":"hello","hello":{"version":1,"kind":"headless","slots":0}}`), "slots"},
			{"queue over 32 per slot", websocket.MessageText, []byte(`{"t":"hello","hello":{"version":1,"kind":"browser","slots":2,"queue":65}}`), "queue must be 0 to 64"},
			{"queue over 1,024 in all", websocket.MessageText, []byte(`{"t":"hello","hello":{"version":1,"kind":"headless","slots":256,"queue":1025}}`), "queue must be 0 to 1024"},
		}
		for _, f := range frames {
			t.Run(f.name, func(t *testing.T) {
				c, _, err := websocket.Dial(ctx, wsURL, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer c.CloseNow()
				if err := c.Write(ctx, f.typ, f.data); err != nil {
					t.Fatal(err)
				}
				rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				typ, data, err := c.Read(rctx)
				if err != nil {
					t.Fatalf("no error frame before close: %v", err)
				}
				fr, err := protocol.Decode(data, typ == websocket.MessageBinary)
				if err != nil || fr.Type != protocol.TypeError || !strings.Contains(fr.Error.Message, f.want) {
					t.Fatalf("got %v %q, want an error frame containing %q", err, data, f.want)
				}
				_, _, err = c.Read(rctx)
				var ce websocket.CloseError
				if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation {
					t.Fatalf("socket not closed with policy violation: %v", err)
				}
			})
		}
		// A garbage frame after a good hello closes that socket only.
		c := helloSocket(t, p.srv.url)
		_ = c.Write(ctx, websocket.MessageText, []byte(`{"t":"assign","assign":[{"attempt":1}]}`))
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		for {
			if _, _, err := c.Read(rctx); err != nil {
				var ce websocket.CloseError
				if !errors.As(err, &ce) {
					t.Fatalf("socket not closed after a forbidden frame: %v", err)
				}
				break
			}
		}
	})

	// The server still serves everyone else.
	startWorker(t, "worker", 1, p.srv.url)
	id := submit(t, p.client, workflow("after", task{"name": "n", "module": noop}))
	if st := wait(t, p.client, id, time.Minute); st.State != "done" {
		t.Fatalf("workflow after bad input ended %s", st.State)
	}
}

// Owners are told apart: one cannot see, cancel or download another's
// workflow, which answers exactly like one that does not exist.
func TestOwnersAreIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	startWorker(t, "worker", 1, p.srv.url)
	echo := push(t, p.client, "echo")
	id := submit(t, p.client, workflow("mine", task{"name": "e", "module": echo, "stdin": map[string]any{"data": "secret"}}))
	wait(t, p.client, id, time.Minute)

	out, err := runCLI(t, p.db, "token", "create", "mallory")
	if err != nil {
		t.Fatalf("token create: %v\n%s", err, out)
	}
	other := client.New(p.srv.url, strings.TrimSpace(out))
	var apiErr *client.APIError
	if _, err := other.Status(ctx, id); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("other owner's status: %v, want 404", err)
	}
	if _, err := other.Cancel(ctx, id); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("other owner's cancel: %v, want 404", err)
	}
	if _, err := other.Output(ctx, id, "e", "stdout"); !errors.As(err, &apiErr) || apiErr.Status != 404 {
		t.Errorf("other owner's download: %v, want 404", err)
	}
	if list, err := other.List(ctx, client.ListOptions{}); err != nil || list.Total != 0 {
		t.Errorf("other owner's list: %+v, %v", list, err)
	}
	// Nor can it use the first owner's module without pushing it.
	if _, err := other.Submit(ctx, []byte(`{"name":"x","tasks":[{"name":"a","module":"`+echo+`"}]}`)); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Errorf("other owner's use of an unpushed module: %v, want 400", err)
	}
	if got := output(t, p.client, id, "e", "stdout"); got != "secret" {
		t.Errorf("owner's own output = %q", got)
	}
}

// moduleImportingEnv is a minimal valid WASI-shaped module that imports
// env.f: type section (func () -> ()), import section (env.f), and an export
// of _start pointing at the import.
var moduleImportingEnv = wasmtest.Module(
	wasmtest.Section(1, wasmtest.Vec([]byte{0x60, 0, 0})),                                                // type: () -> ()
	wasmtest.Section(2, wasmtest.Vec(append(append(wasmtest.Name("env"), wasmtest.Name("f")...), 0, 0))), // import env.f, a function of type 0
	wasmtest.Section(7, wasmtest.Vec(append(wasmtest.Name("_start"), 0, 0))),                             // export _start: function 0
)
