package main

import (
	"log/slog"
	"net/http"
	"net/http/pprof"
)

// servePprof serves Go's profiler on addr (for operators chasing a
// performance problem); it does nothing when addr is empty.
func servePprof(addr string, log *slog.Logger) {
	if addr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	go func() {
		if err := http.ListenAndServe(addr, mux); err != nil {
			log.Error("pprof listener", "err", err)
		}
	}()
}
