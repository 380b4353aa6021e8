package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/workflow"
)

// home lists the running workflows and the latest finished ones.
func (h *handler) home(p *pageCtx) {
	ctx := p.r.Context()
	running, nRunning, err := h.b.List(ctx, p.owner, store.ListOptions{State: store.StateRunning, Limit: 100})
	if err != nil {
		h.serverError(p, "list workflows", err)
		return
	}
	recent, _, err := h.b.List(ctx, p.owner, store.ListOptions{Limit: 10})
	if err != nil {
		h.serverError(p, "list workflows", err)
		return
	}
	h.render(p, http.StatusOK, HomePage(h.layout(p, "home"), rows(running), nRunning, rows(recent)))
}

// WorkflowRow is a workflow in a list.
type WorkflowRow struct {
	ID, Name, Priority, State, Created, Duration string
	Tasks                                        int
}

func rows(ws []api.Status) []WorkflowRow {
	out := make([]WorkflowRow, len(ws))
	for i, w := range ws {
		end := time.Now()
		if w.FinishedAt != nil {
			end = *w.FinishedAt
		}
		out[i] = WorkflowRow{ID: w.ID, Name: w.Name, Priority: w.Priority, State: w.State, Tasks: w.TaskCount,
			Created: w.CreatedAt.Local().Format("2006-01-02 15:04:05"), Duration: dur(end.Sub(w.CreatedAt))}
	}
	return out
}

// WorkflowData is the workflow page.
type WorkflowData struct {
	ID, Name, Priority, State     string
	Created                       string
	CreatedUnixMS, FinishedUnixMS int64
	Makespan                      string
	// Notice is the server's word on what holds the workflow up (its
	// database cannot store results, say); empty when all is well.
	Notice string
	Totals Totals
	Tasks  []TaskRow // the rows shown
	Graph  Graph
	// TasksJSON is every task as [name, state, node], for the page's
	// script to keep the totals and the graph right (the table shows at
	// most taskPageSize rows).
	TasksJSON string
	// The table's filter and page.
	Filter, Shown    string
	PrevURL, NextURL string
}

const taskPageSize = 200

// maxPage bounds a page number from a URL, so that the page times its
// size (an offset) cannot overflow: past it, every page is empty anyway.
const maxPage = 1 << 31

// Totals counts tasks by what an owner cares about. Disputed counts the
// done tasks whose result was accepted alone from a worker that later lost
// a quorum, once the workflow had finished (docs/WORKFLOW.md).
type Totals struct{ Total, Done, Running, Waiting, Failed, Cancelled, Disputed int }

// TaskRow is one task in the workflow's table.
type TaskRow struct {
	api.Task
	Node                        int
	RunTime                     string
	StartedUnixMS, EndedUnixMS  int64
	LogURL                      string
	OutputURLs                  []OutputLink
	AttemptsText, ProgressClass string
	// WorkerShort is the start of the running worker's id ("—": none).
	WorkerShort string
	// CheckpointAge is how long ago the latest checkpoint was saved ("—":
	// none); CheckpointUnixMS the same as a time, for the page's script.
	CheckpointAge    string
	CheckpointUnixMS int64
	// CancelURL is the form that cancels the task, while it can be.
	CancelURL string
}

// OutputLink is a download link of one output, and its preview page.
type OutputLink struct{ Name, URL, Size, Preview string }

