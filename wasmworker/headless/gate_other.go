//go:build !unix

package headless

import (
	"errors"
	"os"
)

// gate is not available outside Unix systems: attempts are not pipelined
// there (each slot process is given one attempt at a time).
type gate struct{}

const gateSupported = false

func newGateFile(string) (*os.File, *gate, error) {
	return nil, nil, errors.New("no shared memory gate on this system")
}

func mapGate(*os.File) (*gate, error) {
	return nil, errors.New("no shared memory gate on this system")
}

func (g *gate) unmap()                         {}
func (g *gate) tryStart(uint32) bool           { return true }
func (g *gate) revoke(uint32) (started uint32) { return 0 }
func (g *gate) started() uint32                { return 0 }
