# cyclepool: `make run` starts the platform, `make test` runs every test.
GO      ?= go
BIN     := bin/cyclepool
DATA    ?= data
ADDR    ?= :8080
SLOTS   ?= 2

# Without the checkout's directory in the build cache's keys, a fresh clone
# elsewhere reuses what an earlier one compiled (go build, vet and test);
# the flags of the machine's go env are kept.
export GOFLAGS := $(strip $(filter-out -trimpath,$(shell $(GO) env GOFLAGS)) -trimpath)

.PHONY: all build tasks ctoolchain web templ run test test-e2e test-rest vet-low fuzz-smoke fuzz bench vet clean chromium

all: build

build: tasks web
	$(GO) build -o $(BIN) ./cmd/cyclepool

# The volunteer page's browser worker (Go, GOOS=js GOARCH=wasm) and Go's
# wasm_exec.js that loads it, built into web/static/ where the binary embeds
# them; they must exist before `go build` (not committed: web/.gitignore).
web:
	GOOS=js GOARCH=wasm CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o web/static/worker.wasm ./wasmworker/browser
	cp "$$($(GO) env GOROOT)/lib/wasm/wasm_exec.js" web/static/wasm_exec.js

# Regenerates web/*_templ.go and web/app/*_templ.go from their .templ files
# (the generated files are committed, so a build needs no templ binary).
templ:
	$(GO) run github.com/a-h/templ/cmd/templ@v0.3.977 generate -path web
	$(GO) run github.com/a-h/templ/cmd/templ@v0.3.977 generate -path web/app

# The example tasks, in Go, C and Rust; the C ones need Debian's clang,
# lld and wasi-libc, the Rust ones its rustc and libstd-rust-dev-wasm32,
# installed when missing (as root, or through sudo; without either, those
# tasks are skipped and make run still runs).
tasks: ctoolchain
	sh tasks/build.sh bin/tasks

ctoolchain:
	@if ! command -v clang >/dev/null 2>&1 || [ ! -e /usr/include/wasm32-wasi/stdio.h ] || ! command -v wasm-ld >/dev/null 2>&1 || \
		! ls /usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1; then \
		echo "installing Debian's clang, lld and wasi-libc for the tasks in C"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		( $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends \
			clang lld wasi-libc libclang-rt-14-dev-wasm32 ) || \
			echo "could not install the C toolchain: the tasks in C are not built (their tests fail, saying so)"; \
	fi
	@if [ ! -x /usr/bin/rustc ] || [ ! -d /usr/lib/rustlib/wasm32-wasi ]; then \
		echo "installing Debian's rustc and its wasm32-wasi standard library for the tasks in Rust"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		( $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y --no-install-recommends \
			rustc libstd-rust-dev-wasm32 ) || \
			echo "could not install rustc: the tasks in Rust are not built (their tests fail, saying so)"; \
	fi

# Starts the server on the embedded PostgreSQL (under $(DATA)) with a local
# headless worker, and prints the URL and an owner token.
run: build
	$(BIN) serve --addr $(ADDR) --data-dir $(DATA) --local-worker $(SLOTS)

# Owners run the CLI, and volunteers the headless worker, on macOS and
# Windows too: the whole tree must build there (the embedded PostgreSQL
# needs Linux or macOS; elsewhere serve takes --database-url).
vet:
	$(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	GOOS=windows $(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./tasks/...
	cd tasks/sdk && $(GO) vet ./... && GOOS=wasip1 GOARCH=wasm $(GO) vet ./...
	GOOS=js GOARCH=wasm $(GO) vet ./wasmworker/ ./wasmworker/browser/ ./internal/protocol/

# Unit, integration and end-to-end tests against a real PostgreSQL (started
# by the tests from the installed binaries, which must be there: without
# them the tests that need a database fail, saying so), real WebSockets and
# real wazero, with the vet passes and a short run of each fuzz target
# (make fuzz runs them longer) beside them. The end-to-end tests are the
# long pole: they wait on leases, heartbeats and child processes more than
# they compute, so four of them run at once whatever the cores, and
# everything else runs at a lower priority (LOW) in the CPU they leave.
LOW := nice -n 10 $(GO)
test: build chromium
	@$(MAKE) --no-print-directory -j4 test-e2e test-rest vet-low fuzz-smoke

# Test binaries are linked without DWARF (-w): a quarter less CPU per link,
# some 40 links a run; stack traces do not need it.
TESTFLAGS := -count=1 -parallel 4 -timeout 20m -ldflags=-w
test-e2e:
	CYCLEPOOL_REQUIRE_POSTGRES=1 $(GO) test $(TESTFLAGS) ./e2e/

test-rest:
	CYCLEPOOL_REQUIRE_POSTGRES=1 $(LOW) test $(TESTFLAGS) $$($(GO) list ./... | grep -v '/e2e$$')

vet-low:
	@$(MAKE) --no-print-directory vet GO="$(LOW)"

fuzz-smoke:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=20000x GO="$(LOW)"

# The browser tests drive Debian's Chromium; install it when it is missing
# (as root, or through sudo).
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
		echo "installing Debian's chromium for the browser tests"; \
		SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y chromium; \
	fi

# A count, not a duration: a duration-based -fuzztime races Go's fuzz
# coordinator (golang/go#75804, fixed in Go 1.27) and fails now and then with
# "context deadline exceeded" and no crashing input.
FUZZTIME ?= 300000x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/workflow/
	$(GO) test -run '^$$' -fuzz '^FuzzFastDecode$$' -fuzztime $(FUZZTIME) ./internal/workflow/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeFast$$' -fuzztime $(FUZZTIME) ./internal/protocol/
	$(GO) test -run '^$$' -fuzz '^FuzzEncodeFast$$' -fuzztime $(FUZZTIME) ./internal/protocol/

# The benchmark is a command of its own (bin/cyclepool-bench), so that the
# binary operators run carries none of its harness; it measures bin/cyclepool.
bench: build
	$(GO) build -o bin/cyclepool-bench ./cmd/cyclepool-bench
	bin/cyclepool-bench

clean:
	rm -rf bin web/static/worker.wasm web/static/wasm_exec.js
