package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/cyclepool/cyclepool/api"
)

// Stability classes of a worker (WorkerStability.Class), from the most to
// the least stable.
const (
	StabilityVeryStable  = api.StabilityVeryStable
	StabilityStable      = api.StabilityStable
	StabilityUnstable    = api.StabilityUnstable
	StabilityTooUnstable = api.StabilityTooUnstable
)

// The types of GET /api/v1/workers (package api).
type (
	WorkerStability  = api.WorkerStability
	WorkerReputation = api.WorkerReputation
	Worker           = api.Worker
	Fairness         = api.Fairness
	WorkerList       = api.WorkerList
)

// Workers lists the connected workers with their stability class,
// reputation and tasks done, and the fairness metric.
func (c *Client) Workers(ctx context.Context) (WorkerList, error) {
	var l WorkerList
	if _, err := c.doJSON(ctx, http.MethodGet, pathOf("workers"), nil, "", &l); err != nil {
		return WorkerList{}, fmt.Errorf("list workers: %w", err)
	}
	return l, nil
}
