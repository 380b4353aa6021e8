// Package chromium starts Debian's Chromium headless the way the browser
// tests and the benchmark drive it (chromedp).
package chromium

import "github.com/chromedp/chromedp"

// Path is where Debian's chromium package installs the browser.
const Path = "/usr/bin/chromium"

// Options returns the allocator options that start the Chromium at exe
// headless, as root in a container (no sandbox), without a GPU, and without
// the parts of the browser's own interface that a headless page never
// shows: every new browser context (one per test) otherwise opens two
// omnibox popups as WebUI pages, each in a renderer of its own, which took
// 40-50% of the browser tests' Chromium CPU (docs/RATIONALE.md, "Why does
// make test take about 3 minutes on 2 cores, and not less?").
func Options(exe string) []chromedp.ExecAllocatorOption {
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-quic", true),
		// Replaces chromedp's list (Translate,BlinkGenPropertyTrees), so
		// it keeps it.
		chromedp.Flag("disable-features", "Translate,BlinkGenPropertyTrees,WebUIOmniboxPopup,WebUIOmniboxAimPopup,WebUIOmniboxFullPopup"),
	)
}
