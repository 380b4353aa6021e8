#!/bin/sh
# Builds every example task (each tasks/<name>/ holding a main.go, tasks/sdk
# excepted, or a main.c, built with clang for wasm32-wasi, or a main.rs,
# built with Debian's rustc) to bin/tasks/<name>.wasm as a WASI preview 1 command module.
# The build is reproducible: -trimpath, no build ID, no VCS stamping, so the
# same source and Go version give the same bytes (and the same module id).
#
# usage: tasks/build.sh [OUTDIR]      (default bin/tasks, from the repo root)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-bin/tasks}
cd "$root"
mkdir -p "$out"
built=0
for dir in tasks/*/; do
	name=$(basename "$dir")
	[ "$name" = sdk ] && continue
	if [ -f "$dir/main.c" ]; then
		# A task in C through tasks/include/cyclepool.h (docs/TASK_ABI.md).
		if ! command -v clang >/dev/null 2>&1; then
			echo "tasks/build.sh: skipping $name, a task in C: install clang, lld, wasi-libc and libclang-rt-14-dev-wasm32 (make tasks does)" >&2
			continue
		fi
		clang --target=wasm32-wasi -O2 -I tasks/include -o "$out/$name.wasm" "$dir/main.c"
		built=$((built + 1))
		continue
	fi
	if [ -f "$dir/main.rs" ]; then
		# A task in Rust through the cyclepool crate (tasks/rust/cyclepool),
		# with Debian's rustc and its wasm32-wasi standard library.
		rustc=/usr/bin/rustc
		if [ ! -x $rustc ] || [ ! -d /usr/lib/rustlib/wasm32-wasi ]; then
			echo "tasks/build.sh: skipping $name, a task in Rust: install rustc and libstd-rust-dev-wasm32 (make tasks does)" >&2
			continue
		fi
		$rustc --edition 2021 --crate-type rlib --crate-name cyclepool --target wasm32-wasi -O \
			-o "$out/libcyclepool.rlib" tasks/rust/cyclepool/src/lib.rs
		$rustc --edition 2021 --target wasm32-wasi -O -C strip=symbols --extern cyclepool="$out/libcyclepool.rlib" \
			-o "$out/$name.wasm" "$dir/main.rs"
		rm -f "$out/libcyclepool.rlib"
		built=$((built + 1))
		continue
	fi
	[ -f "$dir/main.go" ] || continue
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildvcs=false \
		-ldflags='-s -w -buildid=' -o "$out/$name.wasm" "./$dir"
	built=$((built + 1))
done
echo "built $built task modules in $out" >&2