func (h *handler) workflowPage(p *pageCtx) {
	ctx := p.r.Context()
	id := p.r.PathValue("id")
	st, err := h.b.Status(ctx, p.owner, id)
	if err != nil {
		h.notFound(p, "workflow", err)
		return
	}
	edges, err := h.b.Edges(ctx, p.owner, id)
	if err != nil {
		h.serverError(p, "read the workflow's graph", err)
		return
	}
	d := WorkflowData{ID: st.ID, Name: st.Name, Priority: st.Priority, State: st.State, Notice: st.Notice,
		Created: st.CreatedAt.Local().Format("2006-01-02 15:04:05"), CreatedUnixMS: st.CreatedAt.UnixMilli()}
	end := time.Now()
	if st.FinishedAt != nil {
		end = *st.FinishedAt
		d.FinishedUnixMS = st.FinishedAt.UnixMilli()
	}
	d.Makespan = dur(end.Sub(st.CreatedAt))
	names, states := make([]string, len(st.Tasks)), make([]string, len(st.Tasks))
	for i, t := range st.Tasks {
		names[i], states[i] = t.Name, t.State
	}
	var unitOf []int
	d.Graph, unitOf = layout(names, states, edges)
	base := "/app/api/v1/workflows/" + url.PathEscape(st.ID) + "/tasks/"
	q := p.r.URL.Query()
	d.Filter = q.Get("tasks")
	switch d.Filter {
	case "", "running", "waiting", "done", "failed", "cancelled":
	default:
		d.Filter = ""
	}
	page, _ := strconv.Atoi(q.Get("page"))
	page = min(max(page, 1), maxPage)
	all := make([][3]any, len(st.Tasks))
	matched := 0
	for i, t := range st.Tasks {
		all[i] = [3]any{t.Name, t.State, unitOf[i]}
		group := t.State
		switch t.State {
		case "blocked", "ready":
			group = "waiting"
		case "upstream_failed":
			group = "failed"
		}
		d.Totals.Total++
		if t.Disputed {
			d.Totals.Disputed++
		}
		switch group {
		case "done":
			d.Totals.Done++
		case "running":
			d.Totals.Running++
		case "waiting":
			d.Totals.Waiting++
		case "failed":
			d.Totals.Failed++
		case "cancelled":
			d.Totals.Cancelled++
		}
		if d.Filter != "" && group != d.Filter {
			continue
		}
		matched++
		if matched <= (page-1)*taskPageSize || matched > page*taskPageSize {
			continue
		}
		r := TaskRow{Task: t, Node: unitOf[i], ProgressClass: fmt.Sprintf("p-%d", int(t.Progress*100+0.5)),
			AttemptsText: fmt.Sprintf("%d / %d", t.Attempts, t.MaxAttempts), WorkerShort: shortID(t.Worker), CheckpointAge: "—"}
		if t.CheckpointAt != nil {
			r.CheckpointUnixMS = t.CheckpointAt.UnixMilli()
			r.CheckpointAge = dur(time.Since(*t.CheckpointAt)) + " ago"
		}
		switch t.State {
		case store.StateBlocked, store.StateReady, store.StateRunning:
			r.CancelURL = "/app/workflows/" + url.PathEscape(st.ID) + "/tasks/" + url.PathEscape(t.Name) + "/cancel"
		}
		if t.StartedAt != nil {
			r.StartedUnixMS = t.StartedAt.UnixMilli()
			e := time.Now()
			if t.FinishedAt != nil {
				e = *t.FinishedAt
				r.EndedUnixMS = t.FinishedAt.UnixMilli()
			}
			r.RunTime = dur(e.Sub(*t.StartedAt))
		}
		tb := base + url.PathEscape(t.Name)
		if t.Attempts > 0 {
			r.LogURL = tb + "/log"
		}
		for _, o := range t.Outputs {
			r.OutputURLs = append(r.OutputURLs, OutputLink{Name: o.Name, URL: tb + "/outputs/" + outputPath(o.Name), Size: size(int64(o.Size)),
				Preview: "/app/workflows/" + url.PathEscape(st.ID) + "/tasks/" + url.PathEscape(t.Name) + "/preview/" + escapePath(strings.TrimPrefix(o.Name, "/"))})
		}
		d.Tasks = append(d.Tasks, r)
	}
	b, _ := json.Marshal(all)
	d.TasksJSON = string(b)
	if matched > taskPageSize {
		from := (page-1)*taskPageSize + 1
		d.Shown = fmt.Sprintf("tasks %d to %d of %d", from, min(from+taskPageSize-1, matched), matched)
	}
	link := func(page int) string {
		v := url.Values{}
		if d.Filter != "" {
			v.Set("tasks", d.Filter)
		}
		v.Set("page", strconv.Itoa(page))
		return "/app/workflows/" + url.PathEscape(st.ID) + "?" + v.Encode() + "#tasks"
	}
	if page > 1 {
		d.PrevURL = link(page - 1)
	}
	if page*taskPageSize < matched {
		d.NextURL = link(page + 1)
	}
	h.render(p, http.StatusOK, WorkflowPage(h.layout(p, "home"), d))
}

// outputPath is an output's name as the API's URLs take it: an output named
// by an absolute path keeps its leading / escaped (a // would be cleaned
// away by the router).
func outputPath(name string) string {
	if rest, ok := strings.CutPrefix(name, "/"); ok {
		return "%2F" + escapePath(rest)
	}
	return escapePath(name)
}

func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i := range parts {
		parts[i] = url.PathEscape(parts[i])
	}
	return strings.Join(parts, "/")
}

// cancel cancels a workflow through the API.
func (h *handler) cancel(p *pageCtx) {
	id := p.r.PathValue("id")
	res := h.callAPI(p, http.MethodPost, "/api/v1/workflows/"+url.PathEscape(id)+"/cancel", nil)
	if res.status == http.StatusNotFound {
		h.notFound(p, "workflow", store.ErrNotFound)
		return
	}
	if res.status >= 400 {
		http.Error(p.w, res.err.Error, res.status)
		return
	}
	http.Redirect(p.w, p.r, "/app/workflows/"+url.PathEscape(id), http.StatusSeeOther)
}

