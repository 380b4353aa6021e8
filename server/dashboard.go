package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/workflow"
	"github.com/cyclepool/cyclepool/web/app"
)

// Dashboard returns the owners' dashboard (package web/app), mounted under
// /app/. It reaches the platform only through the REST API's own handlers
// (the same validation and rules as the CLI) and the store's owner-scoped
// reads.
//
// Sessions are signed with CYCLEPOOL_SESSION_KEY (hex, at least 32 bytes);
// replicas behind one load balancer must share it. Without it each process
// draws its own key, and a restart signs everyone out.
func (s *Server) Dashboard() http.Handler {
	key, _ := hex.DecodeString(os.Getenv("CYCLEPOOL_SESSION_KEY"))
	if len(key) < 32 {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
	}
	return app.New(dashboardBackend{s}, app.Options{Key: key, Logger: s.log})
}

// dashboardBackend is what the dashboard may use of the server.
type dashboardBackend struct{ s *Server }

func (d dashboardBackend) OwnerByToken(ctx context.Context, token string) (store.Owner, error) {
	if o, ok := d.s.owners.Load(token); ok {
		return o.(store.Owner), nil
	}
	o, err := d.s.store.OwnerByToken(ctx, token)
	if err == nil {
		d.s.owners.Store(token, o)
	}
	return o, err
}

// API is the REST API of docs/API.md with the owner taken from the
// request's context (app.WithOwner, set from the dashboard's session)
// instead of a bearer token: the very handlers the CLI talks to.
func (d dashboardBackend) API() http.Handler {
	s := d.s
	mux := http.NewServeMux()
	owned := func(h func(http.ResponseWriter, *http.Request, store.Owner)) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			o, ok := app.OwnerFrom(r.Context())
			if !ok {
				writeError(w, http.StatusUnauthorized, "not signed in")
				return
			}
			h(w, r, o)
		}
	}
	mux.HandleFunc("POST /api/v1/modules", owned(s.handlePushModule))
	mux.HandleFunc("GET /api/v1/modules", owned(s.handleModules))
	mux.HandleFunc("POST /api/v1/workflows", owned(s.handleSubmit))
	mux.HandleFunc("GET /api/v1/workflows", owned(s.handleList))
	mux.HandleFunc("GET /api/v1/workflows/{id}", owned(s.handleStatus))
	mux.HandleFunc("POST /api/v1/workflows/{id}/cancel", owned(s.handleCancel))
	mux.HandleFunc("GET /api/v1/workflows/{id}/events", owned(s.handleEvents))
	mux.HandleFunc("GET /api/v1/workflows/{id}/tasks/{task}/attempts", owned(s.handleAttempts))
	mux.HandleFunc("GET /api/v1/workflows/{id}/tasks/{task}/log", owned(s.handleLog))
	mux.HandleFunc("GET /api/v1/workflows/{id}/tasks/{task}/outputs/{output...}", owned(s.handleOutput))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: %s %s (see docs/API.md)", r.Method, r.URL.Path)
	})
	return mux
}

// CheckWorkflow runs the checks POST /api/v1/workflows makes before it
// writes anything (workflow.Parse, module paths, unknown modules), without
// submitting; the refusal names the task and field as the API's does.
func (d dashboardBackend) CheckWorkflow(ctx context.Context, owner store.Owner, body []byte) (*workflow.Spec, *workflow.Error, error) {
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
		return spec, &workflow.Error{Task: spec.Tasks[i].Name, Field: "module",
			Msg: fmt.Sprintf("module %q is a path: upload it on the Modules page and use its sha256: id", paths[0])}, nil
	}
	seen := map[string]bool{}
	var list []string
	for _, t := range spec.Tasks {
		if !seen[t.Module] {
			seen[t.Module] = true
			list = append(list, t.Module)
		}
	}
	missing, err := d.s.missingModules(ctx, owner.ID, list)
	if err != nil {
		return nil, nil, err
	}
	if len(missing) > 0 {
		i := firstTaskWithModule(spec, missing[0])
		return spec, &workflow.Error{Task: spec.Tasks[i].Name, Field: "module",
			Msg: fmt.Sprintf("unknown module %s: upload it on the Modules page first", missing[0])}, nil
	}
	return spec, nil, nil
}

