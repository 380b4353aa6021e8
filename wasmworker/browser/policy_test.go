package main

import "testing"

func ptr(f float64) *float64 { return &f }

func TestPauseReason(t *testing.T) {
	defaults := Settings{Threads: 1, Share: 100, Charging: true, Floor: 30, Metered: true}
	cases := []struct {
		name string
		s    Settings
		d    DeviceState
		want bool
	}{
		{"charging laptop works", defaults, DeviceState{Battery: ptr(.5), Charging: "yes"}, false},
		{"discharging waits when only while charging", defaults, DeviceState{Battery: ptr(.9), Charging: "no"}, true},
		{"discharging works when allowed and above the floor", Settings{Floor: 30}, DeviceState{Battery: ptr(.9), Charging: "no"}, false},
		{"below the floor on battery waits", Settings{Floor: 30}, DeviceState{Battery: ptr(.29), Charging: "no"}, true},
		{"below the floor while charging works", Settings{Floor: 30}, DeviceState{Battery: ptr(.1), Charging: "yes"}, false},
		{"unknown battery on a desktop works", defaults, DeviceState{Charging: "unknown"}, false},
		{"unknown battery on a phone waits", defaults, DeviceState{Charging: "unknown", Mobile: true}, true},
		{"save-data waits", defaults, DeviceState{Charging: "yes", SaveData: "yes"}, true},
		{"cellular waits", defaults, DeviceState{Charging: "yes", Connection: "cellular"}, true},
		{"cellular allowed", Settings{}, DeviceState{Connection: "cellular"}, false},
		{"hidden waits when asked", Settings{Hidden: true}, DeviceState{Visibility: "hidden"}, true},
		{"hidden works otherwise", Settings{}, DeviceState{Visibility: "hidden"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			why := PauseReason(c.s, c.d)
			if (why != "") != c.want {
				t.Fatalf("PauseReason = %q, want paused=%v", why, c.want)
			}
			pd := c.d.Protocol(c.s)
			if pd.Paused != c.want || pd.PausedBecause != why {
				t.Fatalf("Protocol() paused=%v because=%q", pd.Paused, pd.PausedBecause)
			}
		})
	}
}

func TestProtocolSaysUnknown(t *testing.T) {
	pd := DeviceState{}.Protocol(Settings{})
	for name, v := range map[string]string{"charging": pd.Charging, "connection": pd.Connection, "save_data": pd.SaveData,
		"online": pd.Online, "visibility": pd.Visibility} {
		if v != "unknown" {
			t.Errorf("%s = %q, want unknown", name, v)
		}
	}
	if pd.Battery != nil || pd.DownlinkMbps != nil || pd.RTTMillis != nil || pd.MemoryGiB != nil {
		t.Errorf("numbers guessed: %+v", pd)
	}
}
