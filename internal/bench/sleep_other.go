//go:build !unix

package bench

import "errors"

var errNoSleep = errors.New("stopping a process is not supported on this system")

// sleepProcess would stop p; here it cannot.
func sleepProcess(*process) error { return errNoSleep }

// wakeProcess would continue p; here it cannot.
func wakeProcess(*process) error { return errNoSleep }
