//go:build unix

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// peakRSS returns the peak resident set size (VmHWM) of process pid, in
// bytes, and its current one (VmRSS).
func peakRSS(t *testing.T, pid int) (peak, now int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", k, v, err)
		}
		if k == "VmHWM" {
			peak = n << 10
		} else {
			now = n << 10
		}
	}
	if peak == 0 || now == 0 {
		t.Fatalf("no VmHWM/VmRSS in /proc/%d/status", pid)
	}
	return peak, now
}

// queryInt runs a query returning one integer on the database at db.
func queryInt(t *testing.T, db, q string, args ...any) int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int64
	if err := conn.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// Results for attempts a worker never held are refused at once, in memory:
// their payload is neither kept nor sent to the database. Hostile workers
// (paused, so that they are given nothing) send results of 60 MiB in a
// loop, for made-up attempt ids and for guessed ones (attempt ids are
// sequential) while an honest worker runs an honest workflow. The honest
// workflow ends with its output; every hostile result is refused with the
// fencing error; nothing of theirs is stored; and the server's memory stays
// bounded (issue 21, attack 3: 470 MiB to 4.2 GiB before).
func TestResultsForAttemptsNotHeldAreRefusedInMemory(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	echo := push(t, p.client, "echo")
	startWorker(t, "honest", 1, p.srv.url)
	const (
		hostile = 3
		rounds  = 12
		size    = 60 << 20
	)
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = byte(i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, hostile*rounds)
	for h := range hostile {
		fake := dialFakeHello(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1,
			Device: protocol.Device{Paused: true}})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				attempt := int64(1 + i) // guessed: the honest worker's are among the first
				if i%2 == 1 {
					attempt = 1_000_000_000 + int64(h*rounds+i) // made up
				}
				fake.send(t, &protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
					Attempt: attempt, Outputs: []protocol.Blob{{Name: "stdout", Data: payload}},
					Log: protocol.Blob{Data: []byte("hostile\n")}, DurationMS: 1}}})
				ack := fake.ack(t, attempt, protocol.AckResult, 60*time.Second)
				want := fmt.Sprintf("refused: this connection does not hold attempt %d", attempt)
				if ack.OK || ack.Retry || ack.Error != want {
					errs <- fmt.Errorf("hostile result for attempt %d: ack %+v, want refused with %q", attempt, ack, want)
				}
			}
		}()
	}

	// Meanwhile an honest workflow runs, to its right output.
	var ids []string
	for i := range 3 {
		in := fmt.Sprintf("honest %d\n", i)
		id := submit(t, p.client, map[string]any{"name": "honest", "priority": "interactive", "tasks": []task{
			{"name": "t", "module": echo, "stdin": map[string]any{"data": in}}}})
		st := wait(t, p.client, id, 120*time.Second)
		if st.State != client.WorkflowDone {
			t.Fatalf("honest workflow %d ended %s: %+v", i, st.State, st.Tasks)
		}
		if got := output(t, p.client, id, "t", "stdout"); got != in {
			t.Fatalf("honest workflow %d: stdout %q, want %q", i, got, in)
		}
		ids = append(ids, id)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Nothing of the hostile results was stored: the only outputs are the
	// honest ones, every attempt succeeded once, on the honest worker.
	if n := queryInt(t, p.db, `SELECT count(DISTINCT task_id) FROM task_outputs`); n != int64(len(ids)) {
		t.Errorf("outputs of %d tasks stored, want %d (the honest ones)", n, len(ids))
	}
	if n := queryInt(t, p.db, `SELECT coalesce(max(length(data)), 0) FROM task_outputs`); n > 100 {
		t.Errorf("a task output of %d bytes was stored", n)
	}
	if n := queryInt(t, p.db, `SELECT count(*) FROM attempts WHERE state <> 'succeeded'`); n != 0 {
		t.Errorf("%d attempts did not succeed", n)
	}
	if n := queryInt(t, p.db, `SELECT count(DISTINCT worker_id) FROM attempts`); n != 1 {
		t.Errorf("attempts ran on %d workers, want 1 (the honest one)", n)
	}
	for _, id := range ids {
		if as := attempts(t, p.client, id, "t"); len(as) != 1 || as[0].State != "succeeded" {
			t.Errorf("workflow %s: attempts %+v, want one succeeded", id, as)
		}
	}

	peak, now := peakRSS(t, p.srv.cmd.Process.Pid)
	t.Logf("server memory after %d hostile results of %d MiB: peak %d MiB, now %d MiB",
		hostile*rounds, size>>20, peak>>20, now>>20)
	if peak > 300<<20 {
		t.Errorf("the server's peak memory was %d MiB, want under 300 MiB", peak>>20)
	}
}

