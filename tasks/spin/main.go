// Command spin is a test task made of a tight loop.
//
// Without arguments it loops forever and never returns: only cancellation or
// the wall time limit stops it. With one argument N it counts the primes
// below N by trial division (a tight loop that does finish), prints the count
// to stdout and exits; benchmarks use that form.
package main

import (
	"fmt"
	"os"
	"strconv"
)

var sink uint64

func main() {
	if len(os.Args) > 1 {
		n, err := strconv.ParseUint(os.Args[1], 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "spin: bad N:", err)
			os.Exit(1)
		}
		fmt.Println(countPrimes(n))
		return
	}
	x := uint64(1)
	for {
		x = x*6364136223846793005 + 1442695040888963407
		sink = x
	}
}

// countPrimes counts the primes below n by trial division.
func countPrimes(n uint64) int {
	count := 0
	for i := uint64(2); i < n; i++ {
		prime := true
		for d := uint64(2); d*d <= i; d++ {
			if i%d == 0 {
				prime = false
				break
			}
		}
		if prime {
			count++
		}
	}
	return count
}
