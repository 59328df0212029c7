# hedgekv — build, test, demo.
#
#   make build   bin/hedgekv
#   make test    gofmt check, go vet, unit + cluster tests with -race, then the
#                multi-process tests (smoke, multistore, wan, a short chaos run, 10 kill -9s,
#                CRASH_CUTS power cuts on lossyfs mounts for each of one store, a minority
#                and all stores, a rolling restart under load, etcdctl, and clientv3's
#                Mutex, Election, KV and Watch under kill -9s and partitions) against bin/hedgekv
#   make chaos   the nemesis over real processes for CHAOS_SECONDS (60)
#   make image   bin/hedgekv-static (CGO_ENABLED=0), then the FROM scratch image
#                IMAGE (hedgekv:latest) from it; deploy/compose.yaml runs three
#   make docker-test  that image as a three-store compose cluster, its leader's
#                container cut off the network and reconnected; part of make
#                test when a Docker engine answers, skipped (saying so) if not
#   make demo    three stores in three simulated data centers; reads from dc-b
#                measured (remote leader, ReadIndex, stale, follower lease) with
#                a verdict from the numbers; follower-read-dc --quick
#   make proto   regenerate kvpb from kvpb/hedgekv.proto
#   make etcdctl bin/etcdctl, etcd's CLI (ETCDCTL_VERSION, v3.7.3) from the module proxy
#   make etcdutl bin/etcdutl, etcd's offline tool (snapshot status/restore), the same way;
#                not part of make test: test/etcdctl uses it when it is there

GO            ?= go
BIN           := bin/hedgekv
TOOLS         := $(CURDIR)/.tools
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
# Per-package limit for the -race run; the whole target must stay well under
# 15 minutes on 2 cores.
TEST_TIMEOUT  ?= 10m
SMOKE_TIMEOUT ?= 10m
SMOKE_PKG     := ./test/smoke/... ./test/multistore/... ./test/wan/... ./test/chaos/... ./test/crash/... ./test/rolling/... ./test/etcdctl/... ./test/etcdfaults/...
# Power cuts per power-loss test in test/crash (one store, a minority, all
# stores; each cut costs a restart, ~1-2 s): make test's short count. The
# reliability figures use CRASH_CUTS=50. The tests need FUSE (fuse3,
# /dev/fuse, root) and fail without it unless HEDGEKV_NO_FUSE=1.
CRASH_CUTS    ?= 10
# make chaos: how long the nemesis over real processes runs (make test runs
# it for 10s as part of the multi-process tests).
CHAOS_SECONDS ?= 60
# The container image: a static binary (no libc for the loader to find in a
# scratch image), staged alone with an empty data directory as the context.
STATIC_BIN    := bin/hedgekv-static
IMAGE         ?= hedgekv:latest
DOCKER_TIMEOUT ?= 6m

.PHONY: all build check test unit-test smoke-test chaos static image docker-test fmt fmt-check vet demo proto tools etcd \
	etcdctl etcdutl clean clean-cluster fuzz

all: build

build:
	$(GO) build -o $(BIN) ./cmd/hedgekv

# Everything except the multi-process tests, which run processes of their
# own and are run without -race against the built binary.
unit-test:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v -e '/test/smoke' -e '/test/multistore' -e '/test/wan' -e '/test/chaos' -e '/test/crash' -e '/test/rolling' -e '/test/etcdctl' -e '/test/etcdfaults' -e '/test/docker')

# One package at a time: they time fail-overs (and, in test/wan, simulated WAN
# latency) of real processes.
smoke-test: build etcdctl
	HEDGEKV_BIN=$(CURDIR)/$(BIN) CRASH_CUTS=$(CRASH_CUTS) $(GO) test -p 1 -count=1 -timeout $(SMOKE_TIMEOUT) $(SMOKE_PKG)

# The nemesis over real processes (test/chaos): three stores behind the
# simulated WAN, random faults, porcupine over the whole history, then the
# replica check. CHAOS_SEED and CHAOS_FOLLOWER_LEASES=1 vary it.
chaos: build
	HEDGEKV_BIN=$(CURDIR)/$(BIN) CHAOS_SECONDS=$(CHAOS_SECONDS) $(GO) test -count=1 -v -run TestChaos \
		-timeout $$(( $(CHAOS_SECONDS) + 600 ))s ./test/chaos/

# CGO_ENABLED=0: the binary must run in an image with no C library.
static:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(STATIC_BIN) ./cmd/hedgekv

# The build context is bin/image/ (the binary and an empty data directory),
# not the repository: see the Dockerfile.
image: static
	rm -rf bin/image && mkdir -p bin/image/data && cp $(STATIC_BIN) bin/image/hedgekv
	docker build -f Dockerfile -t $(IMAGE) bin/image