// A flood of hellos with huge device strings neither grows the database
// nor the server's memory: a hello over 64 KiB is refused with an error
// frame saying so, and strings in one that fits are cut to their bounds,
// enumerated values to their allowed ones; so are a heartbeat's (issue 21,
// attack 5: +248 MB of workers table in 22 s before).
func TestHelloFloodIsBounded(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	tableSize := func() int64 {
		return queryInt(t, p.db, `SELECT pg_total_relation_size('workers')`)
	}
	before := tableSize()

	huge := strings.Repeat("Mozilla/5.0 ", 900_000/12) // 900 KB
	hello, err := json.Marshal(&protocol.Frame{Type: protocol.TypeHello, Hello: &protocol.Hello{
		Version: protocol.Version, Kind: protocol.KindBrowser, Slots: 1, Device: protocol.Device{UserAgent: huge}}})
	if err != nil {
		t.Fatal(err)
	}
	u := "ws://" + strings.TrimPrefix(p.srv.url, "http://") + "/ws/worker"
	const flood = 150
	var wg sync.WaitGroup
	errs := make(chan error, flood)
	sem := make(chan struct{}, 30)
	var keptOut atomic.Int64 // answered 429 before the upgrade
	for range flood {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			ws, resp, err := websocket.Dial(ctx, u, nil)
			if err != nil && resp != nil && resp.StatusCode == http.StatusTooManyRequests {
				keptOut.Add(1)
				return
			}
			if err != nil {
				errs <- err
				return
			}
			defer ws.CloseNow()
			// The server may answer before the whole hello is sent.
			go ws.Write(ctx, websocket.MessageText, hello)
			typ, data, err := ws.Read(ctx)
			if err != nil {
				errs <- fmt.Errorf("read the answer to a huge hello: %v", err)
				return
			}
			fr, err := protocol.Decode(data, typ == websocket.MessageBinary)
			if err != nil || fr.Type != protocol.TypeError || !strings.Contains(fr.Error.Message, "hello refused") {
				errs <- fmt.Errorf("a huge hello was answered with %s (%v), want an error saying it was refused", data, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 5 {
			t.Error(err)
		}
	}
	// After 20 refused hellos (and about one a second more), the address
	// is kept out before the upgrade.
	if k := keptOut.Load(); k == 0 || k > flood-20 {
		t.Errorf("%d of %d huge hellos answered 429 before the upgrade; want all but the first 20 or so", k, flood)
	}

	// A hello that fits, with strings over their bounds: kept, cut.
	long := strings.Repeat("x", 12_000) // four of them fit in the 64 KiB of a hello
	fake := dialFakeHello(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindBrowser, Slots: 1,
		Device: protocol.Device{UserAgent: long, Connection: long, PausedBecause: long, Charging: long, Online: "maybe",
			Visibility: "visible", Paused: true}})
	id := fake.welcome.WorkerID
	device := func() map[string]any {
		t.Helper()
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, p.db)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var d map[string]any
		if err := conn.QueryRow(ctx, `SELECT device FROM workers WHERE id = $1`, id).Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := device()
	if ua, _ := d["user_agent"].(string); len(ua) != 512 {
		t.Errorf("user agent of %d bytes stored, want it cut to 512", len(ua))
	}
	if c, _ := d["connection"].(string); len(c) > 32 {
		t.Errorf("connection of %d bytes stored", len(c))
	}
	if c, _ := d["paused_because"].(string); len(c) > 200 {
		t.Errorf("paused_because of %d bytes stored", len(c))
	}
	if d["charging"] != protocol.Unknown || d["online"] != protocol.Unknown || d["visibility"] != "visible" {
		t.Errorf("device enums stored as charging %.20q, online %q, visibility %q; want unknown, unknown, visible",
			d["charging"], d["online"], d["visibility"])
	}

	// A heartbeat's device is held to the same bounds.
	fake.send(t, &protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Device: &protocol.Device{
		UserAgent: strings.Repeat("y", 500_000), Charging: "yes", SaveData: strings.Repeat("z", 1000), Paused: true}}})
	eventually(t, 20*time.Second, "the heartbeat's device to be stored", func() bool {
		d = device()
		return d["charging"] == "yes"
	})
	if ua, _ := d["user_agent"].(string); ua != strings.Repeat("y", 512) {
		t.Errorf("heartbeat user agent of %d bytes stored, want it cut to 512", len(ua))
	}
	if d["save_data"] != protocol.Unknown {
		t.Errorf("heartbeat save_data stored as %.20q, want unknown", d["save_data"])
	}

	after := tableSize()
	peak, now := peakRSS(t, p.srv.cmd.Process.Pid)
	t.Logf("workers table %d kB before, %d kB after %d huge hellos; server memory peak %d MiB, now %d MiB",
		before>>10, after>>10, flood, peak>>10>>10, now>>20)
	if after-before > 1<<20 {
		t.Errorf("the workers table grew by %d kB, want under 1 MiB", (after-before)>>10)
	}
	if peak > 300<<20 {
		t.Errorf("the server's peak memory was %d MiB, want under 300 MiB", peak>>20)
	}
}

