package headless

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// The test binary is its own slot process (see ServeSlotIfChild).
	ServeSlotIfChild()
	code := m.Run()
	closeSharedRunners()
	os.Exit(code)
}
