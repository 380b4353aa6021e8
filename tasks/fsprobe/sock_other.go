//go:build !wasip1

package main

// sockErrnos is for WASI only.
func sockErrnos() string { return "not WASI" }
