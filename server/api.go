package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/throttle"
	"github.com/cyclepool/cyclepool/internal/workflow"
)

const moduleCheckTimeout = 30 * time.Second

// ownerHandler is an API handler for a request whose owner is known.
type ownerHandler func(http.ResponseWriter, *http.Request, store.Owner)

// routeAPI registers the owners' REST API (docs/API.md), each handler
// wrapped by owned, which finds the request's owner (a bearer token for the
// CLI, the session for the dashboard): one list of routes for both.
func (s *Server) routeAPI(mux *http.ServeMux, owned func(ownerHandler) http.HandlerFunc) {
	mux.HandleFunc("POST /api/v1/modules", owned(s.handlePushModule))
	mux.HandleFunc("GET /api/v1/modules", owned(s.handleModules))
	mux.HandleFunc("DELETE /api/v1/modules/{id}", owned(s.handleRemoveModule))
	mux.HandleFunc("PUT /api/v1/blobs/{id}", owned(s.handlePushBlob))
	mux.HandleFunc("POST /api/v1/blobs", owned(s.handlePushBlob))
	mux.HandleFunc("GET /api/v1/blobs/{id}", owned(s.handleBlob))
	mux.HandleFunc("DELETE /api/v1/blobs/{id}", owned(s.handleRemoveBlob))
	mux.HandleFunc("GET /api/v1/blobs", owned(s.handleBlobs))
	mux.HandleFunc("POST /api/v1/workflows", owned(s.handleSubmit))
	mux.HandleFunc("GET /api/v1/workflows", owned(s.handleList))
	mux.HandleFunc("GET /api/v1/workflows/{id}", owned(s.handleStatus))
	mux.HandleFunc("POST /api/v1/workflows/{id}/cancel", owned(s.handleCancel))
	mux.HandleFunc("DELETE /api/v1/workflows/{id}", owned(s.handleDelete))
	mux.HandleFunc("GET /api/v1/workflows/{id}/events", owned(s.handleEvents))
	mux.HandleFunc("POST /api/v1/workflows/{id}/tasks/{task}/cancel", owned(s.handleCancelTask))
	mux.HandleFunc("GET /api/v1/workflows/{id}/tasks/{task}/attempts", owned(s.handleAttempts))
	mux.HandleFunc("GET /api/v1/workflows/{id}/tasks/{task}/log", owned(s.handleLog))
	mux.HandleFunc("GET /api/v1/workflows/{id}/tasks/{task}/outputs/{output...}", owned(s.handleOutput))
	mux.HandleFunc("GET /api/v1/workers", owned(s.handleWorkers))
	mux.HandleFunc("GET /api/v1/activity", owned(s.handleActivity))
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: %s %s (see docs/API.md)", r.Method, r.URL.Path)
	})
}

// authed resolves the bearer token to an owner, or answers 401. A token
// not in the cache is looked up only for an address not past its wrong
// tokens (Server.failures, shared with the dashboard's sign-in): past
// them, 429 with Retry-After and no query, so that random tokens cost the
// database nothing and guessing is slow. Lookups in flight count against
// the address's failures until they end (throttle.Failures.Begin), so
// that tokens sent at once are not all looked up. A cached token is
// never held.
func (s *Server) authed(h ownerHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			writeError(w, http.StatusUnauthorized, "missing owner token: send Authorization: Bearer <token> (cyclepool token create NAME)")
			return
		}
		if o, ok := s.owners.Load(token); ok {
			h(w, r, o.(store.Owner))
			return
		}
		wait, done, err := s.failures.Begin(r.Context(), remoteHost(r))
		if err != nil {
			return // the client is gone
		}
		if wait > 0 {
			s.log.Info("owner token throttled", "remote", r.RemoteAddr)
			w.Header().Set("Retry-After", throttle.RetryAfter(wait))
			writeError(w, http.StatusTooManyRequests, "too many unknown owner tokens from this address: try again in %s", throttle.RetryAfter(wait)+"s")
			return
		}
		defer done(false) // done at once below, unless the lookup panics
		o, err := s.store.OwnerByToken(r.Context(), token)
		done(errors.Is(err, store.ErrNotFound))
		if errors.Is(err, store.ErrNotFound) {
			s.log.Info("owner token refused", "remote", r.RemoteAddr)
			writeError(w, http.StatusUnauthorized, "unknown owner token")
			return
		}
		if err != nil {
			s.serverError(w, "look up token", err)
			return
		}
		s.owners.Store(token, o)
		h(w, r, o)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, api.Error{Error: fmt.Sprintf(format, args...)})
}

