package archive

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
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

// rawHeader is a ustar header block, written by hand: tar.Writer drops
// the GNU.sparse records that TestCheckRefusesSparseFiles needs.
func rawHeader(name string, typ byte, size int) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:156], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// padded appends p to b with the zeros that end its last block.
func padded(b, p []byte) []byte {
	b = append(b, p...)
	return append(b, make([]byte, (512-len(p)%512)%512)...)
}

// paxRecord is one record of a PAX extended header.
func paxRecord(k, v string) string {
	rec := " " + k + "=" + v + "\n"
	n := len(rec) + 1
	for len(strconv.Itoa(n))+len(rec) != n {
		n++
	}
	return strconv.Itoa(n) + rec
}

// sparseTar is an archive of one sparse file "big" of 1 TiB (a hole),
// in a GNU PAX sparse format: its PAX records, and its data section (in
// format 1.0, the sparse map).
func sparseTar(records []string, data string) []byte {
	var pax string
	for _, r := range records {
		pax += r
	}
	b := padded(rawHeader("PaxHeaders/big", tar.TypeXHeader, len(pax)), []byte(pax))
	b = padded(append(b, rawHeader("big", tar.TypeReg, len(data))...), []byte(data))
	return append(b, make([]byte, 1024)...)
}

// A sparse file's holes are read as zeros: a tar file of a few KiB would
// unpack on every worker into a file as large as it declares (1 TiB
// here), filling the disk. Every GNU sparse format is refused, and a file
// never reads as more bytes than the archive holds.
func TestCheckRefusesSparseFiles(t *testing.T) {
	const tib = "1099511627776"
	tests := []struct {
		name string
		tar  []byte
	}{
		{"pax 0.0", sparseTar([]string{paxRecord("GNU.sparse.size", tib), paxRecord("GNU.sparse.numblocks", "1"),
			paxRecord("GNU.sparse.offset", "0"), paxRecord("GNU.sparse.numbytes", "0")}, "")},
		{"pax 0.1", sparseTar([]string{paxRecord("GNU.sparse.size", tib), paxRecord("GNU.sparse.numblocks", "1"),
			paxRecord("GNU.sparse.map", "0,0")}, "")},
		{"pax 1.0", sparseTar([]string{paxRecord("GNU.sparse.major", "1"), paxRecord("GNU.sparse.minor", "0"),
			paxRecord("GNU.sparse.name", "big"), paxRecord("GNU.sparse.realsize", tib)}, string(padded(nil, []byte("1\n0\n0\n"))))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var read int64
			err := Walk(bytes.NewReader(tc.tar), func(e Entry, body io.Reader) error {
				n, err := io.Copy(io.Discard, io.LimitReader(body, 1<<20))
				read += n
				return err
			})
			if read > int64(len(tc.tar)) {
				t.Errorf("an archive of %d bytes read as %d bytes of files", len(tc.tar), read)
			}
			var ae *Error
			if !errors.As(err, &ae) || !strings.Contains(err.Error(), "sparse") {
				t.Fatalf("Walk = %v, want an *Error saying sparse", err)
			}
		})
	}
}
