package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"
)

// dataBytes is the size of the blob the data part moves.
const dataBytes = 1 << 30

// data pushes a 1 GiB blob to the server and reads it back as a worker
// does, and reports both rates and the server's resident memory above
// idle meanwhile (docs/DATA.md: a blob is never held whole).
func (b *bench) data(ctx context.Context) error {
	pid := b.server.cmd.Process.Pid
	idle, err := rssKiB(pid)
	if err != nil {
		return err
	}
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if kib, err := rssKiB(pid); err == nil && kib > peak.Load() {
				peak.Store(kib)
			}
		}
	}()
	defer func() { close(stop); <-sampled }()

	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(newStream(7), dataBytes)); err != nil {
		return err
	}
	id := "sha256:" + hex.EncodeToString(h.Sum(nil))
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, b.url+"/api/v1/blobs/"+id+"?name=bench.bin", io.LimitReader(newStream(7), dataBytes))
	if err != nil {
		return err
	}
	req.ContentLength = dataBytes
	req.Header.Set("Authorization", "Bearer "+b.ownerToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("push: %s %s", resp.Status, body)
	}
	up := time.Since(start)

	start = time.Now()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/api/v1/blobs/"+id, nil)
	req.Header.Set("Authorization", "Bearer "+b.ownerToken)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	h.Reset()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	down := time.Since(start)
	if err != nil || n != dataBytes || "sha256:"+hex.EncodeToString(h.Sum(nil)) != id {
		return fmt.Errorf("read back %d bytes (%v), not the blob", n, err)
	}
	mib := float64(dataBytes) / (1 << 20)
	b.printf("blob_upload_mib_per_s: %.0f (1 GiB into the database, chunked)", mib/up.Seconds())
	b.printf("blob_download_mib_per_s: %.0f (1 GiB out of the database over loopback, as a worker reads it)", mib/down.Seconds())
	b.printf("transfer_server_peak_mib: %.1f above idle (%.1f MiB)", float64(peak.Load()-idle)/1024, float64(idle)/1024)
	return nil
}

// stream is an endless stream of pseudo-random bytes (data that does not
// compress, as most data files).
type stream struct{ r *rand.PCG }

func newStream(seed uint64) io.Reader { return stream{rand.NewPCG(seed, 3)} }

func (s stream) Read(p []byte) (int, error) {
	i := 0
	for ; i+8 <= len(p); i += 8 {
		v := s.r.Uint64()
		p[i], p[i+1], p[i+2], p[i+3], p[i+4], p[i+5], p[i+6], p[i+7] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(p); i++ {
		p[i] = byte(s.r.Uint64())
	}
	return len(p), nil
}
