package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/cyclepool/cyclepool/api"
)

// fakeServer implements the documented owner API well enough for the
// client's unit tests.
type fakeServer struct {
	t *testing.T

	mu        sync.Mutex
	modules   map[string][]byte // id -> bytes
	pushes    int
	submitted [][]byte
	statuses  map[string]*Status
	outputs   map[string][]byte // "task\x00output" -> bytes
	asked     []asked           // the requests for outputs
	cutAfter  int               // > 0: output bodies break after that many bytes
	paths     []string          // escaped request paths
	events    func(w http.ResponseWriter, r *http.Request, flush func())
}

func newFakeServer(t *testing.T) (*fakeServer, *Client) {
	f := &fakeServer{t: t, modules: map[string][]byte{}, statuses: map[string]*Status{}, outputs: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/modules", f.pushModule)
	mux.HandleFunc("POST /api/v1/workflows", f.submit)
	mux.HandleFunc("GET /api/v1/workflows/{id}", f.status)
	mux.HandleFunc("GET /api/v1/workflows/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		h := f.events
		f.mu.Unlock()
		if h == nil {
			http.Error(w, `{"error":"no events"}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		h(w, r, func() { w.(http.Flusher).Flush() })
	})
	mux.HandleFunc("GET /api/v1/workflows/{id}/tasks/{task}/outputs/{output}", f.output)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":"missing or unknown token"}`)
			return
		}
		f.mu.Lock()
		f.paths = append(f.paths, r.URL.EscapedPath())
		f.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return f, New(srv.URL, "tok", WithPollInterval(20*time.Millisecond))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeServer) pushModule(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	if !bytes.HasPrefix(b, []byte("\x00asm")) {
		writeJSON(w, 400, map[string]string{"error": "not a WebAssembly module"})
		return
	}
	sum := sha256.Sum256(b)
	id := "sha256:" + hex.EncodeToString(sum[:])
	f.mu.Lock()
	f.modules[id] = b
	f.pushes++
	f.mu.Unlock()
	writeJSON(w, 201, Module{ID: id, Size: int64(len(b)), Imports: []string{}, CreatedAt: time.Now().UTC()})
}

func (f *fakeServer) submit(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var wf struct {
		Name  string `json:"name"`
		Tasks []struct {
			Name   string `json:"name"`
			Module string `json:"module"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal(b, &wf); err != nil {
		writeJSON(w, 400, map[string]string{"error": err.Error()})
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range wf.Tasks {
		if _, ok := f.modules[t.Module]; !ok {
			writeJSON(w, 400, map[string]string{"error": fmt.Sprintf("task %q: unknown module %q", t.Name, t.Module), "task": t.Name, "field": "module"})
			return
		}
	}
	f.submitted = append(f.submitted, b)
	writeJSON(w, 201, api.Submitted{ID: "wf1", Name: wf.Name, Tasks: len(wf.Tasks)})
}

func (f *fakeServer) status(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	st := f.statuses[r.PathValue("id")].Clone()
	f.mu.Unlock()
	if st == nil {
		writeJSON(w, 404, map[string]string{"error": "no such workflow"})
		return
	}
	writeJSON(w, 200, st)
}

func (f *fakeServer) setStatus(st *Status) {
	f.mu.Lock()
	f.statuses[st.ID] = st.Clone()
	f.mu.Unlock()
}

// output answers as the server does: the output's hash as its ETag, with
// ranges and conditional requests (http.ServeContent). With cutAfter set,
// the connection breaks after that many bytes of the body.
func (f *fakeServer) output(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	b, ok := f.outputs[r.PathValue("task")+"\x00"+r.PathValue("output")]
	f.asked = append(f.asked, asked{rng: r.Header.Get("Range"), ifNoneMatch: r.Header.Get("If-None-Match")})
	cut := f.cutAfter
	f.mu.Unlock()
	if !ok {
		writeJSON(w, 404, map[string]string{"error": "no such output"})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"`+moduleIDOf(b)+`"`)
	if cut > 0 {
		w = &cutWriter{ResponseWriter: w, left: cut}
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
}

// asked is what a request for an output asked for.
type asked struct{ rng, ifNoneMatch string }

// cutWriter writes left bytes of a body, then breaks the connection.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) > c.left {
		c.ResponseWriter.Write(p[:c.left])
		c.ResponseWriter.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	c.left -= len(p)
	return c.ResponseWriter.Write(p)
}

func moduleIDOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func TestSubmitFileRewritesPathsAndKeepsEverythingElse(t *testing.T) {
	f, c := newFakeServer(t)
	work := t.TempDir()
	t.Chdir(work)
	must(t, os.MkdirAll("wf/tasks", 0o755))
	must(t, os.MkdirAll("tasks", 0o755))
	cwdWasm := []byte("\x00asm cwd")
	wfWasm := []byte("\x00asm wfdir")
	onlyWf := []byte("\x00asm only-in-wf-dir")
	must(t, os.WriteFile("tasks/a.wasm", cwdWasm, 0o644))   // found relative to the cwd
	must(t, os.WriteFile("wf/tasks/a.wasm", wfWasm, 0o644)) // shadowed by the cwd's
	must(t, os.WriteFile("wf/tasks/b.wasm", onlyWf, 0o644)) // found relative to the file
	known := moduleIDOf([]byte("\x00asm known"))
	f.modules[known] = []byte("\x00asm known")

	// Odd spacing, key order, and a module id that must stay.
	src := `{
  "tasks": [
    {"module" :   "./tasks/a.wasm", "name": "a", "args": ["0"], "env": {"KEEP" :   "1, 2.50, me"}},
    {"name": "b", "module":"tasks/b.wasm", "inputs": {"in": {"from": "a"}}},
    {"name": "c", "module": "` + known + `"},
    {"name": "d", "module": "./tasks/a.wasm", "timeout": "10m", "max_attempts": 5}
  ],
  "name": "demo", "priority": "batch"
}
`
	must(t, os.WriteFile("wf/flow.json", []byte(src), 0o644))

	sub, err := c.SubmitFile(t.Context(), "wf/flow.json")
	if err != nil {
		t.Fatal(err)
	}
	if sub.ID != "wf1" || sub.Tasks != 4 || sub.Name != "demo" {
		t.Errorf("Submitted = %+v", sub)
	}
	want := strings.NewReplacer(
		`"./tasks/a.wasm"`, `"`+moduleIDOf(cwdWasm)+`"`,
		`"tasks/b.wasm"`, `"`+moduleIDOf(onlyWf)+`"`,
	).Replace(src)
	if got := string(f.submitted[0]); got != want {
		t.Errorf("submitted body:\n%s\nwant:\n%s", got, want)
	}
	if f.pushes != 2 {
		t.Errorf("pushed %d modules, want 2 (one per distinct file)", f.pushes)
	}
	wantMods := map[string]string{"./tasks/a.wasm": moduleIDOf(cwdWasm), "tasks/b.wasm": moduleIDOf(onlyWf)}
	if fmt.Sprint(sub.Modules) != fmt.Sprint(wantMods) {
		t.Errorf("Modules = %v, want %v", sub.Modules, wantMods)
	}
}

func TestSubmitFileErrors(t *testing.T) {
	tests := []struct {
		name, file, want string
	}{
		{"missing module", `{"name":"w","tasks":[{"name":"sum","module":"./nope.wasm"}]}`, `task "sum": module "./nope.wasm" is neither a module id`},
		{"name after module", `{"name":"w","tasks":[{"module":"nope.wasm","name":"late"}]}`, `task "late": module`},
		// Checked by the server's parser before anything is pushed.
		{"short id", `{"name":"w","tasks":[{"name":"x","module":"sha256:abc"}]}`, `task "x": field "module": "sha256:abc" is not a module id`},
		{"not json", "{\n  \"tasks\": [,]\n}", "invalid JSON at line 2, column 13"},
		{"unknown field", `{"name":"w","tasks":[{"name":"x","module":"./a.wasm","bogus":1}]}`, `task "x": field "bogus": unknown field`},
		{"cycle", `{"name":"w","tasks":[{"name":"x","module":"./a.wasm","inputs":{"i":{"from":"x"}}}]}`, `task "x"`},
		{"server refuses", `{"name":"w","tasks":[{"name":"t","module":"` + moduleIDOf([]byte("x")) + `"}]}`, `unknown module`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, c := newFakeServer(t)
			dir := t.TempDir()
			t.Chdir(dir)
			must(t, os.WriteFile("w.json", []byte(tt.file), 0o644))
			must(t, os.WriteFile("a.wasm", []byte("\x00asm a"), 0o644))
			_, err := c.SubmitFile(t.Context(), "w.json")
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "submit w.json: ") {
				t.Fatalf("err = %v, want it to start with %q and contain %q", err, "submit w.json: ", tt.want)
			}
			if tt.name != "server refuses" && len(f.submitted) != 0 {
				t.Errorf("something was submitted")
			}
			if tt.name != "server refuses" && f.pushes != 0 {
				t.Errorf("%d modules were pushed for a file that is refused", f.pushes)
			}
		})
	}
}

func TestSubmitFileLeavesOddShapesToTheServer(t *testing.T) {
	for _, src := range []string{
		`[]`,
		`{"tasks": {"a": 1}}`,
		`{"tasks": [1, "x", {"module": 5}, {"module": ""}]}`,
	} {
		refs, err := findModules([]byte(src))
		if err != nil {
			t.Errorf("%s: %v", src, err)
		}
		for _, r := range refs {
			if r.value != "" {
				t.Errorf("%s: found module %q", src, r.value)
			}
		}
	}
}

func TestAPIErrorDecoding(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   APIError
		text   string
	}{
		{"json with task and field", 400,
			`{"error": "task \"sum\": input \"a\" names unknown task \"count-9\"", "task": "sum", "field": "inputs.a"}`,
			APIError{400, `task "sum": input "a" names unknown task "count-9"`, "sum", "inputs.a"},
			`task "sum": input "a" names unknown task "count-9" (task "sum", field "inputs.a", HTTP 400)`},
		{"json without pointers", 404, `{"error":"no such workflow"}`,
			APIError{Status: 404, Message: "no such workflow"}, `no such workflow (HTTP 404)`},
		{"plain text", 502, "bad gateway\n", APIError{Status: 502, Message: "bad gateway"}, `bad gateway (HTTP 502)`},
		{"empty", 503, "", APIError{Status: 503}, `service unavailable (HTTP 503)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			_, err := New(srv.URL, "").Status(t.Context(), "x")
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, not an *APIError", err)
			}
			if *ae != tt.want {
				t.Errorf("APIError = %#v, want %#v", *ae, tt.want)
			}
			if ae.Error() != tt.text {
				t.Errorf("Error() = %q, want %q", ae.Error(), tt.text)
			}
			if IsNotFound(err) != (tt.status == 404) {
				t.Errorf("IsNotFound = %v", IsNotFound(err))
			}
		})
	}
}

func TestUnauthorized(t *testing.T) {
	_, c := newFakeServer(t)
	c.token = "wrong"
	_, err := c.Modules(t.Context())
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("err = %v, want a 401 APIError", err)
	}
}

func TestEventReader(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  []Event
		err   error
	}{
		{"documented example",
			"event: task\ndata: {\"name\": \"count-0\", \"state\": \"running\"}\n\nevent: workflow\ndata: {\"id\": \"6b0c\", \"state\": \"done\"}\n\n",
			[]Event{{Type: "task", Data: []byte(`{"name": "count-0", "state": "running"}`)}, {Type: "workflow", Data: []byte(`{"id": "6b0c", "state": "done"}`)}},
			nil},
		{"multi-line data, comments, no space after colon",
			": keep-alive\nevent:status\ndata: {\"a\":\ndata:1,\ndata:  \"b\": 2}\n: another comment\n\n",
			[]Event{{Type: "status", Data: []byte("{\"a\":\n1,\n \"b\": 2}")}},
			nil},
		{"CRLF and CR line ends, BOM, id",
			"\xef\xbb\xbfid: 7\r\nevent: task\r\ndata: x\r\n\r\nevent: task\rdata: y\r\r",
			[]Event{{Type: "task", ID: "7", Data: []byte("x")}, {Type: "task", ID: "7", Data: []byte("y")}},
			nil},
		{"default type, empty data line, field without colon, unknown field, retry",
			"retry: 1000\nfoo: bar\ndata\n\ndata: \ndata: z\n\n",
			[]Event{{Type: "message", Data: []byte("")}, {Type: "message", Data: []byte("\nz")}},
			nil},
		{"event without data is not dispatched",
			"event: task\n\ndata: d\n\n",
			[]Event{{Type: "message", Data: []byte("d")}},
			nil},
		{"event cut off by the end of the stream",
			"data: whole\n\nevent: task\ndata: half",
			[]Event{{Type: "message", Data: []byte("whole")}},
			io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		for _, oneByte := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/onebyte=%v", tt.name, oneByte), func(t *testing.T) {
				var r io.Reader = strings.NewReader(tt.input)
				if oneByte {
					r = iotest.OneByteReader(r)
				}
				er := newEventReader(r)
				var got []Event
				var err error
				for {
					var ev Event
					ev, err = er.next()
					if err != nil {
						break
					}
					got = append(got, ev)
				}
				if err == io.EOF {
					err = nil
				}
				if !errors.Is(err, tt.err) && err != tt.err {
					t.Errorf("err = %v, want %v", err, tt.err)
				}
				if fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tt.want) {
					t.Errorf("events:\n%q\nwant:\n%q", got, tt.want)
				}
			})
		}
	}
}

func sampleStatus(state string) *Status {
	return &Status{
		ID: "wf1", Name: "primes", Priority: "batch", State: state,
		CreatedAt: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC),
		Counts:    Counts{Running: 1, Blocked: 1},
		Tasks: []Task{
			{Name: "count-0", State: "running", Attempts: 1, MaxAttempts: 3, Progress: 0.25, Checkpoints: 1},
			{Name: "sum", State: "blocked", MaxAttempts: 3},
		},
	}
}

func TestEventsSplitAcrossWrites(t *testing.T) {
	f, c := newFakeServer(t)
	st, _ := json.Marshal(sampleStatus("running"))
	f.events = func(w http.ResponseWriter, r *http.Request, flush func()) {
		chunks := []string{"event: sta", "tus\ndata: ", string(st[:10]), string(st[10:]) + "\n", "\n: ping\n\nevent: task\r", "\ndata: {\"name\":\"count-0\",", "\ndata: \"progress\":0.5}\n\n"}
		for _, ch := range chunks {
			io.WriteString(w, ch)
			flush()
			time.Sleep(2 * time.Millisecond)
		}
	}
	events, errc := c.Events(t.Context(), "wf1")
	var got []Event
	for ev := range events {
		got = append(got, ev)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Type != "status" || string(got[0].Data) != string(st) || got[1].Type != "task" {
		t.Fatalf("events = %q", got)
	}
	s := new(Status)
	for _, ev := range got {
		if _, err := s.Apply(ev); err != nil {
			t.Fatal(err)
		}
	}
	if tk := s.Task("count-0"); tk.Progress != 0.5 || tk.State != "running" || tk.Checkpoints != 1 {
		t.Errorf("task after events = %+v: fields the event did not carry must be kept", tk)
	}
}

func TestApplyAdjustsCounts(t *testing.T) {
	s := sampleStatus("running")
	for _, data := range []string{
		`{"name": "count-0", "state": "done", "progress": 1}`,
		`{"name": "sum", "state": "ready"}`,
		`{"name": "sum", "state": "running", "attempts": 1}`,
	} {
		if _, err := s.Apply(Event{Type: EventTask, Data: []byte(data)}); err != nil {
			t.Fatal(err)
		}
	}
	if want := (Counts{Done: 1, Running: 1}); s.Counts != want {
		t.Errorf("counts = %+v, want %+v", s.Counts, want)
	}
	if _, err := s.Apply(Event{Type: EventWorkflow, Data: []byte(`{"id":"wf1","state":"done"}`)}); err != nil {
		t.Fatal(err)
	}
	if !s.Finished() || len(s.Tasks) != 2 || s.Name != "primes" {
		t.Errorf("after workflow event: %+v", s)
	}
}

func TestWaitFollowsTheStream(t *testing.T) {
	f, c := newFakeServer(t)
	running := sampleStatus("running")
	f.setStatus(running)
	first, _ := json.Marshal(running)
	f.events = func(w http.ResponseWriter, r *http.Request, flush func()) {
		fmt.Fprintf(w, "event: status\ndata: %s\n\n", first)
		flush()
		done := sampleStatus("done")
		now := time.Now().UTC()
		done.FinishedAt = &now
		f.setStatus(done)
		fmt.Fprint(w, "event: workflow\ndata: {\"id\":\"wf1\",\"state\":\"done\"}\n\n")
	}
	var seen []string
	st, err := c.Watch(t.Context(), "wf1", func(s *Status) { seen = append(seen, s.State) })
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "done" || st.FinishedAt == nil {
		t.Errorf("final status = %+v, want done with finished_at from the status object", st)
	}
	if strings.Join(seen, ",") != "running,done,done" {
		t.Errorf("states seen = %v", seen)
	}
}

func TestWaitFallsBackToPolling(t *testing.T) {
	f, c := newFakeServer(t)
	f.setStatus(sampleStatus("running"))
	var mu sync.Mutex
	connects := 0
	f.events = func(w http.ResponseWriter, r *http.Request, flush func()) {
		mu.Lock()
		connects++
		n := connects
		mu.Unlock()
		st, _ := json.Marshal(sampleStatus("running"))
		fmt.Fprintf(w, "event: status\ndata: %s\n\n", st)
		flush()
		if n == 3 {
			f.setStatus(sampleStatus("failed"))
		}
		// The connection drops without a final workflow event.
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	st, err := c.Wait(ctx, "wf1")
	if err != nil {
		t.Fatal(err)
	}
	if st.State != "failed" {
		t.Errorf("state = %s, want failed", st.State)
	}
	if connects < 3 {
		t.Errorf("stream opened %d times, want it reopened after breaking", connects)
	}
}

func TestWaitGivesUpOnUnknownWorkflow(t *testing.T) {
	_, c := newFakeServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := c.Wait(ctx, "nope")
	if !IsNotFound(err) {
		t.Fatalf("err = %v, want not found", err)
	}
}

// When its context ends, Wait (Watch without a callback) returns the last
// status it knew with the context's error. The context ends here once the
// running status was seen, not after a delay a busy machine could outlast
// before the first event.
func TestWaitReturnsLastStatusWhenItsContextEnds(t *testing.T) {
	f, c := newFakeServer(t)
	f.setStatus(sampleStatus("running"))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st, err := c.Watch(ctx, "wf1", func(*Status) { cancel() })
	if !errors.Is(err, context.Canceled) || st == nil || st.State != "running" {
		t.Fatalf("Watch = %v, %v; want the running status and the context's error", st, err)
	}
}

func TestResultsDownloadsEveryOutput(t *testing.T) {
	f, c := newFakeServer(t)
	st := sampleStatus("done")
	st.Tasks[0].State = "done"
	st.Tasks[0].Outputs = []Output{{Name: "stdout", Size: 3}, {Name: "plots/a b.png", Size: 2}}
	st.Tasks[1].State = "failed"
	st.Tasks[1].Outputs = []Output{{Name: "stdout"}}
	f.setStatus(st)
	f.outputs["count-0\x00stdout"] = []byte("42\n")
	f.outputs["count-0\x00plots/a b.png"] = []byte("PN")
	dir := filepath.Join(t.TempDir(), "out")
	if err := c.Results(t.Context(), "wf1", dir); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{"count-0/stdout": "42\n", "count-0/plots/a b.png": "PN"} {
		got, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", rel, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "sum")); !os.IsNotExist(err) {
		t.Errorf("the failed task's directory exists: %v", err)
	}
	found := false
	for _, p := range f.paths {
		if p == "/api/v1/workflows/wf1/tasks/count-0/outputs/plots%2Fa%20b.png" {
			found = true
		}
	}
	if !found {
		t.Errorf("output with a slash was not requested as one escaped segment: %q", f.paths)
	}
}

// A download cut off goes on from where it stopped when Results runs
// again (a range request, its temporary file kept meanwhile); an output
// already there with its bytes is not downloaded again (If-None-Match
// with its hash); one there with other bytes is replaced; and the kept
// part of an output that changed since (its task ran again) is downloaded
// whole once its hash does not match.
func TestResultsGoOnWhereTheyStopped(t *testing.T) {
	f, c := newFakeServer(t)
	f.setStatus(&Status{ID: "wf1", State: "done", Tasks: []Task{{Name: "t", State: "done", Outputs: []Output{{Name: "big"}}}}})
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	f.outputs["t\x00big"] = data
	dir := t.TempDir()
	file, part := filepath.Join(dir, "t", "big"), filepath.Join(dir, "t", "big.part")
	last := func() asked {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.asked[len(f.asked)-1]
	}

	f.mu.Lock()
	f.cutAfter = 300 << 10
	f.mu.Unlock()
	if err := c.Results(t.Context(), "wf1", dir); err == nil || !strings.Contains(err.Error(), "is kept") {
		t.Fatalf("a download cut off: %v, want an error saying the part is kept", err)
	}
	fi, err := os.Stat(part)
	if err != nil || fi.Size() == 0 || fi.Size() > 300<<10 {
		t.Fatalf("part kept: %v, %v; want up to 300 KiB", fi, err)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("the output's file exists before its download ended: %v", err)
	}
	f.mu.Lock()
	f.cutAfter = 0
	f.mu.Unlock()
	if err := c.Results(t.Context(), "wf1", dir); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("bytes=%d-", fi.Size()); last().rng != want {
		t.Errorf("the second run asked for %q, want %q", last().rng, want)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the resumed output: %d bytes, %v; want the output's %d", len(got), err, len(data))
	}

	if err := c.Results(t.Context(), "wf1", dir); err != nil {
		t.Fatal(err)
	}
	if a := last(); a.ifNoneMatch != `"`+moduleIDOf(data)+`"` || a.rng != "" {
		t.Errorf("the third run asked %+v, want If-None-Match with the file's hash", a)
	}

	must(t, os.WriteFile(file, []byte("not the output"), 0o644))
	if err := c.Results(t.Context(), "wf1", dir); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, data) {
		t.Errorf("a file with other bytes: %d bytes after, %v; want the output's", len(got), err)
	}

	// The task ran again: its output changed, and a part of the old one
	// is kept.
	must(t, os.Remove(file))
	must(t, os.WriteFile(part, data[:1000], 0o644))
	changed := slices.Clone(data)
	changed[500] ^= 0xff // within the part kept
	f.mu.Lock()
	f.outputs["t\x00big"] = changed
	f.mu.Unlock()
	if err := c.Results(t.Context(), "wf1", dir); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, changed) {
		t.Errorf("the changed output: %v; want its new bytes", err)
	}
	if _, err := os.Stat(part); !os.IsNotExist(err) {
		t.Errorf("the part is still there: %v", err)
	}
}

func TestResultsRefusesEscapingNames(t *testing.T) {
	tests := []struct{ task, output string }{
		{"..", "stdout"},
		{"a/b", "stdout"},
		{`a\b`, "stdout"},
		{"", "stdout"},
		{"t", "../../etc/passwd"},
		{"t", "//etc/passwd"}, {"t", "/a/../../x"},
		{"t", "a/../../b"},
		{"t", "a//b"},
		{"t", "./x"},
		{"t", ".."},
		{"t", ""},
		{"t", `..\x`},
		{"t", "x\x00"},
	}
	for _, tt := range tests {
		t.Run(tt.task+"|"+tt.output, func(t *testing.T) {
			f, c := newFakeServer(t)
			st := &Status{ID: "wf1", State: "done", Tasks: []Task{
				{Name: "ok", State: "done", Outputs: []Output{{Name: "stdout"}}},
				{Name: tt.task, State: "done", Outputs: []Output{{Name: tt.output}}},
			}}
			f.setStatus(st)
			f.outputs["ok\x00stdout"] = []byte("fine")
			dir := t.TempDir()
			err := c.Results(t.Context(), "wf1", dir)
			if err == nil || !strings.Contains(err.Error(), "refusing") {
				t.Fatalf("err = %v, want a refusal", err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("files were written before the refusal: %v", ents)
			}
		})
	}
	for _, ok := range []string{"stdout", "a/b/c.txt", "x.part", "..x", "a..b"} {
		if err := checkOutputName(ok); err != nil {
			t.Errorf("checkOutputName(%q) = %v, want nil", ok, err)
		}
	}
}

// An output outside /out is written where it was in the task's tree, so
// it may name the same file as another output (stdout and /stdout, the
// file /out/work/a.txt and /work/a.txt), or a file where another needs a
// directory: refused before anything is written, rather than one output
// silently replacing the other.
func TestResultsRefusesOutputsThatCollide(t *testing.T) {
	for _, outs := range [][]string{
		{"/stdout", "stdout"},
		{"/work/a.txt", "stdout", "work/a.txt"},
		{"/work", "stdout", "work/a.txt"},
		{"/a/b", "a/b/c"},
	} {
		t.Run(strings.Join(outs, ","), func(t *testing.T) {
			f, c := newFakeServer(t)
			st := &Status{ID: "wf1", State: "done", Tasks: []Task{{Name: "t", State: "done"}}}
			for _, o := range outs {
				st.Tasks[0].Outputs = append(st.Tasks[0].Outputs, Output{Name: o})
				f.outputs["t\x00"+o] = []byte(o)
			}
			f.setStatus(st)
			dir := t.TempDir()
			err := c.Results(t.Context(), "wf1", dir)
			if err == nil || !strings.Contains(err.Error(), "refusing") {
				t.Fatalf("err = %v, want a refusal", err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("files were written before the refusal: %v", ents)
			}
		})
	}
	// Outputs "x" and "/x.part": the temporary file of the one is not the
	// other.
	f, c := newFakeServer(t)
	f.setStatus(&Status{ID: "wf1", State: "done", Tasks: []Task{{Name: "t", State: "done",
		Outputs: []Output{{Name: "/x.part"}, {Name: "stdout"}, {Name: "x"}}}}})
	f.outputs["t\x00/x.part"] = []byte("P")
	f.outputs["t\x00stdout"] = []byte("S")
	f.outputs["t\x00x"] = []byte("X")
	dir := t.TempDir()
	if err := c.Results(t.Context(), "wf1", dir); err != nil {
		t.Fatal(err)
	}
	for rel, want := range map[string]string{"t/x.part": "P", "t/stdout": "S", "t/x": "X"} {
		if got, err := os.ReadFile(filepath.Join(dir, rel)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", rel, got, err, want)
		}
	}
}

func TestListQuery(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.RequestURI()
		io.WriteString(w, `{"workflows": [{"id": "a", "state": "done", "created_at": "2026-11-22T10:00:00Z", "finished_at": null, "counts": {"done": 2}}], "total": 7}`)
	}))
	defer srv.Close()
	l, err := New(strings.TrimPrefix(srv.URL, "http://")+"/", "").List(t.Context(), ListOptions{State: "done", Limit: 5, Query: "pri mes"})
	if err != nil {
		t.Fatal(err)
	}
	if got != "/api/v1/workflows?limit=5&q=pri+mes&state=done" {
		t.Errorf("request = %s", got)
	}
	if l.Total != 7 || len(l.Workflows) != 1 || l.Workflows[0].Counts.Done != 2 {
		t.Errorf("list = %+v", l)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A module reference is named by its task's name, written before or after
// it, and never by another task's.
func TestFindModulesNamesEachReferenceByItsTask(t *testing.T) {
	refs, err := findModules([]byte(`{"tasks": [{"module": "a.wasm", "name": "a"}, {"name": "b", "module": "b.wasm"},
		{"module": "c.wasm"}, {"module": "d.wasm", "name": "d"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range refs {
		got = append(got, fmt.Sprintf("%d:%s:%s", r.index, r.task, r.value))
	}
	if want := []string{"0:a:a.wasm", "1:b:b.wasm", "2::c.wasm", "3:d:d.wasm"}; !slices.Equal(got, want) {
		t.Errorf("refs %v, want %v", got, want)
	}
}

// BenchmarkFindModules reads the module references of a 20,000-task file
// (cyclepool submit): 200-225 ms while every task's name was looked for
// among all the references found before it.
func BenchmarkFindModules(b *testing.B) {
	type task struct {
		Name   string `json:"name"`
		Module string `json:"module"`
	}
	tasks := make([]task, 20000)
	for i := range tasks {
		tasks[i] = task{Name: fmt.Sprintf("t%d", i), Module: "./tasks/noop.wasm"}
	}
	data, _ := json.Marshal(map[string]any{"name": "x", "tasks": tasks})
	for b.Loop() {
		if _, err := findModules(data); err != nil {
			b.Fatal(err)
		}
	}
}
