package sched

import "sort"

// VerifyConfig is a workflow's result verification: how many replicas of a
// task run at first, how many identical results (by hash) accept it, the
// most replicas ever made before the task fails, and when a worker's record
// is long enough to skip replication (adaptive replication).
type VerifyConfig struct {
	Replicas    int // replicas started at first (1 = no replication)
	Quorum      int // identical results needed to accept
	MaxReplicas int // replicas at most, before the task fails
	TrustAfter  int // valid results, with no invalid one in the last TrustWindow, to skip replicas; 0 = never
	TrustWindow int // how many of the latest results must all be valid
}

// DefaultVerify replicates twice, accepts on two matching hashes, gives up
// after five replicas, and trusts a worker alone after 20 valid results of
// which the latest 10 all valid.
func DefaultVerify() VerifyConfig {
	return VerifyConfig{Replicas: 2, Quorum: 2, MaxReplicas: 5, TrustAfter: 20, TrustWindow: 10}
}

// Reputation is a worker's record of verified results. Recent holds the
// latest outcomes, newest last (true = valid).
type Reputation struct {
	Valid   int
	Invalid int
	Recent  []bool
}

// Score is the Laplace-smoothed share of valid results, in (0, 1): a new
// worker scores 0.5.
func (r Reputation) Score() float64 {
	return float64(r.Valid+1) / float64(r.Valid+r.Invalid+2)
}

// Record adds one outcome, keeping at most window recent ones.
func (r Reputation) Record(valid bool, window int) Reputation {
	if valid {
		r.Valid++
	} else {
		r.Invalid++
	}
	r.Recent = append(append([]bool(nil), r.Recent...), valid)
	if window > 0 && len(r.Recent) > window {
		r.Recent = r.Recent[len(r.Recent)-window:]
	}
	return r
}

// Trusted reports whether a worker's record is long and clean enough that
// its results need no replica (adaptive replication).
func (r Reputation) Trusted(cfg VerifyConfig) bool {
	if cfg.TrustAfter <= 0 || r.Valid < cfg.TrustAfter || len(r.Recent) < cfg.TrustWindow {
		return false
	}
	for _, v := range r.Recent[len(r.Recent)-cfg.TrustWindow:] {
		if !v {
			return false
		}
	}
	return true
}

// InitialReplicas is how many replicas of a task to start: cfg.Replicas,
// or 1 when the worker that would take the first replica is trusted.
func InitialReplicas(cfg VerifyConfig, first Reputation) int {
	if cfg.Replicas <= 1 || first.Trusted(cfg) {
		return 1
	}
	return cfg.Replicas
}

// Result is one replica's result: the worker that produced it and the hash
// of its outputs.
type Result struct {
	Worker string
	Hash   string
}

// VerdictState is where a task's verification stands.
type VerdictState int

// The states of a verdict.
const (
	Pending  VerdictState = iota // wait for outstanding replicas or start more
	Accepted                     // a quorum agrees on Verdict.Hash
	Failed                       // no quorum is possible within MaxReplicas
)

// Verdict is the outcome of Decide.
type Verdict struct {
	State VerdictState
	Hash  string // the accepted hash
	// More is how many new replicas to start now (only when Pending).
	More int
	// Losers are the workers whose results differ from the accepted hash:
	// they lose reputation and their other unverified results are
	// re-checked (see Recheck).
	Losers []string
	// Winners are the workers whose results agree with the accepted hash.
	Winners []string
}

// Decide compares the results of a task's replicas by hash. A hash is
// accepted only when at least quorum results carry it AND they are a
// strict majority of the results received, so a minority result is never
// accepted, whatever the order of arrival. trustedSingle accepts a lone
// result from a trusted worker (adaptive replication: quorum 1). While no
// hash is accepted, Decide asks for enough new replicas that the leading
// hash could reach the quorum, counting the outstanding ones, within
// cfg.MaxReplicas in total; when no more can be started and none are
// outstanding, the task fails.
func Decide(results []Result, outstanding int, cfg VerifyConfig, trustedSingle bool) Verdict {
	quorum := max(1, cfg.Quorum)
	if trustedSingle && len(results) == 1 && outstanding == 0 {
		quorum = 1
	}
	counts := map[string]int{}
	for _, r := range results {
		counts[r.Hash]++
	}
	hashes := make([]string, 0, len(counts))
	for h := range counts {
		hashes = append(hashes, h)
	}
	sort.Slice(hashes, func(i, j int) bool {
		if counts[hashes[i]] != counts[hashes[j]] {
			return counts[hashes[i]] > counts[hashes[j]]
		}
		return hashes[i] < hashes[j]
	})
	lead := 0
	if len(hashes) > 0 {
		lead = counts[hashes[0]]
	}
	if lead >= quorum && 2*lead > len(results) {
		v := Verdict{State: Accepted, Hash: hashes[0]}
		for _, r := range results {
			if r.Hash == v.Hash {
				v.Winners = append(v.Winners, r.Worker)
			} else {
				v.Losers = append(v.Losers, r.Worker)
			}
		}
		return v
	}
	maxR := max(cfg.MaxReplicas, quorum)
	room := maxR - len(results) - outstanding
	// Replicas the leader still needs for a quorum and a strict majority,
	// assuming every new result agrees with it.
	need := max(quorum-lead, len(results)-2*lead+1) - outstanding
	if need > room {
		if outstanding == 0 {
			return Verdict{State: Failed}
		}
		need = 0 // wait: the outstanding results may still change the count
	}
	return Verdict{State: Pending, More: max(need, 0)}
}

// AcceptedResult is a result the platform accepted, for Recheck.
type AcceptedResult struct {
	Task     string
	Worker   string
	Verified bool // accepted by a quorum of several replicas, not alone
}

// Recheck lists the tasks whose accepted result came, unverified, from a
// worker that has just lost a quorum: they need new replicas. The store
// applies the same rule in SQL when it records a loss (reopening such tasks
// of running workflows, flagging those of finished ones as disputed).
func Recheck(loser string, accepted []AcceptedResult) []string {
	var out []string
	for _, a := range accepted {
		if a.Worker == loser && !a.Verified {
			out = append(out, a.Task)
		}
	}
	return out
}
