// Command noop is a test task that does nothing: it exits 0 without output.
package main

func main() {}
