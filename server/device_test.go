package server

import (
	"strings"
	"testing"

	"github.com/cyclepool/cyclepool/internal/protocol"
)

// Device reports are held to their bounds before they are kept.
func TestCleanDevice(t *testing.T) {
	t.Parallel()
	neg, big, ok := -1.0, 2.0, 0.5
	d := cleanDevice(protocol.Device{
		UserAgent: strings.Repeat("é", 1000), Connection: strings.Repeat("c", 100), PausedBecause: strings.Repeat("p", 1000),
		Charging: "perhaps", SaveData: "yes", Online: "", Visibility: strings.Repeat("v", 10000),
		Battery: &big, DownlinkMbps: &neg, RTTMillis: &ok, Cores: -3,
	})
	if len(d.UserAgent) > maxUserAgent || len(d.UserAgent) < maxUserAgent-1 || !strings.HasPrefix(d.UserAgent, "é") {
		t.Errorf("user agent of %d bytes", len(d.UserAgent))
	}
	if len(d.Connection) != maxConnection || len(d.PausedBecause) != maxPausedBecause {
		t.Errorf("connection %d bytes, paused_because %d", len(d.Connection), len(d.PausedBecause))
	}
	if d.Charging != protocol.Unknown || d.SaveData != "yes" || d.Online != "" || d.Visibility != protocol.Unknown {
		t.Errorf("enums: charging %q, save_data %q, online %q, visibility %.10q", d.Charging, d.SaveData, d.Online, d.Visibility)
	}
	if d.Battery != nil || d.DownlinkMbps != nil || d.RTTMillis == nil || *d.RTTMillis != ok || d.Cores != 0 {
		t.Errorf("numbers: battery %v, downlink %v, rtt %v, cores %d", d.Battery, d.DownlinkMbps, d.RTTMillis, d.Cores)
	}
}
