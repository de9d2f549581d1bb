# lockd — build, test, lint, benchmark, fuzz.
GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
FUZZTIME    ?= 15s
BENCHTIME   ?= 1s
## PKGS: every module of the repository — the root one (server, CLI, test
## tools); the library's (client/, proto/, fence/: modules of their own so
## that a program importing the client inherits none of the server's
## dependencies); bench/ (so that the bench's, etcd's client, gRPC,
## gonum, stay out of the root go.mod). A pattern stops at a module's
## boundary: ./... is the root module alone. go.work joins them, so the
## patterns, `go run ./bench` and `go test ./client/` all resolve from
## here; internal/layers' TestWorkspace checks PKGS names each module.
PKGS        := ./... ./bench/... ./client/... ./fence/... ./proto/...
PYTHON      ?= /usr/bin/python3

.PHONY: all build test test-ops test-short lint check-tracked tidy-check vet fmt-check staticcheck bench fuzz clean chaos chaos-short test-python lint-python

all: build

## build: bin/lockd and bin/lockctl, stamped with the VCS revision when
## built in a git clone (-buildvcs=auto overrides a GOFLAGS=-buildvcs=false
## in the environment, as on this repository's machines; --version and
## lockd_build_info show the revision).
BUILDVCS ?= -buildvcs=auto
build:
	$(GO) build $(BUILDVCS) -o bin/lockd ./cmd/lockd
	$(GO) build $(BUILDVCS) -o bin/lockctl ./cmd/lockctl

## test: what CI runs — lint, every test with the race detector, then
## chaos/ on its own (TestChaosShort: the short chaos form, every mode,
## seed 1 and a random seed, 20 s each, and seed 1 again with -secure
## in the cluster modes
## (PROTOCOL.md §8: TLS, mutual TLS between members, a cluster secret),
## verbose so that the seeds and the
## reports are in the log; alone, so that its clusters and the
## e2e tests' do not share the 2 cores), then the allocation tests, which
## only count without it (they are built !race). ops/ runs on its own too
## (test-ops).
test: lint test-python test-ops
	$(GO) test -race -count=1 -timeout 15m $$($(GO) list $(PKGS) | grep -v -e '/chaos$$' -e '/ops$$')
	$(GO) test -race -count=1 -timeout 10m -v ./chaos/
	$(GO) test -count=1 -run 'Allocs$$' ./proto/ ./shard/ ./client/ ./repl/... ./engine/ ./httpapi/

## test-ops: the operator's assets in ops/ (ops/doc.go): systemd-analyze
## verify and security on ops/lockd.service, promtool check rules and test
## rules on ops/prometheus/, and the Grafana dashboard's and the rules'
## metric names against the /metrics of running lockd nodes (a single node,
## a priority and a raft cluster: one package at a time). A missing tool
## (systemd's systemd-analyze, prometheus's promtool) skips its test with a
## reason, and fails under CI=true.
test-ops:
	$(GO) test -count=1 -p 1 -timeout 10m -v ./ops/

test-short:
	$(GO) test -short -count=1 $(PKGS)

lint: check-tracked fmt-check tidy-check vet staticcheck lint-python

## tidy-check: each module of the workspace (go list -m) is `go mod tidy`
## clean on its own (GOWORK=off: what a user of that module resolves).
tidy-check:
	@set -e; for d in $$($(GO) list -m -f '{{.Dir}}'); do \
		(cd "$$d" && GOWORK=off $(GO) mod tidy -diff) || { echo "go mod tidy needed in $$d"; exit 1; }; \
	done

## test-python: the Python client's tests (clients/python), with Debian's
## interpreter, python3-pytest and python3-venv (the install test makes
## venvs; LOCKD_TEST_PYTHONS=/path/python3.12:... adds interpreters to it);
## they build cmd/lockd and run it.
test-python:
	cd clients/python && $(PYTHON) -m pytest -q -p no:cacheprovider

## lint-python: mypy --strict on the Python client and its build backend
## (Debian's python3-mypy).
lint-python:
	$(PYTHON) -m mypy --strict --cache-dir clients/python/.mypy_cache clients/python/src/lockd clients/python/_build/lockd_build.py