// delete deletes a workflow that has ended through the API and goes to the
// list of workflows; a running one gets the API's refusal.
func (h *handler) delete(p *pageCtx) {
	id := p.r.PathValue("id")
	res := h.callAPI(p, http.MethodDelete, "/api/v1/workflows/"+url.PathEscape(id), nil)
	switch {
	case res.status == http.StatusNotFound:
		h.notFound(p, "workflow", store.ErrNotFound)
	case res.status >= 400:
		h.render(p, res.status, MessagePage(h.layout(p, "home"), "Not deleted", res.err.Error, "/app/workflows/"+url.PathEscape(id)))
	default:
		http.Redirect(p.w, p.r, "/app/", http.StatusSeeOther)
	}
}

// cancelTask cancels one task through the API and goes back to the
// workflow's page; a task that already finished gets the API's refusal.
func (h *handler) cancelTask(p *pageCtx) {
	id, task := p.r.PathValue("id"), p.r.PathValue("task")
	res := h.callAPI(p, http.MethodPost, "/api/v1/workflows/"+url.PathEscape(id)+"/tasks/"+url.PathEscape(task)+"/cancel", nil)
	back := "/app/workflows/" + url.PathEscape(id)
	switch {
	case res.status == http.StatusNotFound:
		h.notFound(p, "task", store.ErrNotFound)
	case res.status >= 400:
		h.render(p, res.status, MessagePage(h.layout(p, "home"), "Not cancelled", res.err.Error, back))
	default:
		http.Redirect(p.w, p.r, back+"#tasks", http.StatusSeeOther)
	}
}

// shortID is the start of a worker's id, enough to tell workers apart on a
// page ("—" for none).
func shortID(id string) string {
	if id == "" {
		return "—"
	}
	return truncate(id, 9)
}

// SubmitData is the submit page.
type SubmitData struct {
	Text    string
	Error   *workflow.Error
	Checked bool // the file passed the checks
	Tasks   []SubmitTask
	Modules []api.Module
}

// SubmitTask is a task of the file being checked, with its error if the
// refusal names it.
type SubmitTask struct {
	Name, Module, Inputs string
	Error, Field         string
}

func (h *handler) submitPage(p *pageCtx) {
	d := SubmitData{}
	d.Modules, _ = h.b.Modules(p.r.Context(), p.owner)
	if len(d.Modules) > 0 {
		d.Text = fmt.Sprintf("{\n  \"name\": \"example\",\n  \"priority\": \"interactive\",\n  \"tasks\": [\n    {\"name\": \"first\", \"module\": %q, \"args\": []}\n  ]\n}\n", d.Modules[0].ID)
	}
	h.render(p, http.StatusOK, SubmitPage(h.layout(p, "submit"), d))
}

// readForm reads a multipart form (fields and files, each up to limit
// bytes) and checks its CSRF token.
func (h *handler) readForm(p *pageCtx, limit int64) (map[string][]byte, bool, error) {
	ct := p.r.Header.Get("Content-Type")
	if !strings.HasPrefix(ct, "multipart/form-data") {
		if err := p.r.ParseForm(); err != nil {
			return nil, false, err
		}
		f := map[string][]byte{}
		for k, v := range p.r.PostForm {
			f[k] = []byte(v[0])
		}
		return f, h.csrfOK(p.sess, string(f["csrf"])), nil
	}
	p.r.Body = http.MaxBytesReader(p.w, p.r.Body, limit+1<<20)
	mr, err := p.r.MultipartReader()
	if err != nil {
		return nil, false, err
	}
	f := map[string][]byte{}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, false, err
		}
		b, err := io.ReadAll(io.LimitReader(part, limit+1))
		if err != nil {
			return nil, false, err
		}
		if int64(len(b)) > limit {
			return nil, false, fmt.Errorf("%s is larger than %d MiB", part.FormName(), limit>>20)
		}
		if part.FileName() == "" || len(b) > 0 {
			f[part.FormName()] = b
			if part.FileName() != "" {
				f[part.FormName()+":filename"] = []byte(part.FileName())
			}
		}
	}
	return f, h.csrfOK(p.sess, string(f["csrf"])), nil
}

