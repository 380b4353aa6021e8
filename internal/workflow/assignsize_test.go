package workflow

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// taskWithArgs is a workflow file of one task with args.
func taskWithArgs(t *testing.T, args []string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"name": "w", "tasks": []any{
		map[string]any{"name": "a", "module": "a.wasm", "args": args}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A task whose arguments could never reach a worker (2,000 of 1,000 bytes
// make an assign frame header of 2 MB, over the 1 MiB limit) is refused
// when submitted, naming the limit; it used to pass, and fail later as
// lost, each worker refusing its assignment.
func TestArgsOverTheAssignHeaderAreRefused(t *testing.T) {
	args := make([]string, 2000)
	for i := range args {
		args[i] = strings.Repeat("a", 1000)
	}
	_, err := Parse(taskWithArgs(t, args))
	var e *Error
	if !errors.As(err, &e) || e.Field != "args" || !strings.Contains(e.Msg, "more than the 524288") {
		t.Fatalf("Parse: %v, want an error on args naming the limit", err)
	}
	if _, err := Parse(taskWithArgs(t, args[:400])); err != nil {
		t.Errorf("400 arguments of 1,000 bytes: %v", err)
	}
}

// Arguments just within MaxAssignHeaderBytes, as JSON-escaped as they can
// be, fit the header of an assign frame.
func TestArgsWithinTheLimitFitAnAssignHeader(t *testing.T) {
	for _, c := range []string{"a", "<", "\x01", "\"", "\u2028", "é"} {
		var args []string
		for n := 0; ; {
			a := strings.Repeat(c, 100)
			if n+jsonStringLen(a)+1 > MaxAssignHeaderBytes {
				break
			}
			n += jsonStringLen(a) + 1
			args = append(args, a)
		}
		if msg := checkAssignHeader(args, nil); msg != "" {
			t.Fatalf("%q: %s", c, msg)
		}
		enc, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeAssign, Assign: []protocol.Assign{{
			Attempt: 1, Task: "w/a", Module: "sha256:" + strings.Repeat("0", 64), Args: args,
			Stdin: protocol.Blob{Data: []byte("x")}}}})
		if err != nil {
			t.Fatal(err)
		}
		if h := int(binary.BigEndian.Uint32(enc)); h > protocol.MaxHeaderBytes {
			t.Errorf("%q: a header of %d bytes, over %d", c, h, protocol.MaxHeaderBytes)
		}
		var encoded int
		for _, a := range args {
			b, _ := json.Marshal(a)
			encoded += len(b) + 1
		}
		var counted int
		for _, a := range args {
			counted += jsonStringLen(a) + 1
		}
		if counted < encoded {
			t.Errorf("%q: counted %d bytes, encoding/json writes %d", c, counted, encoded)
		}
	}
}