// serverError answers a request the server could not serve: 503 with
// Retry-After when the database could not do it for a reason of its own
// (down, read-only, its disk full: try again later), 500 otherwise.
func (s *Server) serverError(w http.ResponseWriter, what string, err error) {
	if store.ServerFault(err) {
		s.health.observe(what, err)
		s.log.Log(context.Background(), s.health.level(err), what, "err", err)
		w.Header().Set("Retry-After", "10")
		writeError(w, http.StatusServiceUnavailable, "the server cannot %s now (%s); try again later", what, store.FaultSummary(err))
		return
	}
	s.log.Error(what, "err", err)
	writeError(w, http.StatusInternalServerError, "server error while trying to %s", what)
}

// notFoundOr answers 404 for ErrNotFound and 500 otherwise.
func (s *Server) notFoundOr(w http.ResponseWriter, what string, err error) {
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "%s not found", what)
		return
	}
	s.serverError(w, "read "+what, err)
}

func (s *Server) handleModules(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	ms, err := s.store.Modules(r.Context(), owner.ID)
	if err != nil {
		s.serverError(w, "list modules", err)
		return
	}
	writeJSON(w, http.StatusOK, apiModules(ms))
}

// handleSubmit validates a workflow file and writes it whole, or refuses it
// whole with an error naming the problem. With wait, it then waits for the
// workflow's end as GET ?wait= does, and answers with its status.
func (s *Server) handleSubmit(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	wait, ok := parseWait(w, r)
	if !ok {
		return
	}
	waits := r.URL.Query().Get("wait") != ""
	release := func() {}
	if r.Context().Value(heldSubmissionTurn{}) == nil {
		var err error
		if release, err = s.submissions.acquire(r.Context(), owner.ID, r.ContentLength); err != nil {
			if r.Context().Err() == nil {
				w.Header().Set("Retry-After", "10")
				writeError(w, http.StatusServiceUnavailable, "workflow not read: %v", err)
			}
			return
		}
	}
	defer release() // at once once written: not while waiting for the end
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, workflow.MaxFileSize+1))
	if err != nil || len(body) > workflow.MaxFileSize {
		writeError(w, http.StatusRequestEntityTooLarge, "workflow file is larger than %d MiB", workflow.MaxFileSize>>20)
		return
	}
	spec, blobs, we, err := s.checkSubmission(r.Context(), owner, body)
	if err != nil {
		s.serverError(w, "check modules", err)
		return
	}
	if we != nil {
		writeJSON(w, http.StatusBadRequest, api.Error{Error: we.Error(), Task: we.Task, Field: we.Field})
		return
	}
	nw, err := s.toNewWorkflow(r.Context(), spec, blobs)
	if err != nil {
		s.serverError(w, "create workflow", err)
		return
	}
	// The id is made here: a submission whose answer was lost can be
	// looked up, and a waiter can wait from before it exists.
	if nw.ID, err = store.NewWorkflowID(); err != nil {
		s.serverError(w, "create workflow", err)
		return
	}
	var woken <-chan wake
	forget := func() {}
	if waits {
		// A task that ends at once still finds its waiter, which gets
		// the status its completion reads.
		woken, forget = s.ends.addWatching(nw.ID)
		defer forget() // done already unless the submission panicked
	}
	id, err := s.submit(r.Context(), owner.ID, nw)
	if store.ModuleGone(err) {
		// A module this replica trusted the owner to have (knownModuleFor)
		// was removed on another replica and deleted meanwhile: look
		// again, and refuse the workflow as naming an unknown module.
		forget()
		for _, t := range spec.Tasks {
			s.knownModules.Delete(ownedModule{owner.ID, t.Module})
		}
		_, we, cerr := s.checkModules(r.Context(), owner, body)
		if cerr == nil && we != nil {
			writeJSON(w, http.StatusBadRequest, api.Error{Error: we.Error(), Task: we.Task, Field: we.Field})
			return
		}
		s.serverError(w, "create workflow", err)
		return
	}
	if err != nil {
		s.wake() // it may have committed, its notification lost with the connection
		lctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 10*time.Second)
		_, lerr := s.store.Summary(lctx, owner.ID, nw.ID)
		cancel()
		if lerr != nil {
			forget()
			s.serverError(w, "create workflow", err)
			return
		}
		s.log.Warn("workflow submitted, its commit's answer lost", "workflow", nw.ID, "err", err)
		id = nw.ID // written after all
	}
	release()
	s.log.Info("workflow submitted", "workflow", id, "name", spec.Name, "tasks", len(spec.Tasks), "owner", owner.Name)
	if !waits {
		writeJSON(w, http.StatusCreated, api.Submitted{ID: id, Name: spec.Name, Tasks: len(spec.Tasks)})
		return
	}
	// Only these are kept for the wait, which may last a minute: the
	// workflow's file, parsed and converted, may hold megabytes.
	name, tasks, priority := spec.Name, len(spec.Tasks), nw.Priority
	body, spec, nw, blobs = nil, nil, nil, nil
	read, err := s.waitAdded(r.Context(), owner.ID, id, wait, woken, forget, false)
	var st *store.WorkflowStatus
	if err == nil {
		st, err = s.statusOf(r.Context(), owner, id, read)
	}
	if err != nil {
		// Written all the same: say so, with what is known, rather than
		// an error that would have the owner submit it again.
		s.log.Warn("wait for a workflow submitted", "workflow", id, "err", err)
		st = &store.WorkflowStatus{ID: id, Name: name, Priority: priority, State: store.StateRunning, TaskCount: tasks,
			Notice: "the workflow was submitted, but the server could not read its status just now: ask again with GET /api/v1/workflows/" + id + "?wait="}
	}
	writeJSON(w, http.StatusCreated, apiStatus(st))
}

