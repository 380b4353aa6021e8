# Builds the one cyclepool binary. The embedded PostgreSQL needs the
# PostgreSQL binaries, so the runtime image is Debian with postgresql
# installed; with --database-url it is not used.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY tasks/sdk/go.mod tasks/sdk/
RUN go mod download
COPY . .
# The example tasks in C need clang, lld and wasi-libc, those in Rust
# rustc and its wasm32-wasi standard library (tasks/build.sh).
RUN apt-get update && apt-get install -y --no-install-recommends clang lld wasi-libc libclang-rt-14-dev-wasm32 \
	rustc libstd-rust-dev-wasm32 && rm -rf /var/lib/apt/lists/*
# The volunteer page's browser worker is embedded in the binary: build it
# first, as `make build` does (web/static/worker.wasm is not committed).
RUN make web && CGO_ENABLED=0 go build -trimpath -o /out/cyclepool ./cmd/cyclepool && sh tasks/build.sh /out/tasks

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends postgresql ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/cyclepool /usr/local/bin/cyclepool
# The example workflows name their modules bin/tasks/*.wasm, as in a
# checkout: from /opt/cyclepool they can be submitted as they are, e.g.
#   docker exec -w /opt/cyclepool -e CYCLEPOOL_SERVER=http://localhost:8080 \
#     -e CYCLEPOOL_TOKEN=$(docker exec C cat /var/lib/cyclepool/owner.token) C \
#     cyclepool submit examples/primes.json
COPY --from=build /out/tasks /opt/cyclepool/bin/tasks
COPY examples /opt/cyclepool/examples
WORKDIR /var/lib/cyclepool
EXPOSE 8080
ENTRYPOINT ["cyclepool"]
CMD ["serve", "--addr", ":8080", "--data-dir", "/var/lib/cyclepool", "--local-worker", "2"]
