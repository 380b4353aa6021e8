package app

import (
	"embed"
	"io/fs"

	"github.com/cyclepool/cyclepool/internal/assets"
)

//go:embed static
var staticFS embed.FS

// loadAssets reads the dashboard's script and style, served under
// content-hashed names (app.1a2b3c4d.js) with an immutable cache lifetime,
// as the volunteer page's are. They are compiled in, so a failure is a
// broken build.
func loadAssets() *assets.Set {
	sub, err := fs.Sub(staticFS, "static")
	if err == nil {
		var a *assets.Set
		if a, err = assets.Load(sub, "/app/static/"); err == nil {
			return a
		}
	}
	panic(err)
}
