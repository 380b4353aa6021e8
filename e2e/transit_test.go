//go:build unix

package e2e

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cyclepool/cyclepool/client"
	"github.com/cyclepool/cyclepool/internal/protocol"
)

// tcpProxy forwards TCP connections to a server. swallow makes the
// connections open at the time drop what the server sends them; cut closes
// them. A socket that dies with an assignment in it, as a phone's does
// when it leaves a Wi-Fi network.
type tcpProxy struct {
	url       string
	mu        sync.Mutex
	conns     []*proxied
	swallowed atomic.Int64 // bytes from the server that were dropped
}

type proxied struct {
	worker, server net.Conn
	swallow        atomic.Bool
}

func newTCPProxy(t *testing.T, server string) *tcpProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &tcpProxy{url: "http://" + l.Addr().String()}
	target := strings.TrimPrefix(server, "http://")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			pc := &proxied{worker: c, server: s}
			p.mu.Lock()
			p.conns = append(p.conns, pc)
			p.mu.Unlock()
			go func() {
				io.Copy(s, c)
				s.Close()
			}()
			go func() {
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						if pc.swallow.Load() {
							p.swallowed.Add(int64(n))
						} else if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	t.Cleanup(p.cut)
	return p
}

// swallow drops from now on what the server sends on the connections open
// now.
func (p *tcpProxy) swallow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.swallow.Store(true)
	}
}

// cut closes every connection open now, on both sides.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.worker.Close()
		c.server.Close()
	}
	p.conns = nil
}

// An assignment that dies with the worker's socket never reached the
// worker: when the worker reconnects, its hello lists every attempt it
// holds and says so (running_complete), and the attempt it does not list
// ends charged to nobody once its lease lapses. The task loses nothing and
// runs again; the worker keeps its standing.
func TestAssignmentLostInTransitChargesNobody(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	noop := push(t, p.client, "noop")
	px := newTCPProxy(t, p.srv.url)
	w := startWorker(t, "worker", 1, px.url)
	px.swallow()
	id := submit(t, p.client, workflow("transit", task{"name": "n", "module": noop}))
	// The server wrote the assignment into the swallowed socket.
	eventually(t, 30*time.Second, "the assignment to be sent", func() bool {
		as, err := p.client.Attempts(ctx, id, "n")
		return err == nil && len(as) == 1 && as[0].State == "running" && px.swallowed.Load() > 0
	})
	px.cut()
	if st := wait(t, p.client, id, 60*time.Second); st.State != client.WorkflowDone {
		t.Fatalf("workflow ended %s: %+v\n%s", st.State, st.Tasks, w.out)
	}
	as := attempts(t, p.client, id, "n")
	if len(as) != 2 || as[0].State != "lost" || !strings.Contains(as[0].Reason, "never reached") || as[1].State != "succeeded" {
		t.Errorf("attempts = %+v, want the first lost as never reached, the second succeeded", as)
	}
	wl, err := p.client.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(wl.Workers) != 1 || wl.Workers[0].TasksLost != 0 || wl.Workers[0].Attempts != 2 {
		t.Errorf("workers = %+v, want the one worker, with 2 attempts and no loss charged", wl.Workers)
	}
}

// A module the worker cannot fetch because of the server's trouble (here a
// proxy answering 503) charges its task nothing: the worker hands the
// attempt back, and the task runs once the module can be had, though it
// may be attempted only once. The worker tries a few times first. Before,
// such a failure was the module's, and used up the task's attempts.
func TestModuleUnavailableChargesNobody(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	echo := push(t, p.client, "echo")
	proxy := newCountingProxy(t, p.srv.url)
	proxy.refuse("/modules/")
	startWorker(t, "worker", 1, proxy.url)
	id := submit(t, p.client, workflow("unavailable", task{"name": "e", "module": echo, "max_attempts": 1,
		"stdin": map[string]any{"data": "x\n"}}))
	handedBackForItsModule(t, p, proxy, id)
}

// handedBackForItsModule waits until the first attempt of task "e" of
// workflow id was handed back (reason worker) for its module's 503, after
// three tries, then lets the module through the proxy and checks that the
// task ends done with its one attempt.
func handedBackForItsModule(t *testing.T, p *platform, proxy *countingProxy, id string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 60*time.Second, "an attempt handed back for want of its module", func() bool {
		as, err := p.client.Attempts(ctx, id, "e")
		return err == nil && len(as) >= 1 && as[0].State != "running" && as[0].State != ""
	})
	as := attempts(t, p.client, id, "e")
	if !strings.HasPrefix(as[0].Reason, "worker: ") || !strings.Contains(as[0].Reason, "503") {
		t.Errorf("first attempt ended %s: %q, want handed back (worker) for the module's 503", as[0].State, as[0].Reason)
	}
	if n := proxy.count("/modules/"); n < 3 {
		t.Errorf("the module was asked for %d times before the attempt was handed back, want 3", n)
	}
	proxy.refuse("")
	st := wait(t, p.client, id, 60*time.Second)
	if st.State != client.WorkflowDone || st.Task("e").Attempts != 1 {
		t.Fatalf("workflow %s, task %+v: want done, with its one attempt", st.State, st.Task("e"))
	}
}

// A worker that says the process running an attempt crashed (reason
// crashed) costs the task one of its losses (max_lost), not an attempt, and
// itself nothing; the task runs again.
func TestCrashedAttemptCountsALoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPlatform(t)
	fake := dialFake(t, p.srv.url)
	echo := push(t, p.client, "echo")
	id := submit(t, p.client, workflow("crashed", task{"name": "e", "module": echo, "max_attempts": 1,
		"stdin": map[string]any{"data": "x\n"}}))
	a := fake.next(t, protocol.TypeAssign, 15*time.Second).Assign[0].Attempt
	fake.send(t, &protocol.Frame{Type: protocol.TypeFail, Fails: []protocol.Fail{{Attempt: a, Reason: protocol.ReasonCrashed,
		Message: "the slot process running the attempt died: signal: killed"}}})
	if ack := fake.ack(t, a, protocol.AckFail, 10*time.Second); !ack.OK {
		t.Fatalf("the crash report was not accepted: %+v", ack)
	}
	st, err := p.client.Status(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// Its one attempt was not used up (or an operator's worker's failure
	// would have failed it): it is queued again, or running again.
	if tk := st.Task("e"); tk.State != client.TaskReady && tk.State != client.TaskRunning {
		t.Errorf("task after the crash: %+v, want queued again", tk)
	}
	as := attempts(t, p.client, id, "e")
	if len(as) < 1 || !strings.HasPrefix(as[0].Reason, "crashed: ") {
		t.Errorf("attempts %+v, want the first ended crashed", as)
	}
	wl, err := p.client.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range wl.Workers {
		if w.ID == fake.welcome.WorkerID && w.TasksLost != 0 {
			t.Errorf("the worker that said so was charged %d losses", w.TasksLost)
		}
	}
}