// checkSubmission runs every check a submission must pass before anything
// is written: the size, workflow.Parse (fields, names, cycles, inputs),
// modules and data given as ids rather than paths, and modules and data
// the owner has pushed (returned by id). The API's submit handler and the dashboard's Check button both
// call it, so their rules cannot drift apart. A refusal comes back as a
// *workflow.Error naming the task and field; err is for the server's own
// failures.
func (s *Server) checkSubmission(ctx context.Context, owner store.Owner, body []byte) (*workflow.Spec, map[string]store.Blob, *workflow.Error, error) {
	spec, we, err := s.checkModules(ctx, owner, body)
	if spec == nil {
		return nil, nil, we, err
	}
	blobs, we, err := s.checkBlobs(ctx, owner, spec)
	if we != nil || err != nil {
		return nil, nil, we, err
	}
	return spec, blobs, nil, nil
}

// checkModules is checkSubmission up to the modules.
func (s *Server) checkModules(ctx context.Context, owner store.Owner, body []byte) (*workflow.Spec, *workflow.Error, error) {
	if len(body) > workflow.MaxFileSize {
		return nil, &workflow.Error{Msg: fmt.Sprintf("workflow file is larger than %d MiB", workflow.MaxFileSize>>20)}, nil
	}
	spec, err := workflow.Parse(body)
	if err != nil {
		var we *workflow.Error
		if errors.As(err, &we) {
			return nil, we, nil
		}
		return nil, &workflow.Error{Msg: err.Error()}, nil
	}
	if paths := spec.ModulePaths(); len(paths) > 0 {
		i := firstTaskWithModule(spec, paths[0])
		return nil, &workflow.Error{Task: spec.Tasks[i].Name, Field: "module",
			Msg: fmt.Sprintf("module %q is a path: push it first and use its sha256: id (cyclepool submit pushes paths itself; on the dashboard, upload it on the Modules page)", paths[0])}, nil
	}
	ids := map[string]bool{}
	var list []string
	for _, t := range spec.Tasks {
		if !ids[t.Module] {
			ids[t.Module] = true
			list = append(list, t.Module)
		}
	}
	missing, err := s.missingModules(ctx, owner.ID, list)
	if err != nil {
		return nil, nil, fmt.Errorf("check modules: %w", err)
	}
	if len(missing) > 0 {
		i := firstTaskWithModule(spec, missing[0])
		return nil, &workflow.Error{Task: spec.Tasks[i].Name, Field: "module",
			Msg: fmt.Sprintf("unknown module %s: push it first (cyclepool module push FILE.wasm, or the dashboard's Modules page)", missing[0])}, nil
	}
	return spec, nil, nil
}

