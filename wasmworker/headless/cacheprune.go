package headless

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// DefaultCompileCacheBytes bounds the compilation cache (Config.CacheDir)
// by default.
const DefaultCompileCacheBytes = 2 << 30

// compileCacheUnused is how long a compiled module may go unread before
// pruneCompileCache removes it, whatever the room.
const compileCacheUnused = 30 * 24 * time.Hour

// pruneCompileCache keeps wazero's compilation cache in dir within
// maxBytes: wazero writes a file per module compiled (under a directory
// per wazero version and platform) and never removes one, so a worker that
// runs many projects' modules, or outlives a wazero upgrade, would fill
// its disk. It removes the entries not read for compileCacheUnused, then
// the least recently read until the rest fits. Reads are told by the
// files' access times (which Linux's default relatime updates at least
// daily), else by their modification times. An entry another process is
// reading stays readable to it; the next to need it compiles it again.
func pruneCompileCache(dir string, maxBytes int64, now time.Time, log *slog.Logger) {
	type entry struct {
		path string
		size int64
		used time.Time
	}
	var entries []entry
	var total int64
	subdirs, err := os.ReadDir(dir)
	if err != nil {
		return // none yet
	}
	for _, sd := range subdirs {
		if !sd.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(dir, sd.Name()))
		if err != nil {
			continue
		}
		for _, f := range files {
			fi, err := f.Info()
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			entries = append(entries, entry{filepath.Join(dir, sd.Name(), f.Name()), fi.Size(), accessTime(fi)})
			total += fi.Size()
		}
	}
	slices.SortFunc(entries, func(a, b entry) int { return a.used.Compare(b.used) })
	removed, freed := 0, int64(0)
	for _, e := range entries {
		if total <= maxBytes && now.Sub(e.used) < compileCacheUnused {
			break
		}
		if err := os.Remove(e.path); err != nil {
			log.Warn("pruning the compilation cache", "err", err)
			continue
		}
		total -= e.size
		removed++
		freed += e.size
	}
	if removed > 0 {
		log.Info("compilation cache pruned", "dir", dir, "removed", removed, "freed_mib", freed>>20, "kept_mib", total>>20)
	}
	// The directories stay, emptied or not: wazero makes its own when it
	// opens the cache and not again, so another process on dir would find
	// its gone.
}
