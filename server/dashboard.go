package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/cyclepool/cyclepool/api"
	"github.com/cyclepool/cyclepool/internal/store"
	"github.com/cyclepool/cyclepool/internal/workflow"
	"github.com/cyclepool/cyclepool/web/app"
)

// Dashboard returns the owners' dashboard (package web/app), mounted under
// /app/. It reaches the platform only through the REST API's own handlers
// (the same validation and rules as the CLI) and the store's owner-scoped
// reads.
//
// Sessions are signed with Config.SessionKey; replicas behind one load
// balancer must share it. Without it each process draws its own key, and a
// restart signs everyone out.
func (s *Server) Dashboard() http.Handler {
	key := s.cfg.SessionKey
	if len(key) == 0 {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
	}
	return app.New(dashboardBackend{s}, app.Options{Key: key, Logger: s.log, Failures: s.failures})
}

// dashboardBackend is what the dashboard may use of the server.
type dashboardBackend struct{ s *Server }

// OwnerByToken resolves an owner token as the API's bearer auth does (and
// shares its cache).
func (d dashboardBackend) SessionGeneration(ctx context.Context, owner int64) (int64, error) {
	return d.s.store.SessionGeneration(ctx, owner)
}

func (d dashboardBackend) EndSessions(ctx context.Context, owner int64) error {
	return d.s.store.EndSessions(ctx, owner)
}

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
	owned := func(h ownerHandler) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			o, ok := app.OwnerFrom(r.Context())
			if !ok {
				writeError(w, http.StatusUnauthorized, "not signed in")
				return
			}
			h(w, r, o)
		}
	}
	s.routeAPI(mux, owned)
	return mux
}

// SubmissionTurn waits for a submission's turn (Server.submissions) for
// the dashboard's workflow page, which reads the file, checks it and
// submits it through the API with the turn it holds.
func (d dashboardBackend) SubmissionTurn(ctx context.Context, owner store.Owner, size int64) (context.Context, func(), error) {
	release, err := d.s.submissions.acquire(ctx, owner.ID, size)
	if err != nil {
		return ctx, nil, err
	}
	return context.WithValue(ctx, heldSubmissionTurn{}, true), release, nil
}

// heldSubmissionTurn marks the context of a submission whose caller holds
// its turn already (SubmissionTurn).
type heldSubmissionTurn struct{}

// CheckWorkflow runs the very checks POST /api/v1/workflows makes before
// it writes anything (Server.checkSubmission), without submitting.
func (d dashboardBackend) CheckWorkflow(ctx context.Context, owner store.Owner, body []byte) (*workflow.Spec, *workflow.Error, error) {
	spec, _, we, err := d.s.checkSubmission(ctx, owner, body)
	return spec, we, err
}

// Status is the workflow's status, as GET /api/v1/workflows/{id} shows it.
func (d dashboardBackend) Status(ctx context.Context, owner store.Owner, id string) (*api.Status, error) {
	st, err := d.s.store.Status(ctx, owner.ID, id)
	if err != nil {
		return nil, err
	}
	st.Notice = d.s.notice()
	a := apiStatus(st)
	return &a, nil
}

// List is the owner's workflows, as GET /api/v1/workflows lists them.
func (d dashboardBackend) List(ctx context.Context, owner store.Owner, o store.ListOptions) ([]api.Status, int, error) {
	ws, total, err := d.s.store.List(ctx, owner.ID, o)
	return apiWorkflows(ws, total).Workflows, total, err
}

// Modules is the owner's modules.
func (d dashboardBackend) Modules(ctx context.Context, owner store.Owner) ([]api.Module, error) {
	ms, err := d.s.store.Modules(ctx, owner.ID)
	return apiModules(ms).Modules, err
}

// Blobs is the owner's data blobs.
func (d dashboardBackend) Blobs(ctx context.Context, owner store.Owner) ([]api.Blob, error) {
	bs, err := d.s.store.Blobs(ctx, owner.ID)
	return apiBlobs(bs).Blobs, err
}

// ModuleUse maps each of the owner's modules to the names of the owner's
// workflows (newest first, at most 5) whose tasks run it.
func (d dashboardBackend) ModuleUse(ctx context.Context, owner store.Owner) (map[string][]string, error) {
	return d.s.store.ModuleUse(ctx, owner.ID)
}

// Edges returns the DAG's edges (upstream task name, downstream task name)
// of one of the owner's workflows.
func (d dashboardBackend) Edges(ctx context.Context, owner store.Owner, id string) ([][2]string, error) {
	return d.s.store.Edges(ctx, owner.ID, id)
}

// activityMinutes is how far back the volunteers page plots.
const activityMinutes = 60

// Volunteers is the volunteers page's data: the workers as GET
// /api/v1/workers shows them (stability class and fairness included), with
// their tasks (named only for the owner's own workflows) and the last
// hour's activity.
func (d dashboardBackend) Volunteers(ctx context.Context, owner store.Owner) (app.Volunteers, error) {
	rep, err := d.s.workers(ctx)
	if err != nil {
		return app.Volunteers{}, err
	}
	tasks, err := d.s.store.WorkerTasks(ctx, owner.ID)
	if err != nil {
		return app.Volunteers{}, err
	}
	act, err := d.s.store.Activity(ctx, activityMinutes)
	if err != nil {
		return app.Volunteers{}, err
	}
	v := app.Volunteers{FairnessStrategy: rep.Fairness.Strategy, Variance: rep.Fairness.VarianceTasksDone, Activity: apiActivity(act).Minutes,
		Workers: make([]app.Worker, 0, len(rep.Workers))}
	for _, wv := range rep.Workers {
		w := app.Worker{ID: wv.ID, Kind: wv.Kind, Slots: wv.Slots, ConnectedAt: wv.ConnectedAt, LastSeen: wv.LastSeen,
			Lost: wv.TasksLost, Done: tasks[wv.ID].Succeeded, Running: tasks[wv.ID].Running, DoneHere: wv.TasksDone}
		_ = json.Unmarshal(wv.Device, &w.Device)
		if wv.Stability != nil {
			w.Stability, w.Reasons = wv.Stability.Class, wv.Stability.Reasons
		}
		v.Workers = append(v.Workers, w)
	}
	slices.SortStableFunc(v.Workers, func(a, b app.Worker) int { return a.ConnectedAt.Compare(b.ConnectedAt) })
	return v, nil
}