func firstTaskWithModule(spec *workflow.Spec, m string) int {
	for i, t := range spec.Tasks {
		if t.Module == m {
			return i
		}
	}
	return 0
}

// toNewWorkflow is the store's form of a parsed workflow, whose tasks read
// blobs; a replicated one may make up to Config.Verify.MaxReplicas
// replicas of a task at least.
func (s *Server) toNewWorkflow(ctx context.Context, spec *workflow.Spec, blobs map[string]store.Blob) (*store.NewWorkflow, error) {
	nw, err := toNewWorkflow(spec, s.cfg.Verify.MaxReplicas, blobs, func(id string) (string, error) { return s.blobToken(ctx, id) })
	if err != nil {
		return nil, fmt.Errorf("set up the tasks' files: %w", err)
	}
	return nw, nil
}

// toNewWorkflow is Server.toNewWorkflow with the blobs' capabilities from
// token.
func toNewWorkflow(spec *workflow.Spec, maxReplicas int, blobs map[string]store.Blob, token func(id string) (string, error)) (*store.NewWorkflow, error) {
	nw := &store.NewWorkflow{Name: spec.Name, Priority: string(spec.Priority), Tasks: make([]store.NewTask, len(spec.Tasks)),
		Replicas: spec.Replicas, Quorum: spec.Quorum}
	if spec.Replicas > 1 || spec.Quorum > 1 {
		// Disagreement spawns replicas up to a bound: room for two wrong
		// results per needed quorum, and never fewer than the default's.
		nw.MaxReplicas = max(spec.Replicas, 2*spec.Quorum+1, maxReplicas)
	}
	var buf []byte
	for i, t := range spec.Tasks {
		var seed int64
		seed, buf = taskSeed(buf, spec.Name, i, t.Name)
		nt := store.NewTask{
			Name: t.Name, Module: t.Module, Args: t.Args, Seed: seed,
			TimeoutMS: t.Timeout.Milliseconds(), MaxAttempts: t.MaxAttempts, MemoryPages: int(t.MemoryPages()),
			OutputBytes: t.OutputBytes, LogBytes: t.LogBytes, CkptMS: t.CheckpointInterval.Milliseconds(),
		}
		for _, in := range t.Inputs {
			nt.Inputs = append(nt.Inputs, store.NewInput{Name: in.File, From: in.Task, Output: in.Output})
		}
		if t.Stdin != nil {
			if t.Stdin.Source != nil {
				nt.Inputs = append(nt.Inputs, store.NewInput{Name: "", From: t.Stdin.Source.Task, Output: t.Stdin.Source.Output})
			} else {
				nt.Stdin = []byte(t.Stdin.Data)
			}
		}
		if t.HasSetup() {
			setup, err := toSetup(&t, blobs, token)
			if err != nil {
				return nil, err
			}
			if nt.Setup, err = json.Marshal(setup); err != nil {
				return nil, err
			}
			for _, f := range t.Files {
				if f.Source != nil {
					// An upstream output at a path: an input named by it.
					nt.Inputs = append(nt.Inputs, store.NewInput{Name: f.Path, From: f.Source.Task, Output: f.Source.Output})
				}
			}
		}
		nw.Tasks[i] = nt
	}
	nw.Blobs = spec.BlobIDs()
	return nw, nil
}

// taskSeed returns the seed of the deterministic clocks and random source
// of task i of workflow wf: FNV-1a of "wf\x00i\x00task" (i in decimal),
// halved to fit a bigint. It appends to buf (returned for reuse) rather
// than formatting with fmt, which took 10-20 ms of a 20,000-task
// submission.
func taskSeed(buf []byte, wf string, i int, task string) (int64, []byte) {
	buf = append(buf[:0], wf...)
	buf = append(buf, 0)
	buf = strconv.AppendInt(buf, int64(i), 10)
	buf = append(buf, 0)
	buf = append(buf, task...)
	h := fnv.New64a()
	h.Write(buf)
	return int64(h.Sum64() >> 1), buf
}

