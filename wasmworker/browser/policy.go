// Command browser is the volunteer page's worker: Go compiled with
// GOOS=js GOARCH=wasm, loaded by web/static/worker.js in a dedicated Web
// Worker. It speaks the worker protocol through package wasmworker (kind
// browser) and runs each task attempt in its own task Web Worker on the
// browser's WebAssembly engine (web/static/task.js), so that cancelling an
// attempt is terminating its Web Worker.
//
// The page gathers the device state (Battery Status and Network Information
// APIs, online, visibility) and the volunteer's settings and posts them
// here; this file decides from them whether the volunteer allows work now.
// It builds on every platform so that the rules are tested with plain
// `go test`.
package main

import (
	"fmt"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// Settings are the volunteer's choices, as the page keeps them.
type Settings struct {
	Threads  int  `json:"threads"`  // attempts run at once
	Share    int  `json:"share"`    // CPU share in percent (10 to 100)
	Charging bool `json:"charging"` // only while charging
	Floor    int  `json:"floor"`    // battery floor in percent
	Metered  bool `json:"metered"`  // pause on metered or data-saver connections
	Hidden   bool `json:"hidden"`   // pause while the tab is hidden
}

// DeviceState is what the page sees of the device. Strings are "unknown"
// (or empty) when the browser does not tell; pointers are nil then.
type DeviceState struct {
	Battery    *float64 // 0..1
	Charging   string   // "yes", "no", "unknown"
	Connection string   // Network Information type (or effective type)
	Downlink   *float64 // Mb/s
	RTT        *float64 // ms
	SaveData   string   // "yes", "no", "unknown"
	Online     string   // "yes", "no"
	Visibility string   // "visible", "hidden"
	Cores      int      // navigator.hardwareConcurrency, 0 unknown
	MemoryGiB  *float64 // navigator.deviceMemory
	UserAgent  string
	Mobile     bool // the browser says it is a phone or tablet
}

// PauseReason says why the volunteer's settings forbid work now, or "" when
// they allow it. Unknown states never count as allowed on a phone when they
// matter: a page must not drain a battery the volunteer did not offer.
func PauseReason(s Settings, d DeviceState) string {
	if s.Hidden && d.Visibility == "hidden" {
		return "the tab is hidden"
	}
	if s.Charging {
		switch d.Charging {
		case "no":
			return "not charging"
		case "yes":
		default:
			if d.Mobile {
				return "the browser does not say whether the phone is charging"
			}
		}
	}
	if d.Battery != nil && d.Charging != "yes" && *d.Battery*100 < float64(s.Floor) {
		return fmt.Sprintf("battery below %d%%", s.Floor)
	}
	if s.Metered {
		if d.SaveData == "yes" {
			return "the connection is in data-saver mode"
		}
		if d.Connection == "cellular" {
			return "the connection is metered (cellular)"
		}
	}
	return ""
}

// Protocol returns the device state as reported in hello and heartbeats.
func (d DeviceState) Protocol(s Settings) protocol.Device {
	or := func(v string) string {
		if v == "" {
			return protocol.Unknown
		}
		return v
	}
	pd := protocol.Device{Battery: d.Battery, Charging: or(d.Charging), Connection: or(d.Connection),
		DownlinkMbps: d.Downlink, RTTMillis: d.RTT, SaveData: or(d.SaveData), Online: or(d.Online),
		Visibility: or(d.Visibility), Cores: d.Cores, MemoryGiB: d.MemoryGiB, UserAgent: d.UserAgent}
	if why := PauseReason(s, d); why != "" {
		pd.Paused, pd.PausedBecause = true, why
	}
	return pd
}
