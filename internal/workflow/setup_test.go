package workflow

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

const idA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// A task's env, cwd, files and outputs are read, sorted and resolved.
func TestSetupFields(t *testing.T) {
	s, err := Parse([]byte(`{"name": "w", "tasks": [
		{"name": "split", "module": "s.wasm"},
		{"name": "count", "module": "k.wasm",
		 "env": {"LANG": "C", "INDEX": "/data/index"},
		 "cwd": "/work",
		 "files": {
		   "/data/genome.fa": {"blob": "./data/genome.fa"},
		   "/data/index": {"blob": "` + idA + `", "archive": true},
		   "/data/index/extra.txt": {"data": "x"},
		   "/": {"blob": "./rootfs.tar", "archive": true, "writable": true},
		   "/work/params.json": {"data": "{\"min\": 3}"},
		   "/work/part.txt": {"from": "split", "output": "part-3.txt"}
		 },
		 "outputs": ["/work/counts.tsv"],
		 "limits": {"scratch_mib": 10}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	c := s.Tasks[1]
	if !reflect.DeepEqual(c.Env, []string{"INDEX=/data/index", "LANG=C"}) || c.Cwd != "/work" || c.ScratchBytes != 10<<20 {
		t.Errorf("env %q, cwd %q, scratch %d", c.Env, c.Cwd, c.ScratchBytes)
	}
	var paths []string
	for _, f := range c.Files {
		paths = append(paths, f.Path)
	}
	if want := []string{"/", "/data/genome.fa", "/data/index", "/data/index/extra.txt", "/work/params.json", "/work/part.txt"}; !reflect.DeepEqual(paths, want) {
		t.Errorf("paths %q, want %q", paths, want)
	}
	if f := c.Files[5]; f.Source == nil || f.Source.Task != 0 || f.Source.Output != "part-3.txt" {
		t.Errorf("from file: %+v", f)
	}
	if f := c.Files[0]; !f.Archive || !f.Writable || f.Blob != "./rootfs.tar" {
		t.Errorf("root: %+v", f)
	}
	if !reflect.DeepEqual(s.Deps(1), []int{0}) {
		t.Errorf("deps %v, want [0]: a file from split is an input", s.Deps(1))
	}
	if !reflect.DeepEqual(s.BlobPaths(), []string{"./rootfs.tar", "./data/genome.fa"}) || !reflect.DeepEqual(s.BlobIDs(), []string{idA}) {
		t.Errorf("blob paths %q, ids %q", s.BlobPaths(), s.BlobIDs())
	}
	if !c.HasSetup() || s.Tasks[0].HasSetup() {
		t.Errorf("HasSetup: %v %v", c.HasSetup(), s.Tasks[0].HasSetup())
	}
	// Pushed, a path becomes an id, and the file as written says so.
	idB := "sha256:" + strings.Repeat("b", 64)
	if n, err := s.ReplaceBlob("./rootfs.tar", idB); n != 1 || err != nil {
		t.Fatalf("ReplaceBlob = %d, %v", n, err)
	}
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse(Marshal()): %v\n%s", err, b)
	}
	if again.Tasks[1].Files[0].Blob != idB || !reflect.DeepEqual(again.Tasks[1].Files, s.Tasks[1].Files) {
		t.Errorf("after a round trip: %+v", again.Tasks[1].Files)
	}
}

// Bad setups are refused naming the task and the field.
func TestSetupRefusals(t *testing.T) {
	tests := []struct {
		name, task, field, msg string
	}{
		{`"env": {"A=B": "x"}`, "t", "env.A=B", "'='"},
		{`"env": {"A": "x\u0000"}`, "t", "env.A", "NUL"},
		{`"files": {"/a": {"data": "x\u0000y"}}`, "t", "files./a", "must not hold NUL"},
		{`"cwd": "work"`, "t", "cwd", "absolute"},
		{`"cwd": "/a/../b"`, "t", "cwd", "clean path"},
		{`"files": {"/a/../../etc/passwd": {"data": "x"}}`, "t", "files./a/../../etc/passwd", "clean path"},
		{`"files": {"data/x": {"data": "x"}}`, "t", "files.data/x", "absolute"},
		{`"files": {"/in/x": {"data": "x"}}`, "t", "files./in/x", "under /in"},
		{`"files": {"/out": {"data": "x"}}`, "t", "files./out", "under /out"},
		{`"files": {"/a": {"data": "x"}, "/a/b": {"data": "y"}}`, "t", "files./a/b", `inside "/a", which is a file`},
		{`"files": {"/a": {"data": "x", "blob": "` + idA + `"}}`, "t", "files./a", "one of"},
		{`"files": {"/a": {}}`, "t", "files./a", "one of"},
		{`"files": {"/a": {"data": "x", "writable": true}}`, "t", "files./a", "takes no"},
		{`"files": {"/": {"blob": "` + idA + `"}}`, "t", "files./", "only an archive"},
		{`"files": {"/": {"data": "x"}}`, "t", "files./", "only an archive"},
		{`"files": {"/a": {"blob": "sha256:12"}}`, "t", "files./a.blob", "not a data id"},
		{`"files": {"/a": {"from": "nobody"}}`, "t", "files./a", `unknown task "nobody"`},
		{`"files": {"/a": {"from": "t"}}`, "t", "files./a", "its own task"},
		{`"files": {"/a": {"blob": "` + idA + `", "archive": "yes"}}`, "t", "files./a.archive", "true or false"},
		{`"files": {"/a": {"data": "x"}}, "cwd": "/a"`, "t", "cwd", "not a directory"},
		{`"outputs": ["/out/x"]`, "t", "outputs[0]", "under /out"},
		{`"outputs": ["/w/x", "/w/x"]`, "t", "outputs[1]", "appears twice"},
		{`"outputs": ["w"]`, "t", "outputs[0]", "absolute"},
		{`"limits": {"scratch_mib": 0}`, "t", "limits.scratch_mib", "out of range"},
		// Paths a host could not make: every attempt would fail on every
		// worker, as the worker's fault.
		{`"files": {"/` + strings.Repeat("n", 256) + `": {"data": "x"}}`, "t", "files./" + strings.Repeat("n", 256), "name of 256 bytes"},
		{`"outputs": ["/w/` + strings.Repeat("n", 256) + `"]`, "t", "outputs[0]", "more than 255"},
		{`"cwd": "` + strings.Repeat("/d", 1537) + `"`, "t", "cwd", "3074 bytes long, more than 3072"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(`{"name": "w", "tasks": [{"name": "t", "module": "m.wasm", ` + tc.name + `}]}`))
			var we *Error
			if !errors.As(err, &we) || we.Task != tc.task || we.Field != tc.field || !strings.Contains(we.Msg, tc.msg) {
				t.Fatalf("Parse: %v, want task %q field %q with %q", err, tc.task, tc.field, tc.msg)
			}
		})
	}
}

// A downstream task may read an output an upstream task declares by path
// (or a file under a declared directory), and no other absolute name.
func TestOutputsByPath(t *testing.T) {
	for _, tc := range []struct {
		output string
		ok     bool
	}{
		{"/work/counts.tsv", true},
		{"/res/part/1.bin", true},
		{"/res", true},
		{"/work/other.tsv", false},
		{"/resx", false},
	} {
		_, err := Parse([]byte(`{"name": "w", "tasks": [
			{"name": "a", "module": "m.wasm", "outputs": ["/work/counts.tsv", "/res"]},
			{"name": "b", "module": "m.wasm", "inputs": {"f": {"from": "a", "output": "` + tc.output + `"}}}]}`))
		if (err == nil) != tc.ok {
			t.Errorf("output %q: %v, want ok %v", tc.output, err, tc.ok)
		}
	}
}