// submit checks a workflow file and, when asked and it passes, submits it
// through the API.
func (h *handler) submit(p *pageCtx) {
	ctx, release, err := h.b.SubmissionTurn(p.r.Context(), p.owner, p.r.ContentLength)
	if err != nil {
		if p.r.Context().Err() == nil {
			p.w.Header().Set("Retry-After", "10")
			http.Error(p.w, "workflow not read: "+err.Error(), http.StatusServiceUnavailable)
		}
		return
	}
	defer release()
	p.r = p.r.WithContext(ctx)
	f, csrfOK, err := h.readForm(p, workflow.MaxFileSize)
	if err != nil {
		http.Error(p.w, "could not read the form: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !csrfOK {
		http.Error(p.w, formExpired, http.StatusForbidden)
		return
	}
	body := f["file"]
	if len(body) == 0 {
		body = f["workflow"]
	}
	d := SubmitData{Text: string(body)}
	d.Modules, _ = h.b.Modules(p.r.Context(), p.owner)
	_, we, err := h.b.CheckWorkflow(p.r.Context(), p.owner, body)
	if err != nil {
		h.serverError(p, "check the workflow", err)
		return
	}
	if we == nil && string(f["action"]) == "submit" {
		res := h.callAPI(p, http.MethodPost, "/api/v1/workflows", body)
		if res.status == http.StatusCreated {
			var created struct{ ID string }
			_ = json.Unmarshal(res.body, &created)
			http.Redirect(p.w, p.r, "/app/workflows/"+url.PathEscape(created.ID), http.StatusSeeOther)
			return
		}
		we = &workflow.Error{Msg: res.err.Error, Task: res.err.Task, Field: res.err.Field}
		if we.Task != "" {
			// The API's message names the task already; the page shows it
			// next to the task.
			we.Msg = strings.TrimPrefix(we.Msg, fmt.Sprintf("task %q: ", we.Task))
		}
		if we.Field != "" {
			we.Msg = strings.TrimPrefix(we.Msg, fmt.Sprintf("field %q: ", we.Field))
		}
	}
	d.Error, d.Checked = we, we == nil
	d.Tasks = looseTasks(body, we)
	status := http.StatusOK
	if we != nil {
		status = http.StatusBadRequest
	}
	h.render(p, status, SubmitPage(h.layout(p, "submit"), d))
}

// looseTasks reads what it can of a file's tasks, to show the refusal next
// to the task it names.
func looseTasks(body []byte, we *workflow.Error) []SubmitTask {
	var f struct {
		Tasks []map[string]any `json:"tasks"`
	}
	if json.Unmarshal(body, &f) != nil {
		return nil
	}
	out := make([]SubmitTask, 0, min(len(f.Tasks), 1000))
	for i, t := range f.Tasks {
		if i >= 1000 && (we == nil || we.Task == "") {
			break
		}
		name, _ := t["name"].(string)
		module, _ := t["module"].(string)
		st := SubmitTask{Name: name, Module: truncate(module, 24)}
		if in, ok := t["inputs"].(map[string]any); ok {
			var parts []string
			for k, v := range in {
				if m, ok := v.(map[string]any); ok {
					from, _ := m["from"].(string)
					parts = append(parts, k+" ← "+from)
				}
			}
			st.Inputs = strings.Join(parts, ", ")
		}
		if we != nil && we.Task != "" && we.Task == name {
			st.Error, st.Field = we.Msg, we.Field
		}
		if i >= 1000 && st.Error == "" {
			continue
		}
		out = append(out, st)
	}
	return out
}

// ModuleRow is a module on the modules page.
type ModuleRow struct {
	ID, Short, Size, Created string
	Name                     string // the file name it was pushed with
	Imports                  []string
	HostImports              string // the cyclepool host functions it uses
	UsedBy                   []string
}

func (h *handler) moduleRows(p *pageCtx) ([]ModuleRow, error) {
	ms, err := h.b.Modules(p.r.Context(), p.owner)
	if err != nil {
		return nil, err
	}
	use, err := h.b.ModuleUse(p.r.Context(), p.owner)
	if err != nil {
		return nil, err
	}
	out := make([]ModuleRow, len(ms))
	for i, m := range ms {
		out[i] = ModuleRow{ID: m.ID, Name: m.Name, Short: truncate(strings.TrimPrefix(m.ID, "sha256:"), 13), Size: size(int64(m.Size)),
			Created: m.CreatedAt.Local().Format("2006-01-02 15:04:05"), Imports: m.Imports, UsedBy: use[m.ID]}
		var host []string
		for _, i := range m.Imports {
			if f, ok := strings.CutPrefix(i, "cyclepool."); ok {
				host = append(host, f)
			}
		}
		if len(host) > 0 {
			out[i].HostImports = " · cyclepool: " + strings.Join(host, ", ")
		}
	}
	return out, nil
}

func (h *handler) modulesPage(p *pageCtx) {
	ms, err := h.moduleRows(p)
	if err != nil {
		h.serverError(p, "list modules", err)
		return
	}
	h.render(p, http.StatusOK, ModulesPage(h.layout(p, "modules"), ms, "", ""))
}

// upload pushes a module through the API. The form's fields come first
// (csrf), then the file, which streams into POST /api/v1/modules and is
// read there only once the upload has its turn (at most a few module
// bodies are held at once): it is never held whole here.
func (h *handler) upload(p *pageCtx) {
	msg, okMsg, status := h.streamModule(p)
	if status == http.StatusForbidden && msg == formExpired {
		http.Error(p.w, msg, status)
		return
	}
	ms, err := h.moduleRows(p)
	if err != nil {
		h.serverError(p, "list modules", err)
		return
	}
	h.render(p, status, ModulesPage(h.layout(p, "modules"), ms, msg, okMsg))
}

// streamModule reads the module form and uploads its file; it returns the
// error or success message and the status to answer with.
func (h *handler) streamModule(p *pageCtx) (msg, okMsg string, status int) {
	return h.streamFile(p, "module", "Choose a .wasm file first.", nil, func(part *multipart.Part) (string, string, int) {
		res := h.callAPIStream(p, http.MethodPost, "/api/v1/modules?name="+url.QueryEscape(part.FileName()), part)
		if res.status >= 400 {
			return res.err.Error, "", res.status
		}
		var m api.Module
		_ = json.Unmarshal(res.body, &m)
		if res.status == http.StatusOK {
			return "", "You had already uploaded this module: " + m.ID + ".", http.StatusOK
		}
		return "", "Uploaded " + m.ID + ".", http.StatusOK
	})
}

// streamFile walks an upload form whose fields come before its file: the
// CSRF token first, then flags (a part named by one of them sets it), then
// the file part named field, which send takes as it streams (it is never
// held whole here). choose is the message of a form without a file; a
// wrong CSRF token answers formExpired with 403.
func (h *handler) streamFile(p *pageCtx, field, choose string, flags map[string]*bool,
	send func(*multipart.Part) (msg, okMsg string, status int)) (msg, okMsg string, status int) {
	mr, err := p.r.MultipartReader()
	if err != nil {
		return "Could not read the upload: " + err.Error(), "", http.StatusBadRequest
	}
	csrfOK := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return choose, "", http.StatusBadRequest
		}
		if err != nil {
			return "Could not read the upload: " + err.Error(), "", http.StatusBadRequest
		}
		switch name := part.FormName(); {
		case name == "csrf":
			b, _ := io.ReadAll(io.LimitReader(part, 1024))
			csrfOK = h.csrfOK(p.sess, string(b))
		case flags[name] != nil:
			*flags[name] = true
		case name == field:
			if !csrfOK {
				return formExpired, "", http.StatusForbidden
			}
			if part.FileName() == "" {
				return choose, "", http.StatusBadRequest
			}
			return send(part)
		}
	}
}

