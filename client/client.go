// Package client is the Go client library for cyclepool owners: it pushes
// WebAssembly modules, submits workflows, follows their progress and fetches
// their results through the REST API described in docs/API.md. The cyclepool
// CLI is a thin layer over it, and programs that submit batch after batch can
// use it directly:
//
//	c := client.New("http://localhost:8080", token)
//	sub, err := c.SubmitFile(ctx, "primes.json")
//	st, err := c.Wait(ctx, sub.ID)
//	err = c.Results(ctx, sub.ID, "out")
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultUserAgent is the User-Agent sent unless WithUserAgent says otherwise.
const DefaultUserAgent = "cyclepool-client/1"

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// Client talks to one cyclepool server on behalf of one owner. It is safe for
// concurrent use.
type Client struct {
	base      string
	token     string
	http      *http.Client
	userAgent string
	poll      time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests through hc. Do not set a
// Timeout on hc if you use Events, Watch or Wait: the event stream is long
// lived; bound calls with their context instead.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.http = hc
		}
	}
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// WithPollInterval sets the longest pause between two status polls while
// Watch or Wait has lost the event stream (default 5s). The first retry
// comes sooner, and the pause doubles up to this value.
func WithPollInterval(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.poll = d
		}
	}
}

// New returns a Client for the server at the given base URL (for example
// "http://localhost:8080"; "http://" is assumed when no scheme is given)
// using the owner token (sent as a Bearer token; none when empty).
func New(server, token string, opts ...Option) *Client {
	server = strings.TrimRight(strings.TrimSpace(server), "/")
	if server != "" && !strings.Contains(server, "://") {
		server = "http://" + server
	}
	c := &Client{
		base:      server,
		token:     token,
		http:      &http.Client{},
		userAgent: DefaultUserAgent,
		poll:      5 * time.Second,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Server returns the base URL the Client talks to.
func (c *Client) Server() string { return c.base }

// APIError is an error answer (4xx or 5xx) from the server.
type APIError struct {
	Status  int    // HTTP status code
	Message string // the server's "error" text (or the response body)
	Task    string // the workflow task the error points into, if any
	Field   string // the field of that task, if any
}

// Error formats the error as "<message> (task "t", field "f", HTTP 400)".
func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = strings.ToLower(http.StatusText(e.Status))
	}
	var where []string
	if e.Task != "" {
		where = append(where, "task "+strconv.Quote(e.Task))
	}
	if e.Field != "" {
		where = append(where, "field "+strconv.Quote(e.Field))
	}
	where = append(where, "HTTP "+strconv.Itoa(e.Status))
	return msg + " (" + strings.Join(where, ", ") + ")"
}

// IsNotFound reports whether err is an APIError with status 404: the
// workflow, task, output or module does not exist or belongs to someone else.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusNotFound
}

// decodeError turns a non-2xx response into an *APIError.
func decodeError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &APIError{Status: resp.StatusCode}
	var doc struct {
		Error string `json:"error"`
		Task  string `json:"task"`
		Field string `json:"field"`
	}
	if json.Unmarshal(body, &doc) == nil && doc.Error != "" {
		e.Message, e.Task, e.Field = doc.Error, doc.Task, doc.Field
	} else {
		e.Message = strings.TrimSpace(string(body))
	}
	return e
}

// pathOf joins escaped path segments under the API root.
func pathOf(segments ...string) string {
	var b strings.Builder
	b.WriteString("/api/v1")
	for _, s := range segments {
		b.WriteByte('/')
		b.WriteString(url.PathEscape(s))
	}
	return b.String()
}

