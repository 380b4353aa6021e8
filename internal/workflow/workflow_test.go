package workflow

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

const id1 = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

const example = `{
  "name": "primes",
  "priority": "batch",
  "tasks": [
    {"name": "count-0", "module": "./tasks/primes.wasm", "args": ["0", "5000000"]},
    {"name": "count-1", "module": "` + id1 + `", "args": ["5000000", "10000000"]},
    {"name": "sum", "module": "./tasks/sum.wasm",
     "inputs": {"a": {"from": "count-0"}, "b": {"from": "count-1", "output": "stdout"}},
     "timeout": "10m", "max_attempts": 5}
  ]
}`

func TestExample(t *testing.T) {
	s, err := Parse([]byte(example))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "primes" || s.Priority != Batch || len(s.Tasks) != 3 {
		t.Fatalf("spec %+v", s)
	}
	sum := s.Tasks[2]
	want := []Input{
		{File: "a", Source: Source{From: "count-0", Task: 0, Output: "stdout"}},
		{File: "b", Source: Source{From: "count-1", Task: 1, Output: "stdout"}},
	}
	if !reflect.DeepEqual(sum.Inputs, want) {
		t.Errorf("inputs %+v", sum.Inputs)
	}
	if sum.Timeout != 10*time.Minute || sum.MaxAttempts != 5 {
		t.Errorf("sum %+v", sum)
	}
	if got := s.Deps(2); !reflect.DeepEqual(got, []int{0, 1}) {
		t.Errorf("deps %v", got)
	}
	if got := s.Order(); !reflect.DeepEqual(got, []int{0, 1, 2}) {
		t.Errorf("order %v", got)
	}
	if got := s.ModulePaths(); !reflect.DeepEqual(got, []string{"./tasks/primes.wasm", "./tasks/sum.wasm"}) {
		t.Errorf("module paths %v", got)
	}
}

