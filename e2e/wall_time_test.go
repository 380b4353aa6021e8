//go:build unix

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// A volunteer that takes a task and heartbeats it for ever, never
// reporting, holds it only until the task's wall time and the server's
// grace have passed on the server's clock (docs/SECURITY.md): the server
// then takes it back, charged to that volunteer (a loss in its standing),
// answers its heartbeats for it with cancel, and an honest worker does the
// task. The hostile worker is written by hand, as an attacker would: its
// heartbeats list the attempt every 300 ms, as running, half done.
func TestHostileWorkerCannotHoldAnAttemptPastItsWallTime(t *testing.T) {
	t.Parallel()
	// Leases of 2 s (the harness's) and a grace of 1 s: a 2 s task is
	// taken back from a worker that still holds it 7 s after its first
	// heartbeat as running (its wall time, its outputs' upload, the grace).
	p := newPlatform(t, "--wall-grace", "1s")
	echo := push(t, p.client, "echo")

	hostile := dialFakeVolunteer(t, p.srv.url, &protocol.Hello{Version: protocol.Version, Kind: protocol.KindHeadless, Slots: 1})
	// An output limit of 1 MiB: its upload adds 4 s at the allowance's rate.
	id := submit(t, p.client, workflow("held", task{"name": "t", "module": echo, "timeout": "2s", "max_attempts": 2,
		"stdin": map[string]any{"data": "done honestly\n"}, "limits": map[string]any{"output_mib": 1}}))
	as := hostile.next(t, protocol.TypeAssign, 30*time.Second).Assign
	if len(as) != 1 || as[0].Task != id+"/t" {
		t.Fatalf("the hostile worker was assigned %+v, want the one attempt of %s/t", as, id)
	}
	attempt := as[0].Attempt

	// Heartbeats for ever (until the test ends), listing the attempt; the
	// cancel the server sends for it is read below.
	data, bin, err := protocol.Encode(&protocol.Frame{Type: protocol.TypeHeartbeat, Heartbeat: &protocol.Heartbeat{
		Running: []protocol.Progress{{Attempt: attempt, Fraction: 0.5}}}})
	if err != nil {
		t.Fatal(err)
	}
	typ := websocket.MessageText
	if bin {
		typ = websocket.MessageBinary
	}
	go func() {
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-hostile.ctx.Done():
				return
			case <-tick.C:
				if err := hostile.ws.Write(hostile.ctx, typ, data); err != nil {
					return
				}
			}
		}
	}()

	// An honest worker is there all along, idle while the hostile one
	// holds the only task.
	startWorker(t, "honest", 1, p.srv.url)

	// The server cancels the attempt at the hostile worker: its
	// heartbeats no longer hold it.
	cancelled := false
	for give := time.Now().Add(2 * time.Minute); !cancelled && time.Now().Before(give); {
		fr := hostile.next(t, protocol.TypeCancel, time.Until(give))
		for _, a := range fr.Cancel.Attempts {
			cancelled = cancelled || a == attempt
		}
	}
	if !cancelled {
		t.Fatalf("attempt %d was never cancelled at the hostile worker", attempt)
	}

	st := wait(t, p.client, id, 2*time.Minute)
	if st.State != "done" {
		t.Fatalf("workflow %s ended %s, want done", id, st.State)
	}
	if got := output(t, p.client, id, "t", "stdout"); got != "done honestly\n" {
		t.Errorf("stdout %q, want the honest worker's", got)
	}
	var hostileAttempt, honestAttempt bool
	for _, a := range attempts(t, p.client, id, "t") {
		switch {
		case a.ID == attempt:
			hostileAttempt = true
			if a.State != "lost" || !strings.Contains(a.Reason, "vanished while running") {
				t.Errorf("the hostile worker's attempt ended %s (%q), want lost as vanished while running", a.State, a.Reason)
			}
		case a.State == "succeeded":
			honestAttempt = a.Worker != hostile.welcome.WorkerID
		}
	}
	if !hostileAttempt || !honestAttempt {
		t.Errorf("attempts of the task: the hostile worker's %v, a success of another worker %v; want both", hostileAttempt, honestAttempt)
	}
	if n := queryInt(t, p.db, `SELECT tasks_lost FROM workers WHERE id = $1`, hostile.welcome.WorkerID); n != 1 {
		t.Errorf("the hostile worker's standing counts %d losses, want 1", n)
	}
}