## check-tracked: no tracked executable, no tracked file over 1 MiB outside testdata/.
check-tracked:
	@.ci/check-tracked

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet $(PKGS)

staticcheck:
	$(GO) run $(STATICCHECK) $(PKGS)

## bench: Go benchmarks of the hot paths (parse, shard, end to end over loopback).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./proto/ ./shard/ ./engine/

## fuzz: each parser's fuzz target for FUZZTIME (bounded).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParseRequest$$' -fuzztime $(FUZZTIME) ./proto/
	$(GO) test -run '^$$' -fuzz '^FuzzParseResponse$$' -fuzztime $(FUZZTIME) ./proto/
	$(GO) test -run '^$$' -fuzz '^FuzzRespReply$$' -fuzztime $(FUZZTIME) ./bench/
	$(GO) test -run '^$$' -fuzz '^FuzzParseSnapshot$$' -fuzztime $(FUZZTIME) ./store/
	$(GO) test -run '^$$' -fuzz '^FuzzFrameReader$$' -fuzztime $(FUZZTIME) ./repl/
	$(GO) test -run '^$$' -fuzz '^FuzzBatchRecords$$' -fuzztime $(FUZZTIME) ./repl/
	$(GO) test -run '^$$' -fuzz '^FuzzSnapEntries$$' -fuzztime $(FUZZTIME) ./repl/

clean:
	rm -rf bin

## bench-client: the client library against the raw generator, each
## loading a lockd process of its own (the raw generator's benchmarks are in
## internal/lockdtest: the client module's tests import nothing of the root
## module).
.PHONY: bench-client
bench-client:
	$(GO) test -run '^$$' -bench 'Parallel64' -benchmem -benchtime 800000x ./client/
	$(GO) test -run '^$$' -bench 'RawPipelined' -benchmem -benchtime 800000x ./internal/lockdtest/

## bench-peers: lockd against the echo ceiling, Redis and etcd, interleaved
## over ROUNDS rounds (installs redis-server and etcd-server with apt-get
## when they are missing; the harness starts and stops them on loopback).
ROUNDS ?= 3
.PHONY: bench-peers
bench-peers:
	@command -v redis-server >/dev/null && command -v etcd >/dev/null || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server etcd-server; }
	$(GO) run ./bench -targets all -rounds $(ROUNDS) -svg bench/latency.svg -markdown

## bench-cluster: lockd against lockd-priority (an active and a standby,
## separate lockd processes), lockd-raft (three members, fsync on) and lockd-bin (the binary as a single node), interleaved
## over ROUNDS rounds; issue 11's targets judged per round.
.PHONY: bench-cluster
bench-cluster:
	$(GO) run ./bench -targets lockd,lockd-priority,lockd-raft,lockd-bin -rounds $(ROUNDS) -markdown

## bench-failover: kill -9 and SIGTERM of a priority cluster's active under
## load, TRIALS times each (median and worst), and the handover back;
## FAILOVER_MODE=raft: of a raft cluster's current leader (3 members), and
## the victim's rejoin as a follower.
TRIALS ?= 10
FAILOVER_MODE ?= priority
.PHONY: bench-failover
bench-failover:
	$(GO) run ./bench -failover $(TRIALS) -failover-mode $(FAILOVER_MODE) -markdown

## chaos: the long Jepsen-style run of each mode in CHAOS_MODES, for
## CHAOS_DURATION each (docs/RELIABILITY.md); CHAOS_FLAGS adds flags
## (-seed N, -json, -out DIR, ...). Fails on the first mode that fails.
CHAOS_DURATION ?= 10m
CHAOS_MODES    ?= single priority raft
CHAOS_FLAGS    ?=
chaos:
	@set -e; for m in $(CHAOS_MODES); do \
		echo "== chaos -mode $$m -duration $(CHAOS_DURATION) $(CHAOS_FLAGS)"; \
		$(GO) run ./chaos -mode $$m -duration $(CHAOS_DURATION) $(CHAOS_FLAGS); \
	done

## chaos-short: only the CI form (it also runs inside `make test`).
chaos-short:
	$(GO) test -race -count=1 -timeout 10m -run '^TestChaosShort$$' -v ./chaos/
