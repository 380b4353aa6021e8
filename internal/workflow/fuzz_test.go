package workflow

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// FuzzParse checks that Parse never panics, that every refusal is an *Error,
// and that every accepted file has a valid topological order and survives a
// Marshal/Parse round trip unchanged.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		example,
		`{"name": "w", "tasks": [{"name": "a", "module": "a.wasm"}]}`,
		`{"name": "w", "priority": "interactive", "tasks": [
			{"name": "a", "module": "m", "stdin": {"data": "x"}, "limits": {"memory_mib": 1}},
			{"name": "b", "module": "m", "inputs": {"in": {"from": "a", "output": "d/o"}}, "stdin": {"from": "a"}, "timeout": "1s", "checkpoint_interval": "2m"}]}`,
		`{"name": "w", "tasks": [{"name": "a", "module": "m", "inputs": {"x": {"from": "b"}}}, {"name": "b", "module": "m", "stdin": {"from": "a"}}]}`,
		`{"name": "w", "tasks": [{"name": "a", "module": "m"}, {"name": "a", "module": "m"}]}`,
		`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": 1e3}]}`,
		`{"name": "\u00e9", "tasks": [{"name": "a", "module": "m", "args": ["<&>", ""]}]} `,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error is %T, not *Error: %v", err, err)
			}
			if e.Msg == "" {
				t.Fatal("error without a message")
			}
			return
		}
		checkOrder(t, s)
		out, err := s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		s2, err := Parse(out)
		if err != nil {
			t.Fatalf("round trip refused: %v\n%s", err, out)
		}
		if s.Name != s2.Name || s.Priority != s2.Priority || !reflect.DeepEqual(normalize(s.Tasks), normalize(s2.Tasks)) {
			t.Fatalf("round trip changed the spec\n%+v\n%+v", s.Tasks, s2.Tasks)
		}
		if !reflect.DeepEqual(s.Order(), s2.Order()) {
			t.Fatal("round trip changed the order")
		}
		out2, err := s2.Marshal()
		if err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("marshal not stable: %v\n%s\n%s", err, out, out2)
		}
	})
}

func normalize(ts []TaskSpec) []TaskSpec {
	out := append([]TaskSpec(nil), ts...)
	for i := range out {
		if len(out[i].Args) == 0 {
			out[i].Args = nil
		}
	}
	return out
}

func checkOrder(t *testing.T, s *Spec) {
	t.Helper()
	order := s.Order()
	if len(order) != len(s.Tasks) {
		t.Fatalf("order has %d tasks, spec %d", len(order), len(s.Tasks))
	}
	pos := make([]int, len(s.Tasks))
	for i := range pos {
		pos[i] = -1
	}
	for k, i := range order {
		if pos[i] != -1 {
			t.Fatalf("task %d twice in order", i)
		}
		pos[i] = k
	}
	for i := range s.Tasks {
		for _, d := range s.Deps(i) {
			if d == i || pos[d] >= pos[i] {
				t.Fatalf("task %d depends on %d but comes first", i, d)
			}
		}
		for _, in := range s.Tasks[i].Inputs {
			if s.Tasks[in.Task].Name != in.From {
				t.Fatalf("input %+v resolved wrongly", in)
			}
		}
	}
}
