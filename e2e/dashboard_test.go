//go:build unix

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/cyclepool/cyclepool/internal/taskbuild"
)

// The owners' dashboard end to end, in Chromium against a real server,
// PostgreSQL and headless worker: sign in, upload modules through the page,
// draw a 5,000-task workflow quickly and cancel it, check and submit a
// workflow through the page and watch its DAG turn done without a reload,
// download an output and compare it with the API's, see an invalid file's
// error next to its task, and keep a second owner out.
func TestDashboard(t *testing.T) {
	t.Parallel()
	p := newPlatform(t)
	base := p.srv.url
	out, err := runCLI(t, p.db, "token", "create", "second-owner")
	if err != nil {
		t.Fatalf("token create: %v: %s", err, out)
	}
	otherToken := strings.TrimSpace(out)

	// Plain HTTP: the sign-in page sets a CSP, pages need a session.
	res, _ := dashRequest(t, http.MethodGet, base+"/app/", nil, nil, nil)
	if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/app/login") {
		t.Errorf("/app/ without a session: %s to %q, want a redirect to the sign-in page", res.Status, res.Header.Get("Location"))
	}
	res, _ = dashRequest(t, http.MethodGet, base+"/app/login", nil, nil, nil)
	if c := res.Header.Get("Content-Security-Policy"); !strings.Contains(c, "script-src 'self'") || strings.Contains(c, "unsafe-inline") {
		t.Errorf("sign-in page CSP = %q", c)
	}

	b := newBrowser(t, 1280, 900, "")
	b.do(chromedp.Navigate(base+"/app/login"), chromedp.SetValue(chromedp.ID("token"), "cp_not-a-token"), chromedp.Click(chromedp.ID("signin")))
	b.waitJS(10*time.Second, "the refusal of a wrong token", `document.getElementById("login-error")`)
	b.signIn(base, p.srv.token)

	// Modules: upload two through the file picker, and one that is not
	// WebAssembly.
	var ids []string
	for _, name := range []string{"primes", "echo"} {
		path := taskbuild.Build(t, name)
		b.do(chromedp.Navigate(base+"/app/modules"), chromedp.SetUploadFiles(chromedp.ID("module"), []string{path}), chromedp.Click(chromedp.ID("upload")))
		b.waitJS(20*time.Second, "the upload of "+name, `document.getElementById("upload-ok") || document.getElementById("upload-error")`)
		if e := b.text("#upload-error"); e != "" {
			t.Fatalf("upload %s: %s", name, e)
		}
		sum := sha256.Sum256(taskbuild.Bytes(t, name))
		id := "sha256:" + hex.EncodeToString(sum[:])
		if got := b.text("#upload-ok"); !strings.Contains(got, id) {
			t.Errorf("upload %s says %q, want its id %s", name, got, id)
		}
		ids = append(ids, id)
	}
	primes, echo := ids[0], ids[1]
	bad := filepath.Join(t.TempDir(), "notes.wasm")
	if err := os.WriteFile(bad, []byte("this is not WebAssembly"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.SetUploadFiles(chromedp.ID("module"), []string{bad}), chromedp.Click(chromedp.ID("upload")))
	b.waitJS(10*time.Second, "the refusal of a bad module", `document.getElementById("upload-error")`)
	t.Logf("bad module: %s", b.text("#upload-error"))
	if n := b.text("#modules"); !strings.Contains(n, "wasi_snapshot_preview1") {
		t.Errorf("modules table lists no imports: %q", n)
	}
	b.screenshot("dash-modules", 360, 800)

	// A 5,000-task workflow (grouped in the graph) renders quickly; the page
	// cancels it.
	var big []task
	for i := range 4900 {
		big = append(big, task{"name": fmt.Sprintf("part-%d", i), "module": echo})
	}
	for i := range 100 {
		in := map[string]any{}
		for j := range 49 {
			in[fmt.Sprintf("p%d", j)] = map[string]any{"from": fmt.Sprintf("part-%d", i*49+j)}
		}
		big = append(big, task{"name": fmt.Sprintf("merge-%d", i), "module": echo, "inputs": in})
	}
	bigID := submit(t, p.client, workflow("dash-big", big...))
	started := time.Now()
	b.do(chromedp.Navigate(base + "/app/workflows/" + bigID))
	b.waitJS(10*time.Second, "the big workflow's page", `window.cyclepoolApp && document.querySelectorAll("#tasks tbody tr").length > 0`)
	took := time.Since(started)
	var nav map[string]float64
	b.eval(`(({requestStart, responseStart, responseEnd, domInteractive, domContentLoadedEventEnd, loadEventEnd}) => ({requestStart, responseStart, responseEnd, domInteractive, domContentLoadedEventEnd, loadEventEnd}))(performance.getEntriesByType("navigation")[0])`, &nav)
	var nodes int
	b.eval(`document.querySelectorAll("#dag .node").length`, &nodes)
	// The time is a figure, not a bound (a busy machine can break any):
	// what keeps the page fast is asserted instead, a graph of groups.
	t.Logf("5,000-task workflow page: %v (navigation timing %v), %d graph nodes", took, nav, nodes)
	if nodes == 0 || nodes > 300 {
		t.Errorf("the graph of 5,000 tasks has %d nodes, want groups", nodes)
	}
	var shown int
	b.eval(`JSON.parse(document.getElementById("workflow").dataset.tasks).length`, &shown)
	if shown != 5000 {
		t.Errorf("the page's script knows %d tasks, want 5000", shown)
	}
	b.viewShot("dash-big", 1280, 900)
	b.do(chromedp.Click(chromedp.ID("cancel")))
	b.waitJS(15*time.Second, "the big workflow cancelled", `document.querySelector("#wf-state .badge").textContent === "cancelled"`)
	// Once ended, it can be deleted from its page (the page asks first).
	b.waitJS(15*time.Second, "the delete button shown", `!document.getElementById("delete-form").classList.contains("hidden")`)
	b.eval(`window.confirm = () => true`, nil)
	b.do(chromedp.Click(chromedp.ID("delete")))
	b.waitJS(30*time.Second, "the list of workflows after the delete", `location.pathname === "/app/"`)
	if _, err := p.client.Status(context.Background(), bigID); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("the deleted workflow's status: %v, want 404", err)
	}

	// Check and submit a workflow through the page.
	wf, _ := json.MarshalIndent(workflow("dash-primes",
		task{"name": "count-0", "module": primes, "args": []string{"0", "1500000"}, "checkpoint_interval": "1s"},
		task{"name": "count-1", "module": primes, "args": []string{"1500000", "3000000"}, "checkpoint_interval": "1s"},
		task{"name": "sum", "module": echo, "inputs": map[string]any{"a": map[string]any{"from": "count-0"}, "b": map[string]any{"from": "count-1"}}},
	), "", "  ")
	// A workflow file picked on the submit page fills the text area.
	wfPath := filepath.Join(t.TempDir(), "dash-primes.json")
	if err := os.WriteFile(wfPath, wf, 0o644); err != nil {
		t.Fatal(err)
	}
	b.do(chromedp.Navigate(base+"/app/submit"), chromedp.SetUploadFiles(chromedp.ID("wf-file"), []string{wfPath}))
	b.waitJS(10*time.Second, "the picked file in the text area", `document.getElementById("workflow").value.includes("dash-primes")`)
	b.do(chromedp.SetValue(chromedp.ID("workflow"), string(wf)), chromedp.Click(chromedp.ID("check")))
	b.waitJS(10*time.Second, "the check to pass", `document.getElementById("check-ok") || document.getElementById("submit-error")`)
	if e := b.text("#submit-error"); e != "" {
		t.Fatalf("check refused a good workflow: %s", e)
	}
	b.do(chromedp.Click(chromedp.ID("submit")))
	b.waitJS(10*time.Second, "the workflow's page", `location.pathname.startsWith("/app/workflows/") && window.cyclepoolApp`)
	id := strings.TrimPrefix(b.path(), "/app/workflows/")
	b.eval(`window.noReload = "yes"; document.querySelectorAll("#dag .node.st-done").length`, &nodes)
	if nodes != 0 {
		t.Errorf("%d tasks done before any worker ran", nodes)
	}
	startWorker(t, "headless", 2, base)
	b.waitJS(60*time.Second, "every DAG node done without a reload",
		`window.noReload === "yes" && document.querySelectorAll("#dag .node").length === 3 && document.querySelectorAll("#dag .node.st-done").length === 3`)
	var events int
	b.eval(`window.cyclepoolApp.events`, &events)
	if events < 3 {
		t.Errorf("the page saw %d events, want live task events", events)
	}
	b.waitJS(10*time.Second, "the workflow's end and outputs on the page",
		`window.cyclepoolApp.state === "done" && document.querySelector('tr[data-task="sum"] a.output[data-output="stdout"]')`)
	b.screenshot("dash-workflow", 1280, 900)
	b.screenshot("dash-workflow", 360, 800)

	// The download link gives the API's bytes.
	var downloaded string
	b.eval(`fetch(document.querySelector('tr[data-task="sum"] a.output[data-output="stdout"]').href).then(r => r.text())`, &downloaded)
	if want := output(t, p.client, id, "sum", "stdout"); downloaded != want || want == "" {
		t.Errorf("downloaded %q, the API gives %q", downloaded, want)
	}

	// Per-task cancel from the page. A long task that checkpoints shows the
	// worker running it and the age of its latest checkpoint; its Cancel
	// button stops it on the worker, the task that needs its output ends
	// upstream_failed, and the rest runs on to a failed workflow.
	counter, noop := push(t, p.client, "counter"), push(t, p.client, "noop")
	cid := submit(t, p.client, workflow("dash-cancel-task",
		task{"name": "long", "module": counter, "args": []string{"600", "100"}, "checkpoint_interval": "1s"},
		task{"name": "after", "module": noop, "inputs": map[string]any{"x": map[string]any{"from": "long"}}},
		task{"name": "side", "module": noop},
	))
	b.do(chromedp.Navigate(base + "/app/workflows/" + cid))
	b.waitJS(45*time.Second, "the long task running on a worker, with a checkpoint", `(() => {
		const r = document.querySelector('tr[data-task="long"]');
		return r && r.dataset.state === "running" && r.querySelector(".c-worker code").textContent !== "—" &&
			Number(r.querySelector(".c-ckpt").textContent) > 0 && r.querySelector(".c-ckpt-age").textContent.endsWith("ago");
	})()`)
	st, err := p.client.Status(context.Background(), cid)
	if err != nil {
		t.Fatal(err)
	}
	if w := b.text(`tr[data-task="long"] .c-worker code`); st.Tasks[0].Worker == "" || w != st.Tasks[0].Worker[:8]+"…" {
		t.Errorf("the page shows worker %q for the long task, the API %q", w, st.Tasks[0].Worker)
	}
	b.screenshot("dash-running", 1280, 900)
	b.screenshot("dash-running", 360, 800)
	b.do(chromedp.Click(chromedp.CSS(`tr[data-task="long"] .task-cancel button`)))
	b.waitJS(15*time.Second, "the long task cancelled and its dependent failed on the page", `location.pathname.endsWith("`+cid+`") &&
		document.querySelector('tr[data-task="long"]').dataset.state === "cancelled" &&
		document.querySelector('tr[data-task="after"]').dataset.state === "upstream_failed" &&
		!document.querySelector('tr[data-task="long"] .task-cancel')`)
	if done := wait(t, p.client, cid, 30*time.Second); done.State != "failed" || done.Tasks[2].State != "done" {
		t.Errorf("after cancelling one task the workflow ended %s with side %s, want failed and done", done.State, done.Tasks[2].State)
	}
	if as, err := p.client.Attempts(context.Background(), cid, "long"); err != nil || len(as) != 1 || as[0].State != "cancelled" {
		t.Errorf("attempts of the cancelled task: %+v, %v", as, err)
	}
	// A finished task cannot be cancelled, by the client or the CLI.
	if _, err := p.client.CancelTask(context.Background(), cid, "side"); err == nil || !strings.Contains(err.Error(), "already done") {
		t.Errorf("cancelling a done task: %v, want a refusal", err)
	}
	if out, err := runCLI(t, p.db, "cancel", cid, "--task", "side", "--server", base, "--token", p.srv.token); err == nil {
		t.Errorf("cyclepool cancel --task of a done task succeeded: %s", out)
	}
	if out, err := runCLI(t, p.db, "cancel", cid, "--task", "nope", "--server", base, "--token", p.srv.token); err == nil {
		t.Errorf("cyclepool cancel --task of an unknown task succeeded: %s", out)
	}

	// An invalid workflow: the error shows next to the task it names.
	badWF, _ := json.MarshalIndent(workflow("dash-bad",
		task{"name": "count-0", "module": primes, "args": []string{"0", "10"}},
		task{"name": "sum", "module": echo, "inputs": map[string]any{"a": map[string]any{"from": "count-9"}}},
	), "", "  ")
	b.do(chromedp.Navigate(base+"/app/submit"), chromedp.SetValue(chromedp.ID("workflow"), string(badWF)), chromedp.Click(chromedp.ID("submit")))
	b.waitJS(10*time.Second, "the refusal next to the task", `document.querySelector('li[data-task="sum"] .task-error')`)
	if e := b.text(`li[data-task="sum"] .task-error`); !strings.Contains(e, "count-9") || !strings.Contains(e, "inputs.a") {
		t.Errorf("error next to task sum = %q, want it to name inputs.a and count-9", e)
	}
	if e := b.text(`li[data-task="count-0"] .task-error`); e != "" {
		t.Errorf("error shown next to the wrong task: %q", e)
	}
	b.screenshot("dash-invalid", 360, 800)
	b.screenshot("dash-invalid", 1280, 900)

	// History (search) and volunteers.
	b.do(chromedp.Navigate(base + "/app/history?q=primes"))
	if h := b.text("#history tbody"); !strings.Contains(h, "dash-primes") || strings.Contains(h, "dash-big") {
		t.Errorf("history for q=primes: %q", h)
	}
	// Volunteers: the headless worker with its stability class, plots of
	// the last hour drawn from the tasks done, refreshed without a reload.
	b.do(chromedp.Navigate(base + "/app/volunteers"))
	if v := b.text("#workers tbody"); !strings.Contains(v, "headless") {
		t.Errorf("volunteers page: %q", v)
	}
	if c := b.text("#workers tbody .c-stability .stab"); !strings.Contains(c, "stable") {
		t.Errorf("stability class of the headless worker: %q, want its class", c)
	}
	var plotted bool
	b.eval(`document.querySelector("#plot-done path.bars").getAttribute("d") !== "" && document.querySelector("#plot-connected path.line").getAttribute("d") !== ""`, &plotted)
	if !plotted {
		t.Errorf("the volunteers page's plots are empty")
	}
	if f := b.text("#v-variance"); f == "" {
		t.Errorf("no fairness on the volunteers page")
	}
	b.eval(`window.noReload = "yes"`, nil)
	b.waitJS(20*time.Second, "the volunteers page to refresh itself", `window.noReload === "yes" && window.cyclepoolVolunteers.polls >= 1 &&
		document.querySelector("#workers tbody .c-stability .stab")`)
	b.screenshot("dash-volunteers", 1280, 900)
	b.screenshot("dash-volunteers", 360, 800)
	b.do(chromedp.Navigate(base + "/app/modules"))
	b.screenshot("dash-modules", 360, 800)
	b.do(chromedp.Navigate(base + "/app/history"))
	b.screenshot("dash-history", 360, 800)

	// Forms and API writes need the CSRF token of the session.
	cookie, csrf := dashSession(t, base, p.srv.token)
	res, _ = dashRequest(t, http.MethodPost, base+"/app/workflows/"+id+"/cancel", cookie, url.Values{"csrf": {"forged"}}, nil)
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("cancel with a forged CSRF token: %s, want 403", res.Status)
	}
	res, _ = dashRequest(t, http.MethodPost, base+"/app/api/v1/workflows/"+id+"/cancel", cookie, nil, nil)
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("API write through the dashboard without X-CSRF-Token: %s, want 403", res.Status)
	}
	res, _ = dashRequest(t, http.MethodPost, base+"/app/workflows/"+id+"/cancel", cookie, url.Values{"csrf": {csrf}}, nil)
	if res.StatusCode != http.StatusSeeOther {
		t.Errorf("cancel with the session's CSRF token: %s, want 303", res.Status)
	}
	if c := res.Header.Get("Content-Security-Policy"); c == "" {
		t.Errorf("no CSP on a dashboard response")
	}
	taskCancel := base + "/app/workflows/" + cid + "/tasks/side/cancel"
	if res, _ = dashRequest(t, http.MethodPost, taskCancel, cookie, url.Values{"csrf": {"forged"}}, nil); res.StatusCode != http.StatusForbidden {
		t.Errorf("task cancel with a forged CSRF token: %s, want 403", res.Status)
	}
	if res, body := dashRequest(t, http.MethodPost, taskCancel, cookie, url.Values{"csrf": {csrf}}, nil); res.StatusCode != http.StatusConflict || !strings.Contains(body, "already done") {
		t.Errorf("task cancel of a done task from the page: %s, want 409 saying it is done", res.Status)
	}

	// A second owner cannot see the first owner's workflow by URL.
	b2 := newBrowser(t, 1280, 900, "")
	b2.signIn(base, otherToken)
	b2.do(chromedp.Navigate(base + "/app/workflows/" + id))
	if nf := b2.text("#not-found"); nf == "" || strings.Contains(b2.text("main"), "dash-primes") {
		t.Errorf("second owner sees the first owner's workflow page: %q", b2.text("main"))
	}
	var status int
	b2.eval(`fetch("/app/api/v1/workflows/`+id+`").then(r => r.status)`, &status)
	if status != http.StatusNotFound {
		t.Errorf("second owner's API read of the workflow: %d, want 404", status)
	}
	b2.do(chromedp.Navigate(base + "/app/history"))
	if h := b2.text("main"); strings.Contains(h, "dash-primes") {
		t.Errorf("second owner's history lists the first owner's workflow")
	}

	// Sign out: the pages need signing in again.
	b.do(chromedp.Navigate(base+"/app/"), chromedp.Click(chromedp.CSS("form.signout button")))
	b.waitJS(10*time.Second, "the sign-in page", `location.pathname === "/app/login"`)
	b.do(chromedp.Navigate(base + "/app/history"))
	if p := b.path(); p != "/app/login" {
		t.Errorf("after signing out, /app/history shows %s", p)
	}
}
