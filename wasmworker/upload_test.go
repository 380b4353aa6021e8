//go:build !js

package wasmworker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// The files a runner left for the worker to upload (Outcome.Files) are
// removed once the attempt ends, whatever became of the upload: done,
// refused (for the output limit or otherwise), or never tried because the
// attempt failed. Each may be as large as the task's output limit.
func TestUploadOutputsRemovesTheFiles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int    // the server's answer to the upload
		fail   string // the attempt's own reason
		want   string // the outcome's reason
	}{
		{"uploaded", http.StatusOK, "", ""},
		{"refused", http.StatusBadRequest, "", protocol.ReasonWorker},
		{"over the output limit", http.StatusRequestEntityTooLarge, "", protocol.ReasonOutput},
		{"attempt failed", http.StatusOK, protocol.ReasonExit, protocol.ReasonExit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n, _ := io.Copy(io.Discard, r.Body)
				if tc.status != http.StatusOK {
					w.WriteHeader(tc.status)
					w.Write([]byte(`{"error": "no"}`))
					return
				}
				json.NewEncoder(w).Encode(protocol.Uploaded{Blob: "sha256:00", Size: n})
			}))
			defer srv.Close()
			path := filepath.Join(t.TempDir(), "spilled")
			if err := os.WriteFile(path, bytes.Repeat([]byte("o"), protocol.UploadMinBytes), 0o644); err != nil {
				t.Fatal(err)
			}
			w := &Worker{log: slog.New(slog.DiscardHandler), id: "w1", uploadKey: "key"}
			out := w.uploadOutputs(context.Background(), srv.URL, 7, &Outcome{Reason: tc.fail,
				Outputs: []protocol.Blob{{Name: "stdout"}},
				Files:   []OutputFile{{Name: "big", Path: path, Size: protocol.UploadMinBytes}}})
			if out.Reason != tc.want {
				t.Errorf("Reason %q (%s), want %q", out.Reason, out.Message, tc.want)
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the output's file is still there (%v)", err)
			}
		})
	}
}