func (s *Server) handleList(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	offset, _ := strconv.Atoi(q.Get("offset"))
	// A state no workflow can be in is refused, not answered with an
	// empty list that reads as "none" (a typo, or a task's state such
	// as "ready").
	switch state := q.Get("state"); state {
	case "", store.StateRunning, store.StateDone, store.StateFailed, store.StateCancelled:
	default:
		writeError(w, http.StatusBadRequest, "state must be running, done, failed or cancelled, got %q", state)
		return
	}
	prefix := q.Get("id_prefix")
	if prefix != "" && !store.ValidIDPrefix(prefix) {
		writeError(w, http.StatusBadRequest, "id_prefix must be 1 to 36 lower-case hex digits and dashes, got %q", prefix)
		return
	}
	ws, total, err := s.store.List(r.Context(), owner.ID, store.ListOptions{State: q.Get("state"), Query: q.Get("q"), Prefix: prefix,
		Limit: limit, Offset: max(offset, 0)})
	if err != nil {
		s.serverError(w, "list workflows", err)
		return
	}
	writeJSON(w, http.StatusOK, apiWorkflows(ws, total))
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	wait, ok := parseWait(w, r)
	if !ok {
		return
	}
	if r.URL.Query().Get("wait") != "" {
		read, err := s.waitFinished(r.Context(), owner.ID, r.PathValue("id"), wait)
		if err != nil {
			s.notFoundOr(w, "workflow", err)
			return
		}
		s.writeStatus(w, r, owner, r.PathValue("id"), read)
		return
	}
	s.writeStatus(w, r, owner, r.PathValue("id"), nil)
}

// writeStatus answers with the status object of the owner's workflow id:
// read, when a completion read it for a waiter, else read now.
func (s *Server) writeStatus(w http.ResponseWriter, r *http.Request, owner store.Owner, id string, read *store.FinishedStatus) {
	st, err := s.statusOf(r.Context(), owner, id, read)
	if err != nil {
		s.notFoundOr(w, "workflow", err)
		return
	}
	writeJSON(w, http.StatusOK, apiStatus(st))
}

// statusOf returns the status of the owner's workflow id, with its
// efficiency and the server's notice: read, when a completion read it for
// a waiter, else read now.
func (s *Server) statusOf(ctx context.Context, owner store.Owner, id string, read *store.FinishedStatus) (*store.WorkflowStatus, error) {
	var st *store.WorkflowStatus
	var spans []store.AttemptSpan
	if read != nil {
		cp := *read.Status // shared with the workflow's other waiters
		st, spans = &cp, read.Spans
	} else {
		var err error
		if st, spans, err = s.store.StatusAndSpans(ctx, owner.ID, id); err != nil {
			return nil, err
		}
	}
	st.Efficiency, st.SuggestedParallelism = efficiency(spans)
	st.Notice = s.notice()
	if st.Notice == "" {
		st.Notice = s.replicaNotice(ctx, st)
	}
	return st, nil
}

// replicaNotice says why a replicated workflow's ready tasks wait, when
// fewer workers are connected than each task needs distinct workers
// (replicas or quorum): nothing else would tell its owner, who sees the
// tasks ready and the one worker idle.
func (s *Server) replicaNotice(ctx context.Context, st *store.WorkflowStatus) string {
	need := max(st.Replicas, st.Quorum)
	if need < 2 || st.State != store.StateRunning || st.Counts.Ready == 0 {
		return ""
	}
	n, err := s.fleet.count(ctx, s.store.ConnectedWorkers)
	if err != nil || n >= need {
		return ""
	}
	return fmt.Sprintf("each task runs on %d distinct workers (replicas %d, quorum %d), and %d %s connected: "+
		"its ready tasks wait for more workers", need, st.Replicas, st.Quorum, n, plural(n, "worker is", "workers are"))
}

// plural is one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// fleetCount keeps the number of workers connected to any replica for a
// few seconds: status reads of replicated workflows ask for it.
type fleetCount struct {
	mu   sync.Mutex
	n    int
	read time.Time
}

// fleetCountFor is how long a count of connected workers is used.
const fleetCountFor = 5 * time.Second

// count returns the count read within fleetCountFor, or reads it anew (not
// under the lock: a slow read holds no other request past its deadline).
func (f *fleetCount) count(ctx context.Context, read func(context.Context) (int, error)) (int, error) {
	f.mu.Lock()
	n, at := f.n, f.read
	f.mu.Unlock()
	if !at.IsZero() && time.Since(at) < fleetCountFor {
		return n, nil
	}
	n, err := read(ctx)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	f.n, f.read = n, time.Now()
	f.mu.Unlock()
	return n, nil
}

