package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestWorkerCarriesNoNetworkStack keeps the Go worker small: every
// volunteer downloads it and every page compiles it, phones included. The
// browser does the networking; net/http and its TLS and certificate code
// made two thirds of the worker's 11 MB when a WebSocket library brought
// them in.
func TestWorkerCarriesNoNetworkStack(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}:{{join .Imports " "}}`, ".")
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm", "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	importers := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), ":")
		for imp := range strings.FieldsSeq(imports) {
			importers[imp] = append(importers[imp], pkg)
		}
	}
	if len(importers["syscall/js"]) == 0 {
		t.Fatalf("go list did not list the js/wasm build's packages:\n%s", out)
	}
	for _, pkg := range []string{"net", "net/http", "crypto/tls", "crypto/x509"} {
		if by := importers[pkg]; len(by) > 0 {
			t.Errorf("the browser worker imports %s (imported by %s)", pkg, strings.Join(by, ", "))
		}
	}
}
