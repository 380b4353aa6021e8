package workflow

import (
	"fmt"
	"strings"
)

// MaxAssignHeaderBytes bounds what a task's arguments and input file names
// take, written as JSON, in the header of the frame that carries the task
// to a worker. A frame header is at most protocol.MaxHeaderBytes (1 MiB)
// and holds more than these; a task over it could never be delivered (each
// worker refused its assignment, and it failed later as lost), so it is
// refused when submitted. Its stdin and inputs travel in the frame's
// payload, which MaxFileSize and the server's check at dispatch bound.
const MaxAssignHeaderBytes = 512 << 10

// checkAssignHeader says what is wrong with the arguments and input names
// of a task ("" when nothing).
func checkAssignHeader(args []string, inputs map[string]refJSON) string {
	n := 0
	for _, a := range args {
		n += jsonStringLen(a) + 1
	}
	for f := range inputs {
		n += jsonStringLen(f) + len(`{"name":,"size":0000000000},`)
	}
	if n > MaxAssignHeaderBytes {
		return fmt.Sprintf("the arguments and input file names take %d bytes in the assignment sent to workers, more than the %d it may hold (a frame header is at most 1 MiB)",
			n, MaxAssignHeaderBytes)
	}
	return ""
}

// jsonStringLen is the length of s written as a JSON string by
// encoding/json (HTML-safe escaping, as the protocol's frames are), quotes
// included, or more.
func jsonStringLen(s string) int {
	n := len(s) + 2
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"', c == '\\', c == '\n', c == '\r', c == '\t':
			n++
		case c < 0x20, c == '<', c == '>', c == '&':
			n += 5
		}
	}
	// U+2028 and U+2029 (3 bytes each) are written \u2028 and \u2029.
	return n + 3*(strings.Count(s, "\u2028")+strings.Count(s, "\u2029"))
}
