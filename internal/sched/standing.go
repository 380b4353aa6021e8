package sched

// Standing is what a worker's record says of how far its reports can be
// relied on: its results accepted, and its strikes (failures it reported
// that another worker's result disproved, results the server refused or
// that lost a quorum), which fade with time.
type Standing struct {
	Results int64
	Strikes float64
}

// Bounds of Allowance: below StrikesFewer strikes a worker is never held
// back (an honest device fails now and then); from there, a worker whose
// strikes exceed a quarter of its results gets one task at a time, and
// from StrikesNone, one whose strikes exceed half its results gets none
// until they fade.
const (
	StrikesFewer = 3
	StrikesNone  = 6
)

// Allowance is how many of its slots a worker in this standing may fill
// at once: all of them, one, or none.
func (s Standing) Allowance(slots int) int {
	switch {
	case s.Strikes < StrikesFewer:
		return slots
	case s.Strikes >= StrikesNone && s.Strikes*2 > float64(s.Results):
		return 0
	case s.Strikes*4 > float64(s.Results):
		return min(slots, 1)
	}
	return slots
}
