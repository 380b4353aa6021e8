// Command memhog is a test task that allocates memory without bound (1 MiB at
// a time, touching every page) until the runtime refuses to give it more.
package main

import "fmt"

func main() {
	var hoard [][]byte
	for i := 0; ; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = byte(i)
		}
		hoard = append(hoard, b)
		if i%64 == 0 {
			fmt.Printf("memhog: %d MiB\n", len(hoard))
		}
	}
}
