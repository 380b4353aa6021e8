package main

import (
	"strings"
	"testing"
)

func TestReduce(t *testing.T) {
	for _, tc := range []struct {
		op      string
		inputs  []string
		want    string
		wantErr bool
	}{
		{"sum", []string{"348513\n", "316066\n"}, "664579", false},
		{"sum", nil, "0", false},
		{"sum", []string{"1 2 3", "\t4\n5  ", "-6"}, "9", false},
		{"sum", []string{"9223372036854775807", "1"}, "9223372036854775808", false},
		{"max", []string{"3 -7 12", "+5", ""}, "12", false},
		{"max", []string{"-3 -7"}, "-3", false},
		{"min", []string{"3 -7 12", "5"}, "-7", false},
		{"min", []string{""}, "", true},
		{"max", nil, "", true},
		{"count", []string{"1 2 3", "", "4\n"}, "4", false},
		{"count", nil, "0", false},
		{"sum", []string{"1 two 3"}, "", true},
		{"sum", []string{"1.5"}, "", true},
	} {
		r, err := newReducer(tc.op)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range tc.inputs {
			if err = r.addFrom("in", strings.NewReader(in)); err != nil {
				break
			}
		}
		var got string
		if err == nil {
			got, err = r.result()
		}
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%s %q = %q, %v; want %q (error %v)", tc.op, tc.inputs, got, err, tc.want, tc.wantErr)
		}
	}
	if _, err := newReducer("avg"); err == nil {
		t.Error("unknown operation accepted")
	}
}
