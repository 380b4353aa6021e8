package workflow

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"unicode/utf8"
)

// fastDecodeSeeds are files scan accepts or refuses in the ways fastDecode
// must tell apart: it may give up on a file that scan accepts, never decode
// one that scan refuses.
var fastDecodeSeeds = []string{
	`{"name": "w", "tasks": [{"name": "a", "module": "a.wasm"}]}`,
	` {"name":"w","priority":"batch","replicas":3,"quorum":2,"tasks":[{"name":"a","module":"m","args":["x","\u00e9\n\"\\\/"],` +
		`"stdin":{"data":"d"},"timeout":"1m","max_attempts":-0,"limits":{"memory_mib":64,"output_mib":1,"log_kib":999999999},` +
		`"checkpoint_interval":"2m"},{"name":"b","module":"m","inputs":{"in":{"from":"a","output":"o"},"x":{}},"stdin":{"from":"a"}}]}` + "\r\n\t",
	`{"name": "w", "tasks": []}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "inputs": {"i\u006e": {"from": "a"}}}]}`, // escaped key: scan accepts
	`{"n\u0061me": "w", "tasks": [{"name": "a", "module": "m"}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": 1e3}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": 1.0}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": 2147483647}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": 2147483648}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": 01}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": -}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "max_attempts": "3"}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "args": null}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "name": "b"}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "inputs": {"x": {"from": "a"}, "x": {"from": "a"}}}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "extra": 1}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m"},]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m"}]} x`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m"}]}{}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m"}`,
	`{"name": "w\x01", "tasks": [{"name": "a", "module": "m"}]}`,
	`{"name": "w\q", "tasks": [{"name": "a", "module": "m"}]}`,
	`{"name": "w\u12", "tasks": [{"name": "a", "module": "m"}]}`,
	`{"name": "w", "tasks": [{"name": "a", "module": true}]}`,
	`{"name": "w", "tasks": {"name": "a"}}`,
	"\ufeff" + `{"name": "w", "tasks": [{"name": "a", "module": "m"}]}`,
	`{"name": "w" "tasks": []}`,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "limits": {"memory_mib": 1, }}]}`,
	`[]`,
	``,
	`{"name": "w", "tasks": [{"name": "a", "module": "m", "inputs": {"x": {"from": "a", "output": "o\u0000"}}}]}`,
}

// fastDecode decodes only files that scan accepts, and the ordinary ones,
// as scan and the JSON decoding do.
func TestFastDecodeAgreesWithScanAndDecode(t *testing.T) {
	for _, s := range fastDecodeSeeds {
		checkFastDecode(t, []byte(s))
	}
	ordinary := []string{fastDecodeSeeds[0], fastDecodeSeeds[1], fastDecodeSeeds[2], string(largeFile(100))}
	files, _ := filepath.Glob("../../examples/*.json")
	if len(files) == 0 {
		t.Fatal("no examples")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ordinary = append(ordinary, string(data))
	}
	for _, s := range ordinary {
		if _, ok := fastDecode([]byte(s)); !ok {
			t.Errorf("fastDecode gives up on an ordinary file: %.200s", s)
		}
	}
}

// checkFastDecode fails when fastDecode decodes data that scan refuses, or
// decodes it otherwise than the JSON decoding.
func checkFastDecode(t *testing.T, data []byte) {
	t.Helper()
	got, ok := fastDecode(data)
	if !ok {
		return
	}
	if err := scan(data); err != nil {
		t.Fatalf("fastDecode decodes a file scan refuses (%v): %q", err, data)
	}
	want, err := decode(data)
	if err != nil {
		t.Fatalf("fastDecode decodes a file the JSON decoding refuses (%v): %q", err, data)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("fastDecode of %q:\n%#v\nJSON decoding:\n%#v", data, got, want)
	}
}

// FuzzFastDecode checks that fastDecode never decodes a file that scan
// refuses, and decodes the others as the JSON decoding does.
func FuzzFastDecode(f *testing.F) {
	for _, s := range fastDecodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) {
			return // Parse refuses it before either
		}
		checkFastDecode(t, data)
	})
}

// Parse of a large file allocates little per task: the structure check no
// longer makes a token value of every key and string (Parse made 35
// allocations per task of this file).
func TestParseOfALargeFileAllocatesLittle(t *testing.T) {
	const n = 20000
	data := largeFile(n)
	allocs := testing.AllocsPerRun(2, func() {
		if _, err := Parse(data); err != nil {
			t.Fatal(err)
		}
	})
	if perTask := allocs / n; perTask > 4 {
		t.Errorf("Parse makes %.1f allocations per task", perTask)
	}
}

// largeFile is a workflow of n independent tasks, as the dispatch
// benchmark submits.
func largeFile(n int) []byte {
	type task struct {
		Name   string `json:"name"`
		Module string `json:"module"`
	}
	tasks := make([]task, n)
	for i := range tasks {
		tasks[i] = task{Name: fmt.Sprintf("t%d", i), Module: "sha256:" + fmt.Sprintf("%064x", i%3)}
	}
	data, _ := json.Marshal(map[string]any{"name": "large", "priority": "interactive", "tasks": tasks})
	return data
}