func (d dashboardBackend) Status(ctx context.Context, owner store.Owner, id string) (*store.WorkflowStatus, error) {
	return d.s.store.Status(ctx, owner.ID, id)
}

func (d dashboardBackend) List(ctx context.Context, owner store.Owner, o store.ListOptions) ([]store.WorkflowStatus, int, error) {
	return d.s.store.List(ctx, owner.ID, o)
}

func (d dashboardBackend) Modules(ctx context.Context, owner store.Owner) ([]store.Module, error) {
	return d.s.store.Modules(ctx, owner.ID)
}

// ModuleUse maps each of the owner's modules to the names of the owner's
// workflows (newest first, at most 5) whose tasks run it.
func (d dashboardBackend) ModuleUse(ctx context.Context, owner store.Owner) (map[string][]string, error) {
	rows, err := d.s.store.Pool().Query(ctx, `SELECT module_id, (array_agg(name ORDER BY created_at DESC))[1:5] FROM (
			SELECT DISTINCT t.module_id, w.name, w.created_at FROM workflows w JOIN tasks t ON t.workflow_id = w.id WHERE w.owner_id = $1
		) u GROUP BY module_id`, owner.ID)
	if err != nil {
		return nil, fmt.Errorf("module use: %w", err)
	}
	defer rows.Close()
	use := map[string][]string{}
	for rows.Next() {
		var m string
		var names []string
		if err := rows.Scan(&m, &names); err != nil {
			return nil, fmt.Errorf("module use: %w", err)
		}
		use[m] = names
	}
	return use, rows.Err()
}

// Edges returns the DAG's edges (upstream task name, downstream task name)
// of one of the owner's workflows.
func (d dashboardBackend) Edges(ctx context.Context, owner store.Owner, id string) ([][2]string, error) {
	rows, err := d.s.store.Pool().Query(ctx, `SELECT DISTINCT f.name, t.name FROM workflows w
		JOIN tasks t ON t.workflow_id = w.id JOIN task_inputs i ON i.task_id = t.id JOIN tasks f ON f.id = i.from_task
		WHERE w.id = $1 AND w.owner_id = $2`, id, owner.ID)
	if err != nil {
		return nil, fmt.Errorf("workflow edges: %w", err)
	}
	defer rows.Close()
	var edges [][2]string
	for rows.Next() {
		var e [2]string
		if err := rows.Scan(&e[0], &e[1]); err != nil {
			return nil, fmt.Errorf("workflow edges: %w", err)
		}
		edges = append(edges, e)
	}
	return edges, rows.Err()
}

// Workers lists the connected workers. Task names are shown only for the
// owner's own workflows.
func (d dashboardBackend) Workers(ctx context.Context, owner store.Owner) ([]app.Worker, error) {
	rows, err := d.s.store.Pool().Query(ctx, `SELECT w.id::text, w.kind, w.slots, w.device, w.connected_at, w.last_seen, w.tasks_lost,
			(SELECT count(*) FROM attempts a WHERE a.worker_id = w.id AND a.state = 'succeeded'),
			COALESCE((SELECT array_agg(CASE WHEN wf.owner_id = $1 THEN wf.name || ' / ' || t.name ELSE '(another project)' END)
				FROM attempts a JOIN tasks t ON t.id = a.task_id JOIN workflows wf ON wf.id = t.workflow_id
				WHERE a.worker_id = w.id AND a.state = 'running'), '{}')
		FROM workers w WHERE w.connected ORDER BY w.connected_at`, owner.ID)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	defer rows.Close()
	var ws []app.Worker
	for rows.Next() {
		var w app.Worker
		var dev []byte
		if err := rows.Scan(&w.ID, &w.Kind, &w.Slots, &dev, &w.ConnectedAt, &w.LastSeen, &w.Lost, &w.Done, &w.Running); err != nil {
			return nil, fmt.Errorf("list workers: %w", err)
		}
		_ = json.Unmarshal(dev, &w.Device)
		ws = append(ws, w)
	}
	return ws, rows.Err()
}
