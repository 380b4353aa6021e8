//go:build !wasip1

package sdk

func progress(float64) {}

func checkpointDue() int32 { return 0 }

func checkpoint([]byte) int32 { return 0 }

func restore([]byte) int { return 0 }