// A worker's outcomes waiting for their commit hold their payload within
// bounds: while commits stall (task_outputs locked), a worker that sends
// 16 results of 20 MiB for attempts it does hold has at most 96 MiB of
// them read; the server stops reading its socket until commits catch up,
// and its memory stays bounded. Once commits go on, the rest is read.
func TestPayloadInFlightIsBounded(t *testing.T) {
	t.Parallel()
	const (
		n    = 16
		size = 20 << 20
	)
	// Leases long enough to outlast the stall: the worker's heartbeats
	// wait behind its results meanwhile.
	p := newPlatform(t, "--lease", "30s")
	echo := push(t, p.client, "echo")
	fake := dialFakeHello(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: n})
	var tasks []task
	for i := range n {
		tasks = append(tasks, task{"name": fmt.Sprintf("t%d", i), "module": echo, "limits": map[string]any{"output_mib": 32}})
	}
	submit(t, p.client, workflow("big", tasks...))
	var held []int64
	for len(held) < n {
		for _, a := range fake.next(t, protocol.TypeAssign, 30*time.Second).Assign {
			held = append(held, a.Attempt)
		}
	}
	go func() { // renew them
		var running []protocol.Progress
		for _, a := range held {
			running = append(running, protocol.Progress{Attempt: a})
		}
		data, _, _ := protocol.Encode(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{Running: running}})
		for {
			select {
			case <-fake.ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if err := fake.ws.Write(fake.ctx, websocket.MessageText, data); err != nil {
				return
			}
		}
	}()
	tx := lockTable(t, p.db, "LOCK TABLE task_outputs IN EXCLUSIVE MODE")

	payload := make([]byte, size)
	var sent atomic.Int64
	done := make(chan error, 1)
	go func() {
		for _, a := range held {
			data, _, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeResult, Results: []protocol.Result{{
				Attempt: a, Outputs: []protocol.Blob{{Name: "stdout", Data: payload}}, DurationMS: 1}}})
			if err != nil {
				done <- err
				return
			}
			ctx, cancel := context.WithTimeout(fake.ctx, 120*time.Second)
			err = fake.ws.Write(ctx, websocket.MessageBinary, data)
			cancel()
			if err != nil {
				done <- err
				return
			}
			sent.Add(1)
		}
		done <- nil
	}()
	// Wait for the server to stop reading: nothing more sent for 2 s.
	last, since := int64(-1), time.Now()
	eventually(t, 60*time.Second, "the server to stop reading the worker's results", func() bool {
		if s := sent.Load(); s != last {
			last, since = s, time.Now()
		}
		return time.Since(since) > 2*time.Second
	})
	peak, now := peakRSS(t, p.srv.cmd.Process.Pid)
	t.Logf("commits stalled: %d of %d results of %d MiB sent; server memory peak %d MiB, now %d MiB",
		last, n, size>>20, peak>>20, now>>20)
	if last == n {
		t.Errorf("all %d results of %d MiB were read while commits stalled", n, size>>20)
	}
	if peak > 300<<20 {
		t.Errorf("the server's peak memory was %d MiB, want under 300 MiB", peak>>20)
	}

	if err := tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("sending the results once commits went on: %v", err)
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("only %d of %d results were read after commits went on", sent.Load(), n)
	}
	// Every result is committed.
	acked := map[int64]bool{}
	for len(acked) < n {
		for _, a := range fake.next(t, protocol.TypeAck, 60*time.Second).Acks {
			if a.Of == protocol.AckResult && !a.Retry {
				acked[a.Attempt] = a.OK
			}
		}
	}
	ok := 0
	for _, a := range held {
		if acked[a] {
			ok++
		}
	}
	if ok != n {
		t.Errorf("%d of %d results committed, want all", ok, n)
	}
}