// do sends a request to path (already escaped, with an optional query) and
// returns the response when its status is 2xx; otherwise an *APIError.
func (c *Client) do(ctx context.Context, method, path string, body io.Reader, contentType, accept string) (*http.Response, error) {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	if accept != "" {
		h.Set("Accept", accept)
	}
	resp, err := c.send(ctx, method, path, body, h)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// send sends a request with the client's token and user agent and the
// headers h, and returns the answer whatever its status.
func (c *Client) send(ctx context.Context, method, path string, body io.Reader, h http.Header) (*http.Response, error) {
	if c.base == "" {
		return nil, errors.New("no server URL")
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	return c.http.Do(req)
}

// doJSON sends a request and decodes a JSON answer into out (if non-nil). It
// returns the raw answer too.
func (c *Client) doJSON(ctx context.Context, method, path string, body io.Reader, contentType string, out any) ([]byte, error) {
	resp, err := c.do(ctx, method, path, body, contentType, "application/json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read answer: %w", err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("decode answer: %w", err)
		}
	}
	return raw, nil
}

// PushModule uploads a WebAssembly module. The server validates it and
// answers with its content-addressed id; pushing the same bytes twice gives
// the same Module.
func (c *Client) PushModule(ctx context.Context, wasm []byte) (Module, error) {
	return c.PushModuleNamed(ctx, "", wasm)
}

// PushModuleNamed is PushModule for a module whose file name the owner's
// lists show beside its id.
func (c *Client) PushModuleNamed(ctx context.Context, name string, wasm []byte) (Module, error) {
	m, err := c.pushModule(ctx, name, wasm)
	if err != nil {
		return Module{}, fmt.Errorf("push module: %w", err)
	}
	return m, nil
}

func (c *Client) pushModule(ctx context.Context, name string, wasm []byte) (Module, error) {
	var m Module
	p := pathOf("modules")
	if name != "" {
		p += "?name=" + url.QueryEscape(name)
	}
	_, err := c.doJSON(ctx, http.MethodPost, p, bytes.NewReader(wasm), "application/wasm", &m)
	return m, err
}

// Modules lists the owner's modules.
func (c *Client) Modules(ctx context.Context) ([]Module, error) {
	var doc struct {
		Modules []Module `json:"modules"`
	}
	if _, err := c.doJSON(ctx, http.MethodGet, pathOf("modules"), nil, "", &doc); err != nil {
		return nil, fmt.Errorf("list modules: %w", err)
	}
	return doc.Modules, nil
}

// RemoveModule takes a module off the owner's list (and out of its data
// quota); workflows that use it keep it until they are deleted. A module
// the owner has not pushed is an error (HTTP 404).
func (c *Client) RemoveModule(ctx context.Context, id string) error {
	resp, err := c.do(ctx, http.MethodDelete, pathOf("modules", id), nil, "", "")
	if err != nil {
		return fmt.Errorf("remove module %s: %w", id, err)
	}
	resp.Body.Close()
	return nil
}

// Submit submits a workflow file whose every module is already a module id
// (see SubmitFile for files that name modules by path). The bytes are sent
// as they are; the server judges them.
func (c *Client) Submit(ctx context.Context, workflowJSON []byte) (Submitted, error) {
	s, err := c.submit(ctx, workflowJSON)
	if err != nil {
		return Submitted{}, fmt.Errorf("submit workflow: %w", err)
	}
	return s, nil
}

// SubmitAndWait submits a workflow whose modules are ids and waits for
// its end, as StatusWhenFinished does, in one request (POST
// /api/v1/workflows?wait=): it returns the workflow's status once it has
// reached a final state, or after wait (at most a minute) with it still
// running. For interactive work, this saves a request: the answer comes
// as the workflow ends.
func (c *Client) SubmitAndWait(ctx context.Context, workflowJSON []byte, wait time.Duration) (*Status, error) {
	st, err := c.submitAndWait(ctx, workflowJSON, wait)
	if err != nil {
		return nil, fmt.Errorf("submit workflow: %w", err)
	}
	return st, nil
}

func (c *Client) submitAndWait(ctx context.Context, workflowJSON []byte, wait time.Duration) (*Status, error) {
	var st Status
	path := pathOf("workflows") + "?wait=" + url.QueryEscape(wait.String())
	if _, err := c.doJSON(ctx, http.MethodPost, path, bytes.NewReader(workflowJSON), "application/json", &st); err != nil {
		return nil, err
	}
	return &st, nil
}

func (c *Client) submit(ctx context.Context, workflowJSON []byte) (Submitted, error) {
	var s Submitted
	_, err := c.doJSON(ctx, http.MethodPost, pathOf("workflows"), bytes.NewReader(workflowJSON), "application/json", &s)
	return s, err
}

// Status returns a workflow's status object.
func (c *Client) Status(ctx context.Context, id string) (*Status, error) {
	var st Status
	if _, err := c.doJSON(ctx, http.MethodGet, pathOf("workflows", id), nil, "", &st); err != nil {
		return nil, fmt.Errorf("status of workflow %s: %w", id, err)
	}
	return &st, nil
}

// StatusWhenFinished returns a workflow's status object once the workflow
// has reached a final state, or after wait (at most a minute) with the
// workflow still running, whichever comes first: one long-polling request
// (GET /api/v1/workflows/{id}?wait=), answered as soon as the server hears
// that the workflow ended. Check Status.Finished to tell the two apart.
func (c *Client) StatusWhenFinished(ctx context.Context, id string, wait time.Duration) (*Status, error) {
	var st Status
	path := pathOf("workflows", id) + "?wait=" + url.QueryEscape(wait.String())
	if _, err := c.doJSON(ctx, http.MethodGet, path, nil, "", &st); err != nil {
		return nil, fmt.Errorf("status of workflow %s: %w", id, err)
	}
	return &st, nil
}

// StatusJSON returns a workflow's status object exactly as the server sent it.
func (c *Client) StatusJSON(ctx context.Context, id string) (json.RawMessage, error) {
	raw, err := c.doJSON(ctx, http.MethodGet, pathOf("workflows", id), nil, "", nil)
	if err != nil {
		return nil, fmt.Errorf("status of workflow %s: %w", id, err)
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("status of workflow %s: answer is not JSON", id)
	}
	return raw, nil
}

// List returns one page of the owner's workflows, newest first. Summaries
// carry no tasks.
func (c *Client) List(ctx context.Context, opts ListOptions) (WorkflowList, error) {
	q := url.Values{}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Offset > 0 {
		q.Set("offset", strconv.Itoa(opts.Offset))
	}
	if opts.Query != "" {
		q.Set("q", opts.Query)
	}
	if opts.IDPrefix != "" {
		q.Set("id_prefix", opts.IDPrefix)
	}
	p := pathOf("workflows")
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var l WorkflowList
	if _, err := c.doJSON(ctx, http.MethodGet, p, nil, "", &l); err != nil {
		return WorkflowList{}, fmt.Errorf("list workflows: %w", err)
	}
	return l, nil
}

// ResolveID returns the id of the owner's one workflow whose id is id or
// starts with it (as git and docker take a unique prefix): an error says
// when none does or several do.
func (c *Client) ResolveID(ctx context.Context, id string) (string, error) {
	id = strings.ToLower(id)
	if len(id) == 36 {
		return id, nil
	}
	l, err := c.List(ctx, ListOptions{IDPrefix: id, Limit: 3})
	if err != nil {
		return "", err
	}
	switch {
	case l.Total == 0:
		return "", fmt.Errorf("no workflow of yours has an id that starts with %q", id)
	case l.Total > 1:
		var ids []string
		for _, w := range l.Workflows {
			ids = append(ids, w.ID)
		}
		return "", fmt.Errorf("%q starts the ids of %d workflows (%s…): give more of the id", id, l.Total, strings.Join(ids, ", "))
	}
	return l.Workflows[0].ID, nil
}

// Attempts returns every attempt of one task of a workflow.
func (c *Client) Attempts(ctx context.Context, id, task string) ([]Attempt, error) {
	var doc struct {
		Attempts []Attempt `json:"attempts"`
	}
	if _, err := c.doJSON(ctx, http.MethodGet, pathOf("workflows", id, "tasks", task, "attempts"), nil, "", &doc); err != nil {
		return nil, fmt.Errorf("attempts of task %s of workflow %s: %w", task, id, err)
	}
	return doc.Attempts, nil
}

// Output opens one output of a done task. The caller must close it. Output
// names may contain "/" (files the task wrote in subdirectories of /out);
// they are sent as one escaped path segment.
func (c *Client) Output(ctx context.Context, id, task, output string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, pathOf("workflows", id, "tasks", task, "outputs", output), nil, "", "")
	if err != nil {
		return nil, fmt.Errorf("output %s of task %s of workflow %s: %w", output, task, id, err)
	}
	return resp.Body, nil
}

