// Command fsprobe is a test task for the task's environment and file
// system (docs/DATA.md). Its arguments are commands, run in order, each
// printing one line to stdout (an error is printed, not fatal):
//
//	env             the environment, sorted, joined by spaces
//	pwd             the working directory
//	cat PATH        the file's content
//	ls DIR          the directory's entries, joined by spaces
//	write PATH TEXT writes TEXT to the file
//	append PATH TEXT appends TEXT to the file
//	rm PATH         removes the file
//	mv FROM TO      renames
//	fill PATH N     writes N bytes to the file
//	stat PATH       size and modification time (Unix seconds)
//	sha PATH        the file's size and sha256, in hex
//	crc PATH        the file's size and CRC-32 (IEEE), in hex: a check of
//	                large files that costs a tenth of sha's CPU
//	sock            the errnos of the socket functions (a task has no sockets)
//	mkdir PATH      makes a directory
//	rmdir PATH      removes a directory
//	trunc PATH N    truncates (or extends) the file to N bytes
//	readat PATH OFF N  reads N bytes at OFF
//	writeat PATH OFF TEXT  writes TEXT at OFF
//	lsl DIR         the entries with their kind and size
//	utime PATH SEC  sets the modification time (Unix seconds)
//	link OLD NEW    makes a hard link
//	symlink OLD NEW makes a symbolic link
//	seek PATH       the size by seeking to the end, then reading from 1 byte before it
//	open PATH N     opens the file N times without closing it: "opened N",
//	                or how many opened before the first error, and the error
package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	args := os.Args[1:]
	for len(args) > 0 {
		cmd := args[0]
		need := map[string]int{"env": 0, "pwd": 0, "cat": 1, "ls": 1, "write": 2, "append": 2, "rm": 1, "mv": 2, "fill": 2, "stat": 1, "sha": 1, "crc": 1, "sock": 0, "mkdir": 1, "rmdir": 1, "trunc": 2, "readat": 3, "writeat": 3, "lsl": 1, "utime": 2, "link": 2, "symlink": 2, "seek": 1, "open": 2}[cmd]
		if len(args) < 1+need {
			fmt.Fprintf(os.Stderr, "fsprobe: %s wants %d arguments\n", cmd, need)
			os.Exit(2)
		}
		a := args[1 : 1+need]
		args = args[1+need:]
		fmt.Println(run(cmd, a))
	}
}

func run(cmd string, a []string) string {
	switch cmd {
	case "env":
		e := os.Environ()
		sort.Strings(e)
		return strings.Join(e, " ")
	case "pwd":
		d, err := os.Getwd()
		return result(d, err)
	case "cat":
		b, err := os.ReadFile(a[0])
		return result(string(b), err)
	case "ls":
		es, err := os.ReadDir(a[0])
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		return result(strings.Join(names, " "), err)
	case "write":
		return result("ok", os.WriteFile(a[0], []byte(a[1]), 0o644))
	case "append":
		f, err := os.OpenFile(a[0], os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return result("", err)
		}
		_, err = f.WriteString(a[1])
		f.Close()
		return result("ok", err)
	case "rm":
		return result("ok", os.Remove(a[0]))
	case "mv":
		return result("ok", os.Rename(a[0], a[1]))
	case "open":
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return result("", err)
		}
		var open []*os.File
		defer func() {
			for _, f := range open {
				f.Close()
			}
		}()
		for len(open) < n {
			f, err := os.Open(a[0])
			if err != nil {
				return fmt.Sprintf("opened %d: %v", len(open), err)
			}
			open = append(open, f)
		}
		return fmt.Sprintf("opened %d", n)
	case "fill":
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return result("", err)
		}
		return result("ok", os.WriteFile(a[0], bytes.Repeat([]byte("x"), n), 0o644))
	case "mkdir":
		return result("ok", os.Mkdir(a[0], 0o755))
	case "rmdir":
		return result("ok", syscallRmdir(a[0]))
	case "trunc":
		n, err := strconv.ParseInt(a[1], 10, 64)
		if err != nil {
			return result("", err)
		}
		return result("ok", os.Truncate(a[0], n))
	case "readat":
		off, err1 := strconv.ParseInt(a[1], 10, 64)
		n, err2 := strconv.Atoi(a[2])
		if err1 != nil || err2 != nil {
			return "bad numbers"
		}
		f, err := os.Open(a[0])
		if err != nil {
			return result("", err)
		}
		defer f.Close()
		b := make([]byte, n)
		k, err := f.ReadAt(b, off)
		if err == io.EOF {
			err = nil
		}
		return result(fmt.Sprintf("%d %q", k, b[:k]), err)
	case "writeat":
		off, err := strconv.ParseInt(a[1], 10, 64)
		if err != nil {
			return result("", err)
		}
		f, err := os.OpenFile(a[0], os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return result("", err)
		}
		defer f.Close()
		_, err = f.WriteAt([]byte(a[2]), off)
		return result("ok", err)
	case "lsl":
		es, err := os.ReadDir(a[0])
		var parts []string
		for _, e := range es {
			kind := "f"
			if e.IsDir() {
				kind = "d"
			}
			size := int64(-1)
			if fi, err := e.Info(); err == nil && !e.IsDir() {
				size = fi.Size()
			}
			parts = append(parts, fmt.Sprintf("%s:%s:%d", e.Name(), kind, size))
		}
		return result(strings.Join(parts, " "), err)
	case "utime":
		sec, err := strconv.ParseInt(a[1], 10, 64)
		if err != nil {
			return result("", err)
		}
		t := time.Unix(sec, 0)
		return result("ok", os.Chtimes(a[0], t, t))
	case "link":
		return result("ok", os.Link(a[0], a[1]))
	case "symlink":
		return result("ok", os.Symlink(a[0], a[1]))
	case "seek":
		f, err := os.Open(a[0])
		if err != nil {
			return result("", err)
		}
		defer f.Close()
		end, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			return result("", err)
		}
		if _, err := f.Seek(-1, io.SeekCurrent); err != nil {
			return result("", err)
		}
		b, err := io.ReadAll(f)
		return result(fmt.Sprintf("%d %q", end, b), err)
	case "sock":
		return sockErrnos()
	case "sha":
		h := sha256.New()
		n, err := digest(a[0], h)
		return result(fmt.Sprintf("%d %x", n, h.Sum(nil)), err)
	case "crc":
		h := crc32.NewIEEE()
		n, err := digest(a[0], h)
		return result(fmt.Sprintf("%d %08x", n, h.Sum32()), err)
	case "stat":
		fi, err := os.Stat(a[0])
		if err != nil {
			return result("", err)
		}
		return fmt.Sprintf("%d %d", fi.Size(), fi.ModTime().Unix())
	}
	return "unknown command " + cmd
}

// digest writes the file at path into h and returns its size.
func digest(path string, h io.Writer) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return io.Copy(h, f)
}

func result(s string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

// syscallRmdir removes an empty directory (os.Remove would try a file
// first).
func syscallRmdir(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("rmdir %s: not a directory", p)
	}
	return os.Remove(p)
}