// formExpired answers a form whose CSRF token is wrong.
const formExpired = "the form has expired or did not come from this site: reload the page and try again"

// HistoryData is the history page.
type HistoryData struct {
	Rows             []WorkflowRow
	Q, State         string
	Total, Page      int
	Pages            int
	PrevURL, NextURL string
}

const historyPageSize = 25

func (h *handler) history(p *pageCtx) {
	q := p.r.URL.Query()
	d := HistoryData{Q: q.Get("q"), State: q.Get("state")}
	switch d.State {
	case "", "running", "done", "failed", "cancelled":
	default:
		d.State = ""
	}
	d.Page, _ = strconv.Atoi(q.Get("page"))
	d.Page = min(max(d.Page, 1), maxPage)
	ws, total, err := h.b.List(p.r.Context(), p.owner, store.ListOptions{State: d.State, Query: d.Q,
		Limit: historyPageSize, Offset: (d.Page - 1) * historyPageSize})
	if err != nil {
		h.serverError(p, "list workflows", err)
		return
	}
	d.Rows, d.Total = rows(ws), total
	d.Pages = max((total+historyPageSize-1)/historyPageSize, 1)
	link := func(page int) string {
		v := url.Values{}
		if d.Q != "" {
			v.Set("q", d.Q)
		}
		if d.State != "" {
			v.Set("state", d.State)
		}
		v.Set("page", strconv.Itoa(page))
		return "/app/history?" + v.Encode()
	}
	if d.Page > 1 {
		d.PrevURL = link(d.Page - 1)
	}
	if d.Page < d.Pages {
		d.NextURL = link(d.Page + 1)
	}
	h.render(p, http.StatusOK, HistoryPage(h.layout(p, "history"), d))
}

