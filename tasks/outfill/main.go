// Command outfill is a test task for the limits of /out and of
// checkpoints. Its first argument says what it does:
//
//	outfill bytes N   writes N bytes to /out/big in chunks of 64 KiB
//	outfill files N   creates N empty files /out/f00000, /out/f00001, ...
//	outfill rewrite N writes 64 KiB to /out/again N times, truncating it
//	                  each time (so that it holds 64 KiB at the end)
//	outfill ckpt N    saves a checkpoint of N bytes
//	outfill resume N  restores a checkpoint and prints its size and sha256,
//	                  or else saves a checkpoint of N bytes (byte i is
//	                  i*31 mod 251) and exits with 3, so that the next
//	                  attempt resumes from it

// After each chunk or file it writes the total so far to stderr on a line
// of its own ("wrote 65536", "created 1"), so that its log's last line says
// how far it got before it was stopped. A checkpoint's answer goes to
// stderr as "checkpoint saved" or "checkpoint refused: ...".
package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"

	"github.com/cyclepool/cyclepool/tasks/sdk"
)

func main() {
	if len(os.Args) != 3 {
		fail("usage: outfill bytes|files|rewrite|ckpt N")
	}
	n, err := strconv.ParseInt(os.Args[2], 10, 64)
	if err != nil || n < 0 {
		fail("bad N: " + os.Args[2])
	}
	switch os.Args[1] {
	case "bytes":
		f, err := os.Create("/out/big")
		if err != nil {
			fail(err.Error())
		}
		chunk := bytes.Repeat([]byte{'b'}, 64<<10)
		var done int64
		for done < n {
			k := min(n-done, int64(len(chunk)))
			if _, err := f.Write(chunk[:k]); err != nil {
				fail(err.Error())
			}
			done += k
			fmt.Fprintln(os.Stderr, "wrote", done)
		}
		if err := f.Close(); err != nil {
			fail(err.Error())
		}
	case "files":
		for i := int64(0); i < n; i++ {
			f, err := os.Create(fmt.Sprintf("/out/f%05d", i))
			if err != nil {
				fail(err.Error())
			}
			f.Close()
			fmt.Fprintln(os.Stderr, "created", i+1)
		}
	case "rewrite":
		chunk := bytes.Repeat([]byte{'r'}, 64<<10)
		for i := int64(0); i < n; i++ {
			if err := os.WriteFile("/out/again", chunk, 0o644); err != nil {
				fail(err.Error())
			}
		}
	case "ckpt":
		if err := sdk.Checkpoint(bytes.Repeat([]byte{'c'}, int(n))); err != nil {
			fmt.Fprintln(os.Stderr, "checkpoint refused:", err)
			return
		}
		fmt.Fprintln(os.Stderr, "checkpoint saved")
	case "resume":
		if st, ok := sdk.Restore(); ok {
			fmt.Printf("restored %d %x\n", len(st), sha256.Sum256(st))
			return
		}
		st := make([]byte, n)
		for i := range st {
			st[i] = byte(i * 31 % 251)
		}
		if err := sdk.Checkpoint(st); err != nil {
			fail("checkpoint refused: " + err.Error())
		}
		fmt.Fprintln(os.Stderr, "checkpoint saved; failing on purpose")
		os.Exit(3)
	default:
		fail("unknown mode " + os.Args[1])
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "outfill:", msg)
	os.Exit(1)
}