func TestDefaults(t *testing.T) {
	s, err := Parse([]byte(`{"name": "w", "tasks": [{"name": "a", "module": "a.wasm"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Priority != Batch {
		t.Errorf("priority %q", s.Priority)
	}
	got := s.Tasks[0]
	want := TaskSpec{
		Name: "a", Module: "a.wasm", Args: []string{},
		Timeout: time.Hour, MaxAttempts: 3,
		MemoryBytes: 256 << 20, OutputBytes: 1024 << 20, LogBytes: 1024 << 10,
		CheckpointInterval: 30 * time.Second, Cwd: "/", ScratchBytes: 1 << 30,
	}
	got.Args = []string{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
	if got.MemoryPages() != 4096 {
		t.Errorf("pages %d", got.MemoryPages())
	}
	if got.Stdin != nil || got.Inputs != nil {
		t.Errorf("stdin/inputs %+v", got)
	}
}

func TestAllFields(t *testing.T) {
	s, err := Parse([]byte(`{"name": "w", "priority": "interactive", "tasks": [
		{"name": "a", "module": "a.wasm", "stdin": {"data": "hello\n"}},
		{"name": "b", "module": "b.wasm", "stdin": {"from": "a", "output": "dir/x.txt"},
		 "timeout": "24h", "max_attempts": 100, "checkpoint_interval": "1s",
		 "limits": {"memory_mib": 4096, "output_mib": 64, "log_kib": 8192}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.Tasks[0], s.Tasks[1]
	if s.Priority != Interactive || a.Stdin == nil || a.Stdin.Source != nil || a.Stdin.Data != "hello\n" {
		t.Errorf("a %+v", a)
	}
	if b.Stdin == nil || b.Stdin.Source == nil || *b.Stdin.Source != (Source{From: "a", Task: 0, Output: "dir/x.txt"}) {
		t.Errorf("b stdin %+v", b.Stdin)
	}
	if b.Timeout != 24*time.Hour || b.MaxAttempts != 100 || b.CheckpointInterval != time.Second ||
		b.MemoryBytes != 4<<30 || b.OutputBytes != 64<<20 || b.LogBytes != 8<<20 {
		t.Errorf("b %+v", b)
	}
	if !reflect.DeepEqual(s.Deps(1), []int{0}) {
		t.Errorf("deps %v", s.Deps(1))
	}
}

func TestOrderForwardReferences(t *testing.T) {
	s, err := Parse([]byte(`{"name": "w", "tasks": [
		{"name": "c", "module": "m", "inputs": {"x": {"from": "b"}, "y": {"from": "a"}}, "stdin": {"from": "b"}},
		{"name": "b", "module": "m", "inputs": {"x": {"from": "a"}}},
		{"name": "a", "module": "m"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Order(); !reflect.DeepEqual(got, []int{2, 1, 0}) {
		t.Errorf("order %v", got)
	}
	if got := s.Deps(0); !reflect.DeepEqual(got, []int{1, 2}) {
		t.Errorf("deps %v", got)
	}
}

func TestModules(t *testing.T) {
	for m, want := range map[string]bool{
		id1:                      true,
		strings.ToUpper(id1):     false,
		"sha256:abc":             false,
		"./x.wasm":               false,
		id1[:len(id1)-1] + "g":   false,
		"sha256:" + id1[7:] + "": true,
	} {
		if IsModuleID(m) != want {
			t.Errorf("IsModuleID(%q) = %v", m, !want)
		}
	}
	s, err := Parse([]byte(`{"name": "w", "tasks": [{"name": "a", "module": "x.wasm"}, {"name": "b", "module": "x.wasm", "args": ["1"]}, {"name": "c", "module": "y.wasm"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.ReplaceModule("x.wasm", id1); n != 2 || err != nil {
		t.Fatalf("replace: %d %v", n, err)
	}
	if err := s.SetModule(2, "sha256:bad"); err == nil {
		t.Fatal("SetModule accepted a bad id")
	}
	if got := s.ModulePaths(); !reflect.DeepEqual(got, []string{"y.wasm"}) {
		t.Errorf("paths %v", got)
	}
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"w","tasks":[{"name":"a","module":"` + id1 + `"},{"name":"b","module":"` + id1 + `","args":["1"]},{"name":"c","module":"y.wasm"}]}`
	if string(b) != want {
		t.Errorf("marshal\n got %s\nwant %s", b, want)
	}
}

func TestRefusals(t *testing.T) {
	task := func(extra string) string {
		return `{"name": "w", "tasks": [{"name": "a", "module": "m"}, {"name": "t", "module": "m"` + extra + `}]}`
	}
	big := `{"name": "w", "tasks": [` + strings.Repeat(`{"name":"a","module":"m"},`, MaxTasks) + `{"name":"z","module":"m"}]}`
	cases := []struct {
		name, file        string
		task, field, msgs string // msgs: substring of Msg
	}{
		{"empty", ``, "", "", "unexpected end of file"},
		{"syntax", `{"name": "w",}`, "", "", "invalid JSON at line 1"},
		{"not object", `[]`, "", "", "must be an object, not an array"},
		{"trailing", `{"name":"w","tasks":[{"name":"a","module":"m"}]} {}`, "", "", "unexpected data after"},
		{"trailing garbage", `{"name":"w","tasks":[{"name":"a","module":"m"}]}x`, "", "", "unexpected data after"},
		{"too big", `{"name": "` + strings.Repeat("x", MaxFileSize) + `"}`, "", "", "more than the limit"},
		{"too many tasks", big, "", "tasks", "more than 100000 tasks"},
		{"bad utf8", "{\"name\": \"\xff\"}", "", "", "not valid UTF-8"},
		{"unknown top", `{"name": "w", "tasks": [], "owner": "x"}`, "", "owner", "unknown field"},
		{"unknown case", `{"Name": "w"}`, "", "Name", "unknown field"},
		{"unknown task field", task(`, "memory": 5`), "t", "memory", "unknown field"},
		{"unknown task field before name", `{"name":"w","tasks":[{"x":1,"name":"t","module":"m"}]}`, "t", "x", "unknown field"},
		{"unknown unnamed", `{"name":"w","tasks":[{"x":1}]}`, "", "tasks[0].x", "unknown field"},
		{"unknown limits field", task(`, "limits": {"cpu": 1}`), "t", "limits.cpu", "unknown field"},
		{"unknown input field", task(`, "inputs": {"f": {"from": "a", "as": "x"}}`), "t", "inputs.f.as", "unknown field"},
		{"duplicate key", task(`, "args": [], "args": []`), "t", "args", "appears twice"},
		{"duplicate input", task(`, "inputs": {"f": {"from": "a"}, "f": {"from": "a"}}`), "t", "inputs.f", "appears twice"},
		{"null", task(`, "timeout": null`), "t", "timeout", "must not be null"},
		{"wrong type", task(`, "args": "x"`), "t", "args", "must be an array, not a string"},
		{"wrong elem type", task(`, "args": ["1", 2]`), "t", "args[1]", "must be a string, not a number"},
		{"float", task(`, "max_attempts": 2.5`), "t", "max_attempts", "must be an integer"},
		{"huge int", task(`, "max_attempts": 99999999999999999999`), "t", "max_attempts", "out of range"},
		{"name missing", `{"tasks": [{"name": "a", "module": "m"}]}`, "", "name", "is required"},
		{"name long", `{"name": "` + strings.Repeat("é", 201) + `", "tasks": []}`, "", "name", "more than 200"},
		{"name control", `{"name": "a\nb", "tasks": []}`, "", "name", "control characters"},
		{"priority", `{"name": "w", "priority": "urgent", "tasks": []}`, "", "priority", `must be "interactive" or "batch"`},
		{"no tasks", `{"name": "w", "tasks": []}`, "", "tasks", "at least one task"},
		{"no tasks field", `{"name": "w"}`, "", "tasks", "at least one task"},
		{"task name missing", `{"name": "w", "tasks": [{"module": "m"}]}`, "", "tasks[0].name", "is required"},
		{"task name chars", `{"name": "w", "tasks": [{"name": "a b", "module": "m"}]}`, "", "tasks[0].name", "may hold only"},
		{"task name long", `{"name": "w", "tasks": [{"name": "` + strings.Repeat("a", 129) + `", "module": "m"}]}`, "", "tasks[0].name", "more than 128"},
		{"duplicate name", `{"name": "w", "tasks": [{"name": "a", "module": "m"}, {"name": "b", "module": "m"}, {"name": "a", "module": "m"}]}`, "a", "name", "tasks[0] and tasks[2] are both called \"a\""},
		{"module missing", `{"name": "w", "tasks": [{"name": "t"}]}`, "t", "module", "is required"},
		{"module bad id", `{"name": "w", "tasks": [{"name": "t", "module": "sha256:abc"}]}`, "t", "module", "not a module id"},
		{"unknown task", task(`, "inputs": {"a": {"from": "count-9"}}`), "t", "inputs.a", `names unknown task "count-9"`},
		{"from missing", task(`, "inputs": {"a": {"output": "x"}}`), "t", "inputs.a", `"from" is required`},
		{"self input", task(`, "inputs": {"a": {"from": "t"}}`), "t", "inputs.a", "takes input from its own task"},
		{"self stdin", task(`, "stdin": {"from": "t"}`), "t", "stdin", "takes input from its own task"},
		{"stdin unknown", task(`, "stdin": {"from": "zz"}`), "t", "stdin", `names unknown task "zz"`},
		{"stdin both", task(`, "stdin": {"from": "a", "data": "x"}`), "t", "stdin", "not both"},
		{"stdin neither", task(`, "stdin": {}`), "t", "stdin", `"from" is required`},
		{"input empty", task(`, "inputs": {"": {"from": "a"}}`), "t", "inputs.", "must not be empty"},
		{"input slash", task(`, "inputs": {"x/y": {"from": "a"}}`), "t", "inputs.x/y", "must not contain"},
		{"input backslash", task(`, "inputs": {"x\\y": {"from": "a"}}`), "t", `inputs.x\y`, "must not contain"},
		{"input dot", task(`, "inputs": {".": {"from": "a"}}`), "t", "inputs..", `must not be "."`},
		{"input dotdot", task(`, "inputs": {"..": {"from": "a"}}`), "t", "inputs...", `must not be ".."`},
		{"input long", task(`, "inputs": {"` + strings.Repeat("f", 256) + `": {"from": "a"}}`), "t", "inputs." + strings.Repeat("f", 256), "more than 255"},
		{"output abs", task(`, "inputs": {"f": {"from": "a", "output": "/x"}}`), "t", "inputs.f", "not under a path of task"},
		{"output dotdot", task(`, "inputs": {"f": {"from": "a", "output": "../x"}}`), "t", "inputs.f", "clean relative path"},
		{"output unclean", task(`, "inputs": {"f": {"from": "a", "output": "d//x"}}`), "t", "inputs.f", "clean relative path"},
		{"output empty", task(`, "inputs": {"f": {"from": "a", "output": ""}}`), "t", "inputs.f", "must not be empty"},
		{"timeout bad", task(`, "timeout": "10 minutes"`), "t", "timeout", "not a duration"},
		{"timeout big", task(`, "timeout": "25h"`), "t", "timeout", "out of range"},
		{"timeout zero", task(`, "timeout": "0s"`), "t", "timeout", "out of range"},
		{"attempts zero", task(`, "max_attempts": 0`), "t", "max_attempts", "out of range (1 to 100)"},
		{"NUL in args", task(`, "args": ["ok", "a\u0000b"]`), "t", "args", "argument 1 contains a NUL character"},
		{"attempts big", task(`, "max_attempts": 101`), "t", "max_attempts", "out of range (1 to 100)"},
		{"memory big", task(`, "limits": {"memory_mib": 4097}`), "t", "limits.memory_mib", "out of range"},
		{"memory zero", task(`, "limits": {"memory_mib": 0}`), "t", "limits.memory_mib", "out of range"},
		{"output big", task(`, "limits": {"output_mib": 65537}`), "t", "limits.output_mib", "out of range"},
		{"output big replicated", `{"name": "w", "replicas": 2, "tasks": [{"name": "t", "module": "m", "limits": {"output_mib": 65}}]}`, "t", "limits.output_mib", "travel in its result frame"},
		{"log big", task(`, "limits": {"log_kib": 8193}`), "t", "limits.log_kib", "out of range"},
		{"checkpoint small", task(`, "checkpoint_interval": "10ms"`), "t", "checkpoint_interval", "out of range"},
		{"cycle", `{"name": "w", "tasks": [
			{"name": "a", "module": "m", "inputs": {"x": {"from": "c"}}},
			{"name": "b", "module": "m", "inputs": {"x": {"from": "a"}}},
			{"name": "c", "module": "m", "stdin": {"from": "b"}}]}`, "", "", "cycle: a -> b -> c -> a"},
		{"cycle later", `{"name": "w", "tasks": [
			{"name": "ok", "module": "m"},
			{"name": "y", "module": "m", "inputs": {"x": {"from": "z"}, "o": {"from": "ok"}}},
			{"name": "z", "module": "m", "inputs": {"x": {"from": "y"}}},
			{"name": "after", "module": "m", "inputs": {"x": {"from": "z"}}}]}`, "", "", "cycle: y -> z -> y"},
		{"first problem wins", `{"name": "w", "tasks": [
			{"name": "a", "module": "m", "timeout": "2d"},
			{"name": "a", "module": "m"}]}`, "a", "timeout", "not a duration"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse([]byte(c.file))
			if err == nil {
				t.Fatalf("accepted: %+v", s)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T %v", err, err)
			}
			if e.Task != c.task || e.Field != c.field || !strings.Contains(e.Msg, c.msgs) {
				t.Errorf("got Task=%q Field=%q Msg=%q\nwant Task=%q Field=%q Msg~%q", e.Task, e.Field, e.Msg, c.task, c.field, c.msgs)
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	_, err := Parse([]byte(`{"name": "w", "tasks": [{"name": "sum", "module": "m", "inputs": {"a": {"from": "count-9"}}}]}`))
	if got, want := fmt.Sprint(err), `task "sum": field "inputs.a": names unknown task "count-9"`; got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
	if got := (&Error{Msg: "x"}).Error(); got != "x" {
		t.Errorf("got %s", got)
	}
}

func TestManyTasks(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"name": "chain", "tasks": [{"name": "t0", "module": "m"}`)
	const n = 20000
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, `,{"name": "t%d", "module": "m", "stdin": {"from": "t%d"}}`, i, i-1)
	}
	b.WriteString(`]}`)
	s, err := Parse([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if o := s.Order(); len(o) != n || o[n-1] != n-1 {
		t.Fatalf("order len %d", len(o))
	}
}