// WorkerRow is a connected worker on the volunteers page.
type WorkerRow struct {
	ID         string `json:"id"`
	FullID     string `json:"full_id"`
	Kind       string `json:"kind"`
	Slots      int    `json:"slots"`
	Battery    string `json:"battery"`
	Connection string `json:"connection"`
	Visibility string `json:"visibility"`
	Since      string `json:"since"`
	Current    string `json:"current"`
	Paused     string `json:"paused"`
	Done       int64  `json:"done"`
	Lost       int64  `json:"lost"`
	// Stability is the dispatcher's class ("—": another replica knows it),
	// Reasons what lowered it.
	Stability string `json:"stability"`
	Reasons   string `json:"reasons"`
	// Jobs is the tasks done since it connected (the count fairness is
	// measured on, "—" when another replica knows it) and JobsClass its
	// bar's width against the busiest worker.
	Jobs      string `json:"jobs"`
	JobsClass string `json:"jobs_class"`
}

// VolunteersData is the volunteers page, and /app/volunteers.json that
// app.js polls to redraw it.
type VolunteersData struct {
	Count     string      `json:"count"`
	Workers   []WorkerRow `json:"workers"`
	Done      Plot        `json:"done"`      // tasks done per minute, last hour
	Connected Plot        `json:"connected"` // workers connected per minute
	Fairness  string      `json:"fairness"`
	Variance  string      `json:"variance"`
	Strategy  string      `json:"strategy"`
}

func (h *handler) volunteersData(p *pageCtx) (VolunteersData, error) {
	v, err := h.b.Volunteers(p.r.Context(), p.owner)
	if err != nil {
		return VolunteersData{}, err
	}
	d := VolunteersData{Workers: make([]WorkerRow, len(v.Workers)), Strategy: v.FairnessStrategy,
		Variance: fmt.Sprintf("%.2f", v.Variance)}
	d.Count = fmt.Sprintf("%d workers connected", len(v.Workers))
	if len(v.Workers) == 1 {
		d.Count = "1 worker connected"
	}
	busiest, known := 0, []int{}
	for _, w := range v.Workers {
		if w.DoneHere != nil {
			busiest = max(busiest, *w.DoneHere)
			known = append(known, *w.DoneHere)
		}
	}
	for i, w := range v.Workers {
		dv := w.Device
		r := WorkerRow{ID: shortID(w.ID), FullID: w.ID, Kind: w.Kind, Slots: w.Slots, Done: w.Done, Lost: w.Lost,
			Since: dur(time.Since(w.ConnectedAt)) + " ago", Current: strings.Join(w.Running, ", "),
			Visibility: orDash(dv.Visibility), Connection: orDash(dv.Connection), Battery: "—",
			Stability: orDash(w.Stability), Reasons: strings.Join(w.Reasons, "; "), Jobs: "—", JobsClass: "p-0"}
		if dv.Battery != nil {
			r.Battery = fmt.Sprintf("%.0f%%", *dv.Battery*100)
			switch dv.Charging {
			case "yes":
				r.Battery += ", charging"
			case "no":
				r.Battery += ", on battery"
			}
		}
		if dv.DownlinkMbps != nil {
			r.Connection += fmt.Sprintf(" (%.1f Mbit/s)", *dv.DownlinkMbps)
		}
		if dv.Paused {
			r.Paused = "paused: " + dv.PausedBecause
		}
		if r.Current == "" {
			r.Current = "idle"
		}
		if w.DoneHere != nil {
			r.Jobs = strconv.Itoa(*w.DoneHere)
			if busiest > 0 {
				r.JobsClass = fmt.Sprintf("p-%d", *w.DoneHere*100/busiest)
			}
		}
		d.Workers[i] = r
	}
	done, conn := make([]int, len(v.Activity)), make([]int, len(v.Activity))
	for i, m := range v.Activity {
		done[i], conn[i] = m.TasksDone, m.Workers
	}
	d.Done, d.Connected = barsPlot(done), stepPlot(conn)
	d.Done.Caption = fmt.Sprintf("%d tasks done in the last hour, %d in the current minute, at most %d in one minute", d.Done.Sum, d.Done.Last, d.Done.Peak)
	d.Connected.Caption = fmt.Sprintf("%s now, at most %d at once in the last hour", d.Count, d.Connected.Peak)
	if len(known) == 0 {
		d.Fairness = "No worker connected to this server yet."
	} else {
		lo, sum := known[0], 0
		for _, n := range known {
			lo, sum = min(lo, n), sum+n
		}
		d.Fairness = fmt.Sprintf("Tasks done since connecting, over %d workers of this server: mean %.1f, fewest %d, most %d.",
			len(known), float64(sum)/float64(len(known)), lo, busiest)
	}
	return d, nil
}

