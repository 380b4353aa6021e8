package workflow

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// fastScanSeeds are files scan accepts or refuses in the ways fastScan must
// tell apart: it may refuse a file that scan accepts, never the reverse.
var fastScanSeeds = []string{
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

// fastScan accepts only files that scan accepts, and the ordinary ones.
func TestFastScanAcceptsOnlyWhatScanAccepts(t *testing.T) {
	for _, s := range fastScanSeeds {
		if fastScan([]byte(s)) && scan([]byte(s)) != nil {
			t.Errorf("fastScan accepts %s, scan refuses it: %v", s, scan([]byte(s)))
		}
	}
	ordinary := []string{fastScanSeeds[0], fastScanSeeds[1], fastScanSeeds[2], string(largeFile(100))}
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
		if !fastScan([]byte(s)) {
			t.Errorf("fastScan refuses an ordinary file: %.200s", s)
		}
	}
}

// FuzzFastScan checks that fastScan never accepts a file that scan
// refuses.
func FuzzFastScan(f *testing.F) {
	for _, s := range fastScanSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !utf8.Valid(data) {
			return // Parse refuses it before either scan
		}
		if fastScan(data) {
			if err := scan(data); err != nil {
				t.Fatalf("fastScan accepts a file scan refuses (%v): %q", err, data)
			}
		}
	})
}

// Parse of a large file allocates little per task: the structure check no
// longer makes a token value of every key and string (it made 33
// allocations per task of this file, Parse 35 in all).
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
