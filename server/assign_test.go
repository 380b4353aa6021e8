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
	a := toAssign(&c)
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