// parseWait reads the wait query parameter of a long poll: 0 when absent;
// ok false once it answered a bad one.
func parseWait(w http.ResponseWriter, r *http.Request) (wait time.Duration, ok bool) {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return 0, true
	}
	wait, err := time.ParseDuration(v)
	if err != nil || wait < 0 || wait > maxStatusWait {
		writeError(w, http.StatusBadRequest, "wait must be a duration from 0s to %v, such as 30s or 500ms; got %q", maxStatusWait, v)
		return 0, false
	}
	return wait, true
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	id := r.PathValue("id")
	attempts, err := s.store.Cancel(r.Context(), owner.ID, id)
	if err != nil {
		s.notFoundOr(w, "workflow", err)
		return
	}
	s.log.Info("workflow cancelled", "workflow", id, "running_attempts", len(attempts))
	st, err := s.store.Status(r.Context(), owner.ID, id)
	if err != nil {
		s.notFoundOr(w, "workflow", err)
		return
	}
	writeJSON(w, http.StatusOK, apiStatus(st))
}

// handleDelete deletes a workflow that has ended, with everything it holds
// (store.DeleteWorkflow): 204; 409 while it runs, 404 when the owner has
// no such workflow.
func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	id := r.PathValue("id")
	err := s.store.DeleteWorkflow(r.Context(), owner.ID, id)
	if errors.Is(err, store.ErrWorkflowRunning) {
		writeError(w, http.StatusConflict, "workflow %s: %v", id, err)
		return
	}
	if err != nil {
		s.notFoundOr(w, "workflow", err)
		return
	}
	s.log.Info("workflow deleted", "workflow", id, "owner", owner.Name)
	w.WriteHeader(http.StatusNoContent)
}

// handleCancelTask cancels one unfinished task (store.CancelTask): its
// running attempts are stopped on their workers like those of a cancelled
// workflow, its descendants end upstream_failed. A finished task answers
// 409 and nothing changes.
func (s *Server) handleCancelTask(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	id, task := r.PathValue("id"), r.PathValue("task")
	attempts, err := s.store.CancelTask(r.Context(), owner.ID, id, task)
	if errors.Is(err, store.ErrTaskFinished) {
		writeJSON(w, http.StatusConflict, api.Error{Error: err.Error(), Task: task})
		return
	}
	if err != nil {
		s.notFoundOr(w, "task", err)
		return
	}
	s.log.Info("task cancelled", "workflow", id, "task", task, "running_attempts", len(attempts))
	st, err := s.store.Status(r.Context(), owner.ID, id)
	if err != nil {
		s.notFoundOr(w, "workflow", err)
		return
	}
	writeJSON(w, http.StatusOK, apiStatus(st))
}

func (s *Server) handleAttempts(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	as, err := s.store.Attempts(r.Context(), owner.ID, r.PathValue("id"), r.PathValue("task"))
	if err != nil {
		s.notFoundOr(w, "task", err)
		return
	}
	writeJSON(w, http.StatusOK, apiAttempts(as))
}

