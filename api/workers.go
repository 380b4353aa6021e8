package api

import (
	"encoding/json"
	"time"
)

// Stability classes of a worker (WorkerStability.Class), from the most to
// the least stable.
const (
	StabilityVeryStable  = "very_stable"
	StabilityStable      = "stable"
	StabilityUnstable    = "unstable"
	StabilityTooUnstable = "too_unstable"
)

// WorkerStability is the stability class the dispatcher gives a worker
// (Hummel and Meyer's node states) and the reasons that lowered it.
type WorkerStability struct {
	Class   string   `json:"class"`
	Reasons []string `json:"reasons"`
	// TimeToEmptyS is the predicted time until the battery is empty, in
	// seconds; nil when no drain is predicted.
	TimeToEmptyS *float64 `json:"time_to_empty_s"`
	// BatterySlopePerHour is the battery level's trend per hour (-0.1: it
	// loses 10% an hour); nil when unknown.
	BatterySlopePerHour *float64 `json:"battery_slope_per_hour"`
}

// WorkerReputation is a worker's record of verified results: how many
// agreed with (Valid) or lost (Invalid) a quorum. Score is
// (Valid+1)/(Valid+Invalid+2), 0.5 for a new worker; a Trusted worker's
// results are accepted without replicas (adaptive replication).
type WorkerReputation struct {
	Valid   int64   `json:"valid"`
	Invalid int64   `json:"invalid"`
	Score   float64 `json:"score"`
	Trusted bool    `json:"trusted"`
}

// Worker is one connected worker in GET /api/v1/workers. Running,
// TasksDone and Stability are known only to the server replica the worker
// is connected to, and are nil when another replica answered.
type Worker struct {
	ID          string          `json:"id"`
	Kind        string          `json:"kind"` // "headless" or "browser"
	Slots       int             `json:"slots"`
	Volunteer   string          `json:"volunteer"`
	Replica     string          `json:"replica"`
	ConnectedAt time.Time       `json:"connected_at"`
	LastSeen    time.Time       `json:"last_seen"`
	Device      json.RawMessage `json:"device"`
	Running     *int            `json:"running"`
	// TasksDone counts the results accepted since it connected.
	TasksDone *int `json:"tasks_done"`
	// Attempts and TasksLost count over the worker's whole life.
	Attempts   int64            `json:"attempts"`
	TasksLost  int64            `json:"tasks_lost"`
	Stability  *WorkerStability `json:"stability"`
	Reputation WorkerReputation `json:"reputation"`
	// Operator is true for the operator's own machines (they presented
	// an operator key). Strikes counts, fading, the failures it reported
	// that other workers disproved and its results refused; Allowed is
	// how many attempts it may hold now, fewer than Slots while its
	// strikes hold it back (nil: another replica).
	Operator bool    `json:"operator"`
	Strikes  float64 `json:"strikes"`
	Allowed  *int    `json:"allowed"`
	// Build is the worker's build, as it said (`cyclepool version`).
	Build string `json:"build"`
}

// Fairness is the server's fairness strategy and Hummel and Meyer's
// fairness metric: the variance of tasks done over the answering replica's
// workers.
type Fairness struct {
	Strategy          string  `json:"strategy"`
	VarianceTasksDone float64 `json:"variance_tasks_done"`
}

// WorkerList is GET /api/v1/workers: the connected workers of every server
// replica and the fairness of the answering one.
type WorkerList struct {
	Workers  []Worker `json:"workers"`
	Fairness Fairness `json:"fairness"`
}
