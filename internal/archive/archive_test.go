package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"strings"
	"testing"
)

// entry is one header of a hand-made archive.
type entry struct {
	name, link, body string
	typ              byte
}

func makeTar(t *testing.T, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Hostile archives are refused naming the entry; good ones pass.
func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		entries []entry
		want    string // "" accepted, else part of the error
	}{
		{"files and dirs", []entry{{name: "./", typ: tar.TypeDir}, {name: "a/", typ: tar.TypeDir}, {name: "a/b.txt", body: "hi"}, {name: "c", body: ""}}, ""},
		{"implied dirs", []entry{{name: "x/y/z.txt", body: "z"}}, ""},
		{"relative link inside", []entry{{name: "d/f", body: "1"}, {name: "d/l", link: "f", typ: tar.TypeSymlink}, {name: "d/e/up", link: "../f", typ: tar.TypeSymlink}}, ""},
		{"dangling link inside", []entry{{name: "l", link: "nothing", typ: tar.TypeSymlink}}, ""},
		{"absolute name", []entry{{name: "/etc/passwd", body: "x"}}, "absolute name"},
		{"dot-dot name", []entry{{name: "a/../../b", body: "x"}}, `goes up with ".."`},
		{"dot-dot at end", []entry{{name: "a/..", typ: tar.TypeDir}}, `goes up with ".."`},
		{"absolute link", []entry{{name: "l", link: "/etc", typ: tar.TypeSymlink}}, "absolute path"},
		{"escaping link", []entry{{name: "a/l", link: "../../x", typ: tar.TypeSymlink}}, "leads out"},
		{"dot-dot after a name", []entry{{name: "up", link: "sub/..", typ: tar.TypeSymlink}}, "after a name"},
		{"link then a file through it", []entry{{name: "l", link: "d", typ: tar.TypeSymlink}, {name: "l/f", body: "x"}}, `"l" is not a directory`},
		{"file under a file", []entry{{name: "f", body: "x"}, {name: "f/g", body: "y"}}, `"f" is not a directory`},
		{"hard link", []entry{{name: "f", body: "x"}, {name: "g", link: "f", typ: tar.TypeLink}}, "hard links"},
		{"device", []entry{{name: "null", typ: tar.TypeChar}}, "only files, directories"},
		{"fifo", []entry{{name: "p", typ: tar.TypeFifo}}, "only files, directories"},
		{"twice", []entry{{name: "f", body: "x"}, {name: "./f", body: "y"}}, "appears twice"},
		{"backslash", []entry{{name: `a\..\..\b`, body: "x"}}, "backslash"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(bytes.NewReader(makeTar(t, tc.entries...)))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			var ae *Error
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want an *Error with %q", err, tc.want)
			}
		})
	}
}

// Garbage and a cut-off archive are refused.
func TestCheckRefusesDamage(t *testing.T) {
	good := makeTar(t, entry{name: "f", body: strings.Repeat("x", 3000)})
	for name, b := range map[string][]byte{
		"garbage": bytes.Repeat([]byte("not a tar "), 100),
		"cut":     good[:1000],
	} {
		if err := Check(bytes.NewReader(b)); err == nil {
			t.Errorf("%s: Check accepted it", name)
		}
	}
}