# test/docker builds its own image tag from $(STATIC_BIN) and removes it, and
# everything else it creates, when it ends. Without a Docker engine (or a
# compose tool) it is skipped, and this says so rather than passing silently.
docker-test:
	@if ! docker info >/dev/null 2>&1; then \
		echo "docker-test: SKIPPED: no Docker engine answers 'docker info'"; \
	elif ! docker-compose version >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then \
		echo "docker-test: SKIPPED: neither docker-compose nor the docker compose plugin is installed"; \
	else \
		$(MAKE) --no-print-directory static && \
		HEDGEKV_STATIC_BIN=$(CURDIR)/$(STATIC_BIN) $(GO) test -count=1 -timeout $(DOCKER_TIMEOUT) ./test/docker/...; \
	fi

# The developer's fast loop (about 2-3 minutes on 2 cores): gofmt, vet,
# every package's tests with -short and without -race (long scenarios and
# tests that need an etcd binary skip), and the in-process cluster specs
# labelled "check" (replicated core, reads, follower leases, read safety,
# exactly-once writes, the replica check). make test is the full loop, and
# what CI runs.
check: fmt-check vet
	$(GO) test -short -count=1 -timeout 10m $$($(GO) list ./... | grep -v -e '/test/' -e '/bench$$')
	$(GO) test -count=1 -timeout 5m ./test/cluster/ -ginkgo.label-filter=check

test: fmt-check vet
	$(MAKE) --no-print-directory unit-test
	$(MAKE) --no-print-directory smoke-test
	$(MAKE) --no-print-directory docker-test