func (h *handler) volunteers(p *pageCtx) {
	d, err := h.volunteersData(p)
	if err != nil {
		h.serverError(p, "list workers", err)
		return
	}
	h.render(p, http.StatusOK, VolunteersPage(h.layout(p, "volunteers"), d))
}

// volunteersJSON is the volunteers page's data, which app.js polls.
func (h *handler) volunteersJSON(p *pageCtx) {
	d, err := h.volunteersData(p)
	if err != nil {
		h.log.Error("dashboard", "what", "list workers", "err", err)
		p.w.Header().Set("Content-Type", "application/json")
		p.w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(p.w, `{"error":"server error while trying to list workers"}`+"\n")
		return
	}
	p.w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(p.w).Encode(d)
}

func orDash(s string) string {
	if s == "" || s == "unknown" {
		return "—"
	}
	return s
}

// dur formats a duration for people: 850ms, 12.3s, 4m05s, 2h03m.
func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

func size(n int64) string {
	switch {
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// BlobRow is a data blob on the data page.
type BlobRow struct {
	ID, Name, Size, Kind, Created string
}

func (h *handler) blobRows(p *pageCtx) ([]BlobRow, error) {
	bs, err := h.b.Blobs(p.r.Context(), p.owner)
	if err != nil {
		return nil, err
	}
	out := make([]BlobRow, len(bs))
	for i, b := range bs {
		kind := "file"
		if b.Archive {
			kind = "archive"
		}
		out[i] = BlobRow{ID: b.ID, Name: b.Name, Size: size(b.Size), Kind: kind, Created: b.CreatedAt.Local().Format("2006-01-02 15:04:05")}
	}
	return out, nil
}

func (h *handler) dataPage(p *pageCtx) {
	bs, err := h.blobRows(p)
	if err != nil {
		h.serverError(p, "list data", err)
		return
	}
	h.render(p, http.StatusOK, DataPage(h.layout(p, "data"), bs, "", ""))
}

// dataUpload streams an uploaded file into POST /api/v1/blobs: the form's
// fields come first (csrf, archive), then the file, which is never held
// whole here.
func (h *handler) dataUpload(p *pageCtx) {
	msg, okMsg, status := h.streamData(p)
	if status == http.StatusForbidden {
		http.Error(p.w, msg, status)
		return
	}
	bs, err := h.blobRows(p)
	if err != nil {
		h.serverError(p, "list data", err)
		return
	}
	h.render(p, status, DataPage(h.layout(p, "data"), bs, msg, okMsg))
}

// streamData reads the data form and uploads its file; it returns the
// error or success message and the status to answer with.
func (h *handler) streamData(p *pageCtx) (msg, okMsg string, status int) {
	archive := false
	return h.streamFile(p, "data", "Choose a file first.", map[string]*bool{"archive": &archive}, func(part *multipart.Part) (string, string, int) {
		q := url.Values{"name": {part.FileName()}}
		if archive {
			q.Set("archive", "1")
		}
		res := h.callAPIStream(p, http.MethodPost, "/api/v1/blobs?"+q.Encode(), part)
		if res.status >= 400 {
			return res.err.Error, "", res.status
		}
		var b api.Blob
		_ = json.Unmarshal(res.body, &b)
		if res.status == http.StatusOK {
			return "", "You had already uploaded this data: " + b.ID + ".", http.StatusOK
		}
		return "", "Uploaded " + b.Name + " as " + b.ID + ".", http.StatusOK
	})
}

// previewLines and previewBytes bound a text output's preview.
const (
	previewLines = 100
	previewBytes = 64 << 10
	// maxPreviewImage bounds an image shown inline (it is read whole).
	maxPreviewImage = 32 << 20
	// imageProbeBytes is what previewImage reads first, to learn an
	// image's size before reading up to maxPreviewImage of it.
	imageProbeBytes = 1 << 20
)

// imageTypes are the outputs shown inline as images, by extension (never
// SVG, which can carry script).
var imageTypes = map[string]string{".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif", ".webp": "image/webp"}

// PreviewData is an output's preview page.
type PreviewData struct {
	Workflow, WorkflowURL, Task, Output, Size, DownloadURL string
	ImageURL                                               string
	Lines                                                  []string
	More                                                   bool   // the text goes on past the preview
	Binary                                                 string // why it is not shown
}

// outputOf reads an output through the API, as the owner; the path's
// output may be given without the leading / of an output named by path.
//
// At most the first n bytes are read (the API answers the range); total is
// the output's size.
func (h *handler) outputOf(p *pageCtx, n int) (name string, res apiResult, total int64) {
	name = p.r.PathValue("output")
	res, total = h.outputAt(p, name, n)
	if res.status == http.StatusNotFound {
		if r2, t2 := h.outputAt(p, "/"+name, n); r2.status < 400 {
			name, res, total = "/"+name, r2, t2
		}
	}
	return name, res, total
}

// outputAt reads at most the first n bytes of the path's task's output
// name through the API, as the owner; total is the output's size.
func (h *handler) outputAt(p *pageCtx, name string, n int) (res apiResult, total int64) {
	id, task := p.r.PathValue("id"), p.r.PathValue("task")
	u := "/api/v1/workflows/" + url.PathEscape(id) + "/tasks/" + url.PathEscape(task) + "/outputs/" + outputPath(name)
	res = h.callAPIHeader(p, http.MethodGet, u, nil, http.Header{"Range": {fmt.Sprintf("bytes=0-%d", n-1)}})
	total = int64(len(res.body))
	if res.status == http.StatusPartialContent {
		// "bytes 0-N/TOTAL"
		if _, t, ok := strings.Cut(res.header.Get("Content-Range"), "/"); ok {
			if v, err := strconv.ParseInt(t, 10, 64); err == nil {
				total = v
			}
		}
	}
	return res, total
}

// previewPage shows an output: an image inline, the first lines of text,
// or its size; it links the download either way.
func (h *handler) previewPage(p *pageCtx) {
	id, task := p.r.PathValue("id"), p.r.PathValue("task")
	name, res, total := h.outputOf(p, previewBytes)
	if res.status >= 400 {
		http.Error(p.w, res.err.Error, res.status)
		return
	}
	d := PreviewData{Workflow: id, WorkflowURL: "/app/workflows/" + url.PathEscape(id), Task: task, Output: name, Size: size(total),
		DownloadURL: "/app/api/v1/workflows/" + url.PathEscape(id) + "/tasks/" + url.PathEscape(task) + "/outputs/" + outputPath(name)}
	body := res.body
	switch {
	case imageTypes[strings.ToLower(path.Ext(name))] != "":
		d.ImageURL = "/app/workflows/" + url.PathEscape(id) + "/tasks/" + url.PathEscape(task) + "/image/" + escapePath(strings.TrimPrefix(name, "/"))
	case bytes.IndexByte(body[:min(len(body), previewBytes)], 0) >= 0 || !utf8.Valid(trimRune(body[:min(len(body), previewBytes)])):
		d.Binary = "binary data: download it to see it"
	default:
		text := string(trimRune(body[:min(len(body), previewBytes)]))
		d.Lines = strings.Split(strings.TrimSuffix(text, "\n"), "\n")
		d.More = total > previewBytes
		if len(d.Lines) > previewLines {
			d.Lines, d.More = d.Lines[:previewLines], true
		}
	}
	h.render(p, http.StatusOK, PreviewPage(h.layout(p, "home"), d))
}

// trimRune drops an incomplete UTF-8 sequence cut at the end of b.
func trimRune(b []byte) []byte {
	for k := 1; k <= 3 && k <= len(b); k++ {
		if utf8.RuneStart(b[len(b)-k]) {
			if !utf8.FullRune(b[len(b)-k:]) {
				return b[:len(b)-k]
			}
			break
		}
	}
	return b
}

// previewImage serves an image output with its image type, for the
// preview page's img (the API serves every output as octet-stream).
//
// What refuses the request is checked before the image is read: its name
// first (a path says whether it is an image without reading anything),
// then its size, from a first read of at most imageProbeBytes (the whole
// of most images).
func (h *handler) previewImage(p *pageCtx) {
	// The output's name, or the absolute one outputOf may find instead,
	// ends as the path does.
	ct := imageTypes[strings.ToLower(path.Ext(p.r.PathValue("output")))]
	if ct == "" {
		http.Error(p.w, "not an image output", http.StatusNotFound)
		return
	}
	name, res, total := h.outputOf(p, imageProbeBytes)
	if res.status < 400 && total <= maxPreviewImage && total > int64(len(res.body)) {
		res, total = h.outputAt(p, name, maxPreviewImage)
	}
	if res.status >= 400 {
		http.Error(p.w, res.err.Error, res.status)
		return
	}
	if total > int64(len(res.body)) {
		http.Error(p.w, fmt.Sprintf("the image is larger than %d MiB: download it to see it", maxPreviewImage>>20), http.StatusRequestEntityTooLarge)
		return
	}
	p.w.Header().Set("Content-Type", ct)
	p.w.Header().Set("Cache-Control", "private, max-age=3600")
	_, _ = p.w.Write(res.body)
}
