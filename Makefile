# flowrun's build. `make run` and `make test` are the two commands a newcomer needs.

GO      ?= go
BIN     := bin/flowrun
# What flowrun version prints: git describe's name of the checkout and its commit. Outside a git
# checkout both are empty, and the binary falls back to what go build recorded (or "dev").
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X github.com/flowrun/flowrun/cmd.Version=$(VERSION) -X github.com/flowrun/flowrun/cmd.Commit=$(COMMIT)
# The example that make run runs, and its variables.
EXAMPLE   ?= examples/pipelines/fanout
RUN_FLAGS ?= --var events=40 --var signups_file=bin/signups.jsonl

.PHONY: all build run test soak soak-connectors lint fmt bench bench-quick bench-profile bench-tools bench-peers bench-expr fuzz generate tools clean mutants

all: build

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/flowrun

# Run the example pipeline as a job, on an embedded Redis unless FLOWRUN_REDIS_URL names one. It
# says first which example it runs (the pipeline's own name, in the log, is another).
run: build
	@echo "make run: the example $(EXAMPLE) with $(RUN_FLAGS) (EXAMPLE=examples/pipelines/NAME runs another)"
	./$(BIN) run --until-drained $(RUN_FLAGS) $(EXAMPLE)

# Every test, with the race detector. The tests start their own redis-server processes on free
# loopback ports; tools checks that the programs they need are installed. Most of the runtime
# package's long tests wait on processes and brokers, and run four at a time (t.Parallel).
test: tools lint
	$(GO) test -race -parallel 4 -timeout 20m ./...
	$(GO) run ./cmd/flowrun test examples/pipelines/*

# The long proof of stateful results: SOAK_DRAWS generated pipelines (internal/modeltest), each run
# as a job on the embedded Redis and on a redis-server, and as flowrun processes with their SIGKILLs
# and second processes on a redis-server and a 3-master cluster, all compared with the reference
# model. make test runs 32 of them, 4 with kills. Without the race detector, to draw more in the
# time; 25 to 40 minutes for 500 on 2 cores. A failure prints its seed; SOAK_SEED=N replays it.
# Then the proofs of issue 23 at full scale (a few minutes): 50,000 orders looked up in a changing
# table on every backend and through 50 SIGKILLs, a rate limit's pace across three processes, and
# a join and a pattern through 50 SIGKILLs each.
SOAK_DRAWS ?= 500
SOAK_SEED  ?= 0
SOAK_TESTS := TestGeneratedPipelines|TestLookupAtProcessingTimeIsExact|TestLookupAtProcessingTimeThroughKills|TestRateLimitHoldsAcrossProcesses|TestJoinExactlyOnceThroughKillCycles|TestPatternExactlyOnceThroughKillCycles|TestLookupAsOfExactlyOnceThroughKillCycles|TestReloadUnderLoad
soak: soak-connectors
	@mkdir -p bin
	@echo "go test ./runtime -run '^($(SOAK_TESTS))$$' -soak -draws $(SOAK_DRAWS): the log goes to bin/soak.log"
	@$(GO) test ./runtime -run '^($(SOAK_TESTS))$$' -count=1 -timeout 4h -soak -draws $(SOAK_DRAWS) -seed $(SOAK_SEED) -v \
		> bin/soak.log 2>&1; status=$$?; \
		grep -E '^    --- FAIL|generated_test.go:[0-9]+: (sink|replay|stage|st[0-9]|the last)|draws from|draws:|(tables|ratelimit)_proof_test.go|(join|pattern|tables_asof)_test.go:[0-9]+: [0-9]+ SIGKILL|reload_test.go:[0-9]+: [0-9]+ messages' bin/soak.log; \
		tail -n 2 bin/soak.log; exit $$status

# The connectors' proofs at issue 24's scale (-soak), also run by make soak: the http_server source
# with 100,000 events through SIGKILLs, the sql sink's 200,000 rows through 30 SIGKILLs and through
# a 5 s outage (a TCP proxy the test cuts: the machine's servers are never stopped) on PostgreSQL
# and MariaDB, postgres_cdc through 50,000 changes, SIGKILLs and Redis restarts, and issue 25's
# proofs: the amqp and kafka kinds through SIGKILLs with 100,000 messages each, and round trips of
# 100,000 messages from AMQP, Kafka, MQTT and NATS JetStream through two stages and back, through
# two SIGKILLs and a restart of a broker of the test's own (kfake for Kafka, a Mosquitto process
# for MQTT). A few minutes on 2 shared cores; the log goes to bin/soak-connectors.log.
CONNECTOR_PROOFS := TestHTTPServerSourceSurvivesKills|TestSQLSinkExactlyOnceThroughKills|TestSQLSinkWaitsOutAFiveSecondOutage|TestPostgresCDCThroughKills|TestAMQPSourceThroughKills|TestAMQPRoundTripThroughKillsAndARestart|TestAMQPWithRabbitmqadmin|TestKafkaSourceThroughKills|TestKafkaSinkThroughKills|TestKafkaRoundTripThroughKills|TestNATSRoundTripThroughKillsAndARestart|TestMQTTRoundTripThroughKills
soak-connectors:
	@mkdir -p bin
	@echo "go test ./runtime -run '$(CONNECTOR_PROOFS)' -soak: the log goes to bin/soak-connectors.log"
	@$(GO) test ./runtime -run '^($(CONNECTOR_PROOFS))$$' -count=1 -timeout 1h -soak -v > bin/soak-connectors.log 2>&1; status=$$?; \
		grep -E '^ +(--- FAIL|[a-z_]+_test.go:[0-9]+:)' bin/soak-connectors.log; tail -n 2 bin/soak-connectors.log; exit $$status

# gofmt, go vet, golangci-lint (.golangci.yml) and flowrun fmt on the examples; go vet and
# golangci-lint on the benchmark harness too, a module of its own (bench/). golangci-lint is a
# tool of a module of its own (tools/golangci, which pins its version), so that the main module
# does not depend on it; go tool builds it once into its cache (a few minutes, after downloading
# it the first time), and both it and golangci-lint's own cache make later runs take seconds.
GOLANGCI_LINT := $(GO) tool -modfile=$(CURDIR)/tools/golangci/go.mod golangci-lint
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...
	cd bench && $(GO) vet ./... && $(GOLANGCI_LINT) run ./...
	$(GO) run ./cmd/flowrun fmt --check examples/pipelines/* examples/plugins/pipeline

fmt:
	gofmt -w $$(git ls-files '*.go')
	$(GO) run ./cmd/flowrun fmt -w examples/pipelines/* examples/plugins/pipeline

# The benchmarks of BENCHMARKS.md: flowrun (bin/flowrun, as a child process) against raw go-redis,
# Watermill and Benthos (bench-peers builds it once), on a private redis-server, in interleaved
# rounds, then the cost table (-costs). It takes about 25 minutes: run nothing else meanwhile.
# BENCH_FLAGS passes options, e.g. BENCH_FLAGS="-rounds 5 -md bin/bench.md". The harness is a module
# of its own (bench/), so that the main module does not depend on Watermill; -mod=mod lets it follow
# the main module's requirements when they change.
BENCH_FLAGS ?=
BENCH_GO    := cd bench && GOFLAGS=-mod=mod $(GO)
bench: build bench-tools bench-peers
	./bin/flowbench -flowrun $(BIN) -benthos bin/benthos -costs $(BENCH_FLAGS)

# Every scenario once for a few seconds with small counts: proves that the harness still works and
# asserts nothing about speed (CI runs it).
bench-quick: build bench-tools
	$(BENCH_GO) vet ./...
	$(BENCH_GO) test ./...
	./bin/flowbench -flowrun $(BIN) -quick -costs

# CPU and allocation profiles of the flat-out phase of RAW-1, FW-1, RAW-3 and FW-3 in bin/profiles
# (flowrun through a profiling wrapper, bench/cmd/flowrun-pprof), and the top of FW-3's CPU profile.
# BENCH_FLAGS="-only 'publish|trace 1%'" profiles other scenarios.
bench-profile: build bench-tools
	./bin/flowbench -flowrun $(BIN) -profile bin/profiles -pprof-bin bin/flowrun-pprof $(BENCH_FLAGS)
	$(GO) tool pprof -top -cum -nodecount 40 bin/flowrun-pprof bin/profiles/fw-3/cpu.pprof

bench-tools:
	$(BENCH_GO) build -o ../bin/flowbench ./cmd/flowbench
	$(BENCH_GO) build -o ../bin/flowrun-pprof ./cmd/flowrun-pprof
	$(GO) build -C tools/kfake -o $(CURDIR)/bin/kfake .

# Benthos, the peer of the Benthos scenarios, built once into bin/benthos (never into the
# repository): the exact version from the Go module proxy (which lists no versions), built in its
# read-only module directory. Go 1.26 needs -checklinkname=0 for one of its dependencies; the -X
# stamps the version that a build outside Benthos's own Makefile does not know.
BENTHOS_VERSION := v4.27.0
BENTHOS_MODULE  := github.com/benthosdev/benthos/v4
bench-peers:
	@if bin/benthos --version 2>/dev/null | grep -qx 'Version: $(BENTHOS_VERSION)'; then \
		echo "bin/benthos is Benthos $(BENTHOS_VERSION)"; \
	else \
		set -e; mkdir -p bin; \
		dir=$$(cd "$${TMPDIR:-/tmp}" && $(GO) mod download -json $(BENTHOS_MODULE)@$(BENTHOS_VERSION) | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$$/\1/p'); \
		test -n "$$dir" || { echo "go mod download $(BENTHOS_MODULE)@$(BENTHOS_VERSION) gave no module directory"; exit 1; }; \
		echo "building Benthos $(BENTHOS_VERSION) from $$dir into bin/benthos (a few minutes the first time)"; \
		cd "$$dir" && GOFLAGS="-mod=mod -buildvcs=false" $(GO) build \
			-ldflags "-checklinkname=0 -X $(BENTHOS_MODULE)/internal/cli.Version=$(BENTHOS_VERSION)" \
			-o "$(CURDIR)/bin/benthos" ./cmd/benthos; \
	fi

# The per-message expression benchmarks (flow/expr), also in BENCHMARKS.md.
bench-expr:
	$(GO) test -run '^$$' -bench . -benchmem ./flow/expr

# A short run of every fuzzer, on top of the seed corpora that go test always runs.
FUZZTIME ?= 20s
fuzz:
	$(GO) test ./flow -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME)
	$(GO) test ./flow/testfile -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZTIME)
	$(GO) test ./flow/expr -run '^$$' -fuzz '^FuzzCompile$$' -fuzztime $(FUZZTIME)
	$(GO) test ./flow/expr -run '^$$' -fuzz '^FuzzEval$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transport/redis -run '^$$' -fuzz '^FuzzDecodeEntry$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transport/redis -run '^$$' -fuzz '^FuzzValidTraceParent$$' -fuzztime $(FUZZTIME)
	$(GO) test ./stages -run '^$$' -fuzz '^FuzzPayloadCodec$$' -fuzztime $(FUZZTIME)
	$(GO) test ./stages -run '^$$' -fuzz '^FuzzFields$$' -fuzztime $(FUZZTIME)
	$(GO) test ./transport/jsonscan -run '^$$' -fuzz '^FuzzCheck$$' -fuzztime $(FUZZTIME)
	$(GO) test ./runtime/state -run '^$$' -fuzz '^FuzzPackedRecord$$' -fuzztime $(FUZZTIME)

# Regenerate the files derived from the languages' registries (packages flow and flow/testfile) and
# the golden graphs.
generate:
	$(GO) test ./flow ./flow/testfile ./schema -run 'Generated|Golden' -update

# The programs the tests need besides Go: redis-server (tests start their own), a C compiler for
# the race detector (cgo; the tests also build the flowrun processes they start with -race),
# Graphviz's dot (the graph tests render every example), and PostgreSQL and MariaDB servers for the
# sql sink's tests, which make databases of their own there.
tools:
	@command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server (or brew install redis)"; exit 1; }
	@command -v gcc >/dev/null || command -v cc >/dev/null || { echo "gcc is missing: go test -race needs cgo (apt-get install gcc libc6-dev)"; exit 1; }
	@command -v dot >/dev/null || echo "note: Graphviz's dot is missing, so the DOT rendering tests are skipped (apt-get install graphviz)"
	@bash -c 'exec 3<>/dev/tcp/127.0.0.1/5432' 2>/dev/null || echo "note: no PostgreSQL on 127.0.0.1:5432 (user postgres, trust), so the sql sink's tests skip it (docs/connectors.md)"
	@bash -c 'exec 3<>/dev/tcp/127.0.0.1/3306' 2>/dev/null || echo "note: no MariaDB or MySQL on 127.0.0.1:3306 (root, no password), so the sql sink's tests skip it (docs/connectors.md)"

clean:
	rm -rf bin

# Apply each known-dangerous mutation (internal/mutants/list.go) to a copy of the tree and check that
# the tests catch it; exits 1 when one survives. On demand: it takes about a minute per mutation.
# MUTANTS=regexp runs only the matching ones.
MUTANTS ?=
mutants:
	$(GO) run ./internal/mutants -run '$(MUTANTS)'