fmt:
	gofmt -w $$(find . -name '*.go' -not -path './.git/*' -not -path './.tools/*' -not -path './.cluster/*')

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*' -not -path './.tools/*' -not -path './.cluster/*')); \
	if [ -n "$$out" ]; then \
		echo "gofmt: these files need formatting (run 'make fmt'):"; \
		echo "$$out"; \
		exit 1; \
	fi

vet:
	$(GO) vet ./...

demo: build
	SKIP_BUILD=1 scripts/demo.sh

# protoc comes from Debian's protobuf-compiler; the Go plugins are pinned and
# installed into .tools/ so the generated code matches what is committed.
tools:
	@mkdir -p $(TOOLS)
	@if ! $(TOOLS)/protoc-gen-go --version 2>/dev/null | grep -qx 'protoc-gen-go $(PROTOC_GEN_GO_VERSION)'; then \
		echo "installing protoc-gen-go $(PROTOC_GEN_GO_VERSION) into $(TOOLS)"; \
		GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION); \
	fi
	@if ! $(TOOLS)/protoc-gen-go-grpc --version 2>/dev/null | grep -qx 'protoc-gen-go-grpc $(patsubst v%,%,$(PROTOC_GEN_GO_GRPC_VERSION))'; then \
		echo "installing protoc-gen-go-grpc $(PROTOC_GEN_GO_GRPC_VERSION) into $(TOOLS)"; \
		GOBIN=$(TOOLS) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION); \
	fi

# etcd: the newest etcd release (or ETCD_VERSION=v3.x.y) built from the Go
# module proxy into .tools/etcd (a main calling etcdmain.Main, as etcd's own):
# the peer for `hedgekv bench peer-etcd --etcd .tools/etcd`. Debian's
# etcd-server (3.4) stays what CI uses.
ETCD_VERSION ?= latest
etcd:
	@set -e; v=$(ETCD_VERSION); \
	if [ "$$v" = latest ]; then v=$$($(GO) list -m -versions go.etcd.io/etcd/server/v3 | tr ' ' '\n' | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$$' | sort -V | tail -1); fi; \
	d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' > "$$d/main.go"; \
	echo "building etcd $$v into $(TOOLS)/etcd"; \
	cd "$$d" && $(GO) mod init etcdbuild >/dev/null 2>&1 && $(GO) get go.etcd.io/etcd/server/v3@$$v && $(GO) mod tidy && \
	mkdir -p $(TOOLS) && $(GO) build -o $(TOOLS)/etcd . && $(TOOLS)/etcd --version | head -1

# etcdctl: etcd's own CLI at ETCDCTL_VERSION, the client the etcd API's tests
# drive (issue 30), built from the Go module proxy into bin/etcdctl the way
# `make etcd` builds the server: a throw-away module whose main calls
# ctlv3.MustStart, as etcdctl's own main.go does. Nothing is rebuilt when
# bin/etcdctl already reports that version.
ETCDCTL_VERSION ?= v3.7.3
ETCDCTL         := bin/etcdctl
etcdctl:
	@set -e; v=$(ETCDCTL_VERSION); out=$(CURDIR)/$(ETCDCTL); \
	if [ -x "$$out" ] && "$$out" version 2>/dev/null | grep -qx "etcdctl version: $${v#v}"; then \
		echo "$(ETCDCTL) is etcdctl $$v"; exit 0; \
	fi; \
	d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	printf 'package main\n\nimport "go.etcd.io/etcd/etcdctl/v3/ctlv3"\n\nfunc main() { ctlv3.MustStart() }\n' > "$$d/main.go"; \
	echo "building etcdctl $$v into $(ETCDCTL)"; \
	mkdir -p "$$(dirname "$$out")"; \
	cd "$$d" && $(GO) mod init etcdctlbuild >/dev/null 2>&1 && $(GO) get go.etcd.io/etcd/etcdctl/v3@$$v && $(GO) mod tidy && \
	$(GO) build -o "$$out" . && "$$out" version | head -1

# etcdutl: etcd's offline tool at ETCDCTL_VERSION, into bin/etcdutl: its
# main (etcdutl/ctl.go) is package main, so the throw-away module's main
# builds the same commands from package etcdutl. test/etcdctl runs
# `etcdutl snapshot status` and `snapshot restore` on hedgekv's snapshots
# when it finds it (ETCDUTL_BIN, else bin/etcdutl).
ETCDUTL := bin/etcdutl
etcdutl:
	@set -e; v=$(ETCDCTL_VERSION); out=$(CURDIR)/$(ETCDUTL); \
	if [ -x "$$out" ] && "$$out" version 2>/dev/null | grep -qx "etcdutl version: $${v#v}"; then \
		echo "$(ETCDUTL) is etcdutl $$v"; exit 0; \
	fi; \
	d=$$(mktemp -d); trap 'rm -rf "$$d"' EXIT; \
	printf '%s\n' 'package main' 'import (' '"os"' '"time"' '"github.com/spf13/cobra"' '"go.etcd.io/etcd/etcdutl/v3/etcdutl"' ')' \
		'func main() {' 'root := &cobra.Command{Use: "etcdutl", Short: "An administrative command line tool for etcd3."}' \
		'root.PersistentFlags().DurationVar(&etcdutl.FlockTimeout, "timeout", 10*time.Second, "time to wait to obtain a file lock on db file")' \
		'root.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple", "set the output format (fields, json, protobuf, simple, table)")' \
		'root.AddCommand(etcdutl.NewDefragCommand(), etcdutl.NewSnapshotCommand(), etcdutl.NewHashKVCommand(), etcdutl.NewVersionCommand(), etcdutl.NewMigrateCommand())' \
		'if root.Execute() != nil { os.Exit(1) }' '}' > "$$d/main.go"; \
	echo "building etcdutl $$v into $(ETCDUTL)"; \
	mkdir -p "$$(dirname "$$out")"; \
	cd "$$d" && $(GO) mod init etcdutlbuild >/dev/null 2>&1 && $(GO) get go.etcd.io/etcd/etcdutl/v3@$$v && $(GO) mod tidy && \
	$(GO) build -o "$$out" . && "$$out" version | head -1

proto: tools
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	PATH=$(TOOLS):$$PATH protoc -I kvpb \
		--go_out=paths=source_relative:kvpb \
		--go-grpc_out=paths=source_relative:kvpb \
		kvpb/hedgekv.proto

# make fuzz: every fuzz target, one after another, for FUZZTIME each
# (make fuzz FUZZTIME=60s). The targets are listed here, package:Name; their
# seed corpora (testdata/fuzz) run as ordinary tests in make test.
FUZZTIME      ?= 10s
FUZZ_TARGETS  := \
	./region:FuzzSplitThenLookup ./region:FuzzClampRange ./region:FuzzTreeInsert ./region:FuzzEpochSplit ./region:FuzzFormatKey \
	./raftstore:FuzzDecodeCommand ./raftstore:FuzzDecodeConfContext ./raftstore:FuzzHandleRaftMessage \
	./raftstore:FuzzLoadPeerStorage \
	./storage/engine:FuzzDecodeApplyState ./storage/engine:FuzzDecodeSnapshot ./storage/engine:FuzzSnapshotApply \
	./storage/engine:FuzzSnapshotStreamDecode ./storage/engine:FuzzLoadPeers \
	./server:FuzzValidateKV ./server:FuzzCheckFaultRequest ./server/controlplane:FuzzValidateJoin ./server:FuzzRaftDeliver \
	./kvpb:FuzzRegionErrorToError \
	./client:FuzzParseHedge \
	./cmd/hedgekv:FuzzParseFault ./cmd/hedgekv:FuzzParseAddrLists \
	./bench/ycsbdb:FuzzDecodeRecord ./bench/ycsbdb:FuzzRoundTrip ./bench/ycsbdb:FuzzDecodeFields \
	./netsim:FuzzParseTopology

fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$name ($$pkg, $(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

clean:
	rm -rf bin

# Stop the local cluster (if running) and delete its data.
clean-cluster:
	scripts/cluster.sh clean