func (s *Server) handleLog(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	log, err := s.store.Log(r.Context(), owner.ID, r.PathValue("id"), r.PathValue("task"))
	if err != nil {
		s.notFoundOr(w, "task", err)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write(log)
}

func (s *Server) handleOutput(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	data, blob, err := s.store.Output(r.Context(), owner.ID, r.PathValue("id"), r.PathValue("task"), r.PathValue("output"))
	if err != nil {
		s.notFoundOr(w, "output", err)
		return
	}
	if blob != "" {
		// Uploaded over HTTP: streamed from its chunks, with ranges.
		s.serveBlob(w, r, blob, outputCache)
		return
	}
	// Kept in the database: answered as a blob is (serveBlob), with
	// ranges, and the id its bytes would have as a blob as its ETag, so
	// that If-Range and If-None-Match mean the same on both paths.
	sum := sha256.Sum256(data)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", outputCache)
	w.Header().Set("ETag", `"sha256:`+hex.EncodeToString(sum[:])+`"`)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}

// handleEvents streams a workflow's changes as Server-Sent Events. It reads
// the database (every replica sees every change there) a few times a second
// and sends what changed since the last look.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request, owner store.Owner) {
	ctx := r.Context()
	id := r.PathValue("id")
	if !s.streams.begin(owner.ID) {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusTooManyRequests, "too many event streams open (%d at most for one owner): close one, or poll GET /api/v1/workflows/%s?wait=", MaxOwnerStreams, id)
		return
	}
	defer s.streams.end(owner.ID)
	// The end of the workflow is told at once, not at the next look: the
	// stream waits for it from before each look at the workflow's state, so
	// that an end between the look and the wait is not missed.
	woken, forget := s.ends.add(strings.ToLower(id)) // as the database writes it in notifications
	defer func() { forget() }()
	st, err := s.store.Status(ctx, owner.ID, id)
	if err != nil {
		s.notFoundOr(w, "workflow", err)
		return
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		writeError(w, http.StatusInternalServerError, "streaming unsupported")
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	send := func(event string, v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}
	if err := send("status", apiStatus(st)); err != nil {
		return
	}
	type seen struct {
		state       string
		attempts    int
		progress    float64
		checkpoints int
		worker      string
	}
	last := map[string]seen{}
	since := time.Time{}
	for _, t := range st.Tasks {
		last[t.Name] = seen{t.State, t.Attempts, t.Progress, t.Checkpoints, t.Worker}
		if t.UpdatedAt.After(since) {
			since = t.UpdatedAt
		}
	}
	state := st.State
	tick := time.NewTicker(eventPollInterval(len(st.Tasks)))
	defer tick.Stop()
	keepalive := time.Now()
	for state == store.StateRunning {
		select {
		case <-ctx.Done():
			return
		case <-s.ctx.Done():
			return
		case <-tick.C:
		case <-woken:
		}
		forget()
		woken, forget = s.ends.add(strings.ToLower(id))
		// The workflow's state before its tasks' changes: the transaction
		// that ends a workflow also ends its last task, so once the state
		// read says it ended, the changes read after it hold every task's
		// end. Read the other way round, a task ending between the two
		// reads was never sent, and a page waiting for it waited forever.
		next, err := s.store.WorkflowState(ctx, id)
		if err != nil {
			return
		}
		changes, err := s.store.TaskChanges(ctx, id, since.Add(-time.Second))
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("read task changes", "workflow", id, "err", err)
			}
			continue
		}
		for _, t := range changes {
			if t.UpdatedAt.After(since) {
				since = t.UpdatedAt
			}
			now := seen{t.State, t.Attempts, t.Progress, t.Checkpoints, t.Worker}
			old := last[t.Name]
			if old.state == now.state && old.attempts == now.attempts && old.checkpoints == now.checkpoints &&
				old.worker == now.worker && absDiff(old.progress, now.progress) < 0.005 {
				continue
			}
			last[t.Name] = now
			if err := send("task", apiTaskChange(&t)); err != nil {
				return
			}
			keepalive = time.Now()
		}
		state = next
		if time.Since(keepalive) > 15*time.Second {
			if _, err := io.WriteString(w, ": keepalive\n\n"); err != nil {
				return
			}
			fl.Flush()
			keepalive = time.Now()
		}
	}
	_ = send("workflow", api.WorkflowChange{ID: id, State: state})
}

// MaxOwnerStreams bounds the event streams one owner holds open at once
// on one replica: each reads its workflow's changes a few times a second
// and keeps every task's last state (a megabyte for 10,000 tasks).
const MaxOwnerStreams = 32

// ownerStreams counts the event streams open, per owner.
type ownerStreams struct {
	mu sync.Mutex
	n  map[int64]int
}

// begin reserves a stream for owner, or reports false when it has
// MaxOwnerStreams open.
func (o *ownerStreams) begin(owner int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[int64]int{}
	}
	if o.n[owner] >= MaxOwnerStreams {
		return false
	}
	o.n[owner]++
	return true
}

func (o *ownerStreams) end(owner int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n[owner]--; o.n[owner] <= 0 {
		delete(o.n, owner)
	}
}

// maxStatusWait bounds the long poll of GET /api/v1/workflows/{id}?wait=.
const maxStatusWait = 60 * time.Second

