# hedgekv — build, test, demo.
#
#   make build   bin/hedgekv
#   make test    gofmt check, go vet, unit + cluster tests with -race, then the
#                multi-process tests (smoke, multistore, wan, a short chaos run, 10 kill -9s) against bin/hedgekv
#   make chaos   the nemesis over real processes for CHAOS_SECONDS (60)
#   make demo    three stores in three simulated data centers, reads from a
#                remote leader and a local follower, follower-read-dc --quick
#   make proto   regenerate server/pb from server/pb/hedgekv.proto

GO            ?= go
BIN           := bin/hedgekv
TOOLS         := $(CURDIR)/.tools
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
# Per-package limit for the -race run; the whole target must stay well under
# 15 minutes on 2 cores.
TEST_TIMEOUT  ?= 10m
SMOKE_TIMEOUT ?= 10m
SMOKE_PKG     := ./test/smoke/... ./test/multistore/... ./test/wan/... ./test/chaos/... ./test/crash/...
# make chaos: how long the nemesis over real processes runs (make test runs
# it for 10s as part of the multi-process tests).
CHAOS_SECONDS ?= 60

.PHONY: all build test unit-test smoke-test chaos fmt fmt-check vet demo proto tools \
	clean clean-cluster

all: build

build:
	$(GO) build -o $(BIN) ./cmd/hedgekv

# Everything except the multi-process tests, which run processes of their
# own and are run without -race against the built binary.
unit-test:
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) $$($(GO) list ./... | grep -v -e '/test/smoke' -e '/test/multistore' -e '/test/wan' -e '/test/chaos' -e '/test/crash')

# One package at a time: they time fail-overs (and, in test/wan, simulated WAN
# latency) of real processes.
smoke-test: build
	HEDGEKV_BIN=$(CURDIR)/$(BIN) $(GO) test -p 1 -count=1 -timeout $(SMOKE_TIMEOUT) $(SMOKE_PKG)

# The nemesis over real processes (test/chaos): three stores behind the
# simulated WAN, random faults, porcupine over the whole history, then the
# replica check. CHAOS_SEED and CHAOS_FOLLOWER_LEASES=1 vary it.
chaos: build
	HEDGEKV_BIN=$(CURDIR)/$(BIN) CHAOS_SECONDS=$(CHAOS_SECONDS) $(GO) test -count=1 -v -run TestChaos \
		-timeout $$(( $(CHAOS_SECONDS) + 600 ))s ./test/chaos/

test: fmt-check vet
	$(MAKE) --no-print-directory unit-test
	$(MAKE) --no-print-directory smoke-test

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

proto: tools
	@command -v protoc >/dev/null || { echo "protoc not found: apt-get install protobuf-compiler"; exit 1; }
	PATH=$(TOOLS):$$PATH protoc -I server/pb \
		--go_out=paths=source_relative:server/pb \
		--go-grpc_out=paths=source_relative:server/pb \
		server/pb/hedgekv.proto

clean:
	rm -rf bin

# Stop the local cluster (if running) and delete its data.
clean-cluster:
	scripts/cluster.sh clean
