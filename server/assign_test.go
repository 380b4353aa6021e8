package server

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/fill"
	"github.com/cyclepool/cyclepool/internal/protocol"
	"github.com/cyclepool/cyclepool/internal/store"
)

// Every field of an assignment is filled from a claimed attempt: a field
// added to protocol.Assign (or protocol.Limits) that toAssign does not set
// fails this, as TestEncodeFastWritesEveryField does for the codec and
// TestWireCodecRoundTrip for the slot wire (docs/PROTOCOL.md lists the
// other places a new field goes).
func TestToAssignSetsEveryField(t *testing.T) {
	t.Parallel()
	var c store.Claimed
	v := reflect.ValueOf(&c).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.CanSet() {
			if err := fill.Value(f); err != nil {
				t.Fatalf("fill Claimed.%s: %v", v.Type().Field(i).Name, err)
			}
		}
	}
	// The setup is JSON, as the submission wrote it.
	var su protocol.Setup
	if err := fill.Value(reflect.ValueOf(&su).Elem()); err != nil {
		t.Fatal(err)
	}
	c.Setup, _ = json.Marshal(su)
	for i := range c.Inputs {
		c.Inputs[i].Blob = "" // inline inputs here: uploaded ones in TestToAssignUploadedInputs
	}
	a, err := toAssign(&c, assignee{upload: true, blobURL: func(id string) (string, error) { return "/blobs/" + id + "?k=t", nil }})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Setup, &su) {
		t.Errorf("toAssign's setup %+v, want %+v", a.Setup, su)
	}
	// Blob names of stdin and restore are not used (those blobs are
	// data), and a blob's size is the encoder's to write.
	unset := zeroFields(reflect.ValueOf(a), "Assign")
	unset = slices.DeleteFunc(unset, func(p string) bool {
		return p == "Assign.Stdin.Name" || p == "Assign.Restore.Name" || strings.HasSuffix(p, ".Size")
	})
	for _, p := range unset {
		t.Errorf("toAssign leaves %s unset", p)
	}
}

// An input uploaded over HTTP becomes a file of the setup, downloaded
// from a signed address; output limits are cut to what the worker can
// send back.
func TestToAssignUploadedInputs(t *testing.T) {
	t.Parallel()
	blob := "sha256:" + strings.Repeat("ab", 32)
	url := func(id string) (string, error) { return "/blobs/" + id + "?k=t", nil }
	for _, tc := range []struct {
		name      string
		to        assignee
		setup     []byte
		inputs    []store.Input
		wantFiles []protocol.File
		wantLimit int64
	}{
		{name: "inline only", to: assignee{upload: true, blobURL: url}, inputs: []store.Input{{Name: "a", Data: []byte("x")}}, wantLimit: 1 << 30},
		{name: "uploaded to /in", to: assignee{upload: true, blobURL: url}, inputs: []store.Input{{Name: "big", Blob: blob, Size: 5}},
			wantFiles: []protocol.File{{Path: "/in/big", Blob: blob, Size: 5, URL: "/blobs/" + blob + "?k=t"}}, wantLimit: 1 << 30},
		{name: "uploaded to its path", to: assignee{upload: true, blobURL: url}, setup: []byte(`{"cwd":"/w"}`),
			inputs:    []store.Input{{Name: "/w/big", Blob: blob, Size: 5}},
			wantFiles: []protocol.File{{Path: "/w/big", Blob: blob, Size: 5, URL: "/blobs/" + blob + "?k=t"}}, wantLimit: 1 << 30},
		{name: "old worker", to: assignee{blobURL: url}, wantLimit: protocol.InlineOutputBytes},
		{name: "browser", to: assignee{upload: true, browser: true, blobURL: url}, wantLimit: protocol.BrowserOutputBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := store.Claimed{Attempt: 1, OutputBytes: 1 << 30, Setup: tc.setup, Inputs: tc.inputs}
			a, err := toAssign(&c, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			if a.Limits.OutputBytes != tc.wantLimit {
				t.Errorf("output limit %d, want %d", a.Limits.OutputBytes, tc.wantLimit)
			}
			var files []protocol.File
			if a.Setup != nil {
				files = a.Setup.Files
			}
			if !reflect.DeepEqual(files, tc.wantFiles) {
				t.Errorf("setup files %+v, want %+v", files, tc.wantFiles)
			}
			for _, in := range a.Inputs {
				if in.Name == "big" || in.Name == "/w/big" {
					t.Errorf("uploaded input %q is also an inline input", in.Name)
				}
			}
		})
	}
}

// zeroFields lists the paths of v's zero fields (structs field by field,
// slices by their first element).
func zeroFields(v reflect.Value, path string) []string {
	switch v.Kind() {
	case reflect.Struct:
		var out []string
		for i := range v.NumField() {
			out = append(out, zeroFields(v.Field(i), path+"."+v.Type().Field(i).Name)...)
		}
		return out
	case reflect.Slice:
		if v.Len() == 0 {
			return []string{path}
		}
		return zeroFields(v.Index(0), path+"[0]")
	}
	if v.IsZero() {
		return []string{path}
	}
	return nil
}