// Log returns the log (stderr of the latest finished attempt) of a task.
func (c *Client) Log(ctx context.Context, id, task string) (string, error) {
	resp, err := c.do(ctx, http.MethodGet, pathOf("workflows", id, "tasks", task, "log"), nil, "", "")
	if err != nil {
		return "", fmt.Errorf("log of task %s of workflow %s: %w", task, id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("log of task %s of workflow %s: %w", task, id, err)
	}
	return string(b), nil
}

// Cancel cancels every unfinished task of a workflow and returns its status.
// Cancelling a finished workflow changes nothing.
func (c *Client) Cancel(ctx context.Context, id string) (*Status, error) {
	var st Status
	if _, err := c.doJSON(ctx, http.MethodPost, pathOf("workflows", id, "cancel"), nil, "", &st); err != nil {
		return nil, fmt.Errorf("cancel workflow %s: %w", id, err)
	}
	return &st, nil
}

// Delete deletes a workflow that has ended, with its tasks, attempts,
// outputs and logs, and its hold on the data it read (which counts against
// the owner's data quota while it is held). A workflow still running is
// refused (an *APIError with status 409): cancel it first.
func (c *Client) Delete(ctx context.Context, id string) error {
	resp, err := c.do(ctx, http.MethodDelete, pathOf("workflows", id), nil, "", "")
	if err != nil {
		return fmt.Errorf("delete workflow %s: %w", id, err)
	}
	resp.Body.Close()
	return nil
}

// CancelTask cancels one unfinished task of a workflow and returns the
// workflow's status: a running attempt is stopped on its worker, the task
// ends cancelled and the tasks that need its outputs end upstream_failed;
// the other tasks run on. Cancelling a task that already finished is
// refused (an *APIError with status 409) and changes nothing.
func (c *Client) CancelTask(ctx context.Context, id, task string) (*Status, error) {
	var st Status
	if _, err := c.doJSON(ctx, http.MethodPost, pathOf("workflows", id, "tasks", task, "cancel"), nil, "", &st); err != nil {
		return nil, fmt.Errorf("cancel task %q of workflow %s: %w", task, id, err)
	}
	return &st, nil
}