// waitFinished returns once the owner's workflow id is in a final state,
// or after wait, or when the request or the server ends, whichever comes
// first; only a failure to read the workflow (ErrNotFound included) is an
// error. It wakes on the database's notification that a workflow finished
// (ChannelFinished), heard by this replica's listener whichever replica
// finished it, or sooner when this replica's completion batch finished it:
// then with the workflow's status when the batch read it, which it
// returns. (The waiter is watched from before the look, so that a batch
// that begins meanwhile reads the status too; a status read for a workflow
// the look does not find the owner's is dropped unread.)
func (s *Server) waitFinished(ctx context.Context, ownerID int64, id string, wait time.Duration) (*store.FinishedStatus, error) {
	lower := strings.ToLower(id) // as the database writes it in notifications
	woken, forget := s.ends.addWatching(lower)
	return s.waitAdded(ctx, ownerID, id, wait, woken, forget, true)
}

// waitAdded is waitFinished for a waiter of id already added (and
// watched): woken, forget; without look, for a workflow of the owner's
// written since the waiter was added, it waits without a first look.
func (s *Server) waitAdded(ctx context.Context, ownerID int64, id string, wait time.Duration, woken <-chan wake, forget func(), look bool) (
	*store.FinishedStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	lower := strings.ToLower(id)
	for {
		// Registered before the look, so a workflow that finishes
		// between the two still wakes this waiter. Without look (the
		// owner's workflow just written), the first look is skipped.
		if look {
			w, err := s.store.Summary(ctx, ownerID, id)
			if err != nil || w.State != store.StateRunning {
				var read *store.FinishedStatus
				if err == nil { // the owner's: a batch that ended it meanwhile may have read its status
					select {
					case wk := <-woken:
						read = wk.status
					default:
					}
				}
				forget()
				if err != nil && ctx.Err() != nil && !errors.Is(err, store.ErrNotFound) {
					return nil, nil // the time is up: answer with the status as it is
				}
				return read, err
			}
		}
		look = true
		var wk wake
		select {
		case wk = <-woken:
		case <-ctx.Done():
		case <-s.ctx.Done():
		}
		forget()
		if wk.finished || ctx.Err() != nil || s.ctx.Err() != nil {
			return wk.status, nil
		}
		woken, forget = s.ends.addWatching(lower)
	}
}

// eventPollInterval is how often an event stream looks for changes in a
// workflow of n tasks: four times a second up to 2,500 tasks, then less
// often in proportion (a look reads every task's row: 2 ms for 10,000),
// at least every 2 seconds.
func eventPollInterval(n int) time.Duration {
	const base, perTasks, most = 250 * time.Millisecond, 2500, 2 * time.Second
	return min(base*time.Duration(max(1, (n+perTasks-1)/perTasks)), most)
}

func absDiff(a, b float64) float64 {
	if a > b {
		return a - b
	}
	return b - a
}

// ownedModule is a key of Server.knownModules.
type ownedModule struct {
	owner  int64
	module string
}

// knownModuleFor is how long missingModules trusts what it found: an
// owner may remove a module (DELETE /api/v1/modules/{id}) on another
// replica, which this one hears of no sooner.
const knownModuleFor = time.Minute

// forgetKnownModules drops what missingModules found longer than
// knownModuleFor before now: a submission would look it up again anyway,
// and modules an owner no longer names would otherwise stay for good.
func (s *Server) forgetKnownModules(now time.Time) {
	s.knownModules.Range(func(k, at any) bool {
		if now.Sub(at.(time.Time)) > knownModuleFor {
			s.knownModules.CompareAndDelete(k, at)
		}
		return true
	})
}

// missingModules returns the modules of list the owner has not pushed.
// What was found is remembered for knownModuleFor and not looked up again
// meanwhile; handleRemoveModule forgets it at once on this replica.
func (s *Server) missingModules(ctx context.Context, owner int64, list []string) ([]string, error) {
	var unknown []string
	now := time.Now()
	for _, m := range list {
		if at, ok := s.knownModules.Load(ownedModule{owner, m}); !ok || now.Sub(at.(time.Time)) > knownModuleFor {
			unknown = append(unknown, m)
		}
	}
	if len(unknown) == 0 {
		return nil, nil
	}
	missing, err := s.store.MissingModules(ctx, owner, unknown)
	if err != nil {
		return nil, err
	}
	for _, m := range unknown {
		if !slices.Contains(missing, m) {
			s.knownModules.Store(ownedModule{owner, m}, now)
		}
	}
	return missing, nil
}
