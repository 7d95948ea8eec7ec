# parascope: `sudo make run` profiles this host for 30 s; `sudo make test` runs every test.
# Both install the Debian packages they need first (scripts/setup, idempotent).
# `make fuzz` runs the libFuzzer targets for FUZZ_SECONDS each (test/fuzz/README.md).
# `sudo make bench` measures overhead and footprint against perf, offcputime and bpftrace
# (bench/README.md; peers installed by scripts/bench-setup).
BUILD ?= build
JOBS ?= $(shell nproc)
RUN_FLAGS ?= --duration=30s --output-dir=./profiles --print-summary
PPROF := $(BUILD)/tools/pprof
PYTHON ?= /usr/bin/python3

FUZZ_SECONDS ?= 300
FUZZ_TARGETS ?= proc perf_map elf cfi

.PHONY: all setup build run test unit fuzz bench clean test-kernels install install-files image test-image

all: build

setup:
	@bash scripts/setup

build: setup $(PPROF)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The real pprof tool, built offline from Debian's Go packages; tests read profiles through it.
$(PPROF):
	@mkdir -p $(dir $@)
	GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE=$(abspath $(BUILD))/go-cache \
	  go build -o $@ github.com/google/pprof

run: build
	$(BUILD)/bin/parascope $(RUN_FLAGS)

# Unit tests need no privileges; [root] tests load BPF and must run as root (in CI they fail,
# not skip, without it).
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600

unit: build
	cd $(BUILD) && ctest --output-on-failure -R '^unit:' 

# The kernel matrix (test/kernels/README.md): Debian's own 5.10, 6.1 and 6.12 kernels booted under
# QEMU, the smoke subset run on each; root; downloads the kernels and a Debian 12 base the first
# time. KERNELS=bullseye,trixie picks suites.
KERNELS ?= all
test-kernels: build
	PPROF=$(abspath $(PPROF)) WORKLOADS=$(abspath $(BUILD))/workloads \
	  bash test/kernels/run.sh $(KERNELS) $(abspath $(BUILD))/bin/parascope

# Long fuzzing runs, one target after another (test/fuzz/README.md). Builds only the fuzzers; each
# target's corpus keeps growing in $(BUILD)/fuzz/run/long/<target> across runs, crash inputs are
# saved there too. `make test` runs 15 s of each (ctest "fuzz:<target>").
fuzz: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target fuzzers
	bash test/fuzz/run.sh --fuzz-dir $(BUILD)/fuzz --seconds $(FUZZ_SECONDS) --mode long $(FUZZ_TARGETS)

# Benchmarks print figures and assert nothing; settings via BENCH_* variables (bench/README.md).
# Builds only the agent: the benchmarks need nothing else.
bench: setup $(PPROF)
	@bash scripts/bench-setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target parascope unwind_table_bench
	BENCH_OUT=$(abspath $(BUILD))/bench PARASCOPE=$(abspath $(BUILD))/bin/parascope \
	  $(PYTHON) bench/bench.py

# `sudo make install`: the agent, its systemd unit (deploy/systemd/parascope.service), the host
# configuration (/etc/parascope/config.yaml, kept when it exists) and the documented example.
# DESTDIR stages the tree elsewhere (packaging, tests).
PREFIX ?= /usr/local
SYSCONFDIR ?= /etc
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|/etc/parascope/|$(SYSCONFDIR)/parascope/|g'
install: build install-files
# The copying alone, from an existing build (test/e2e/deploy_e2e_test.cc stages it with PREFIX).
install-files:
	install -D -m 0755 $(BUILD)/bin/parascope $(DESTDIR)$(PREFIX)/bin/parascope
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system $(DESTDIR)$(PREFIX)/share/doc/parascope \
	  $(DESTDIR)$(SYSCONFDIR)/parascope
	$(SUBST) deploy/systemd/parascope.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/parascope.service
	install -m 0644 README.md deploy/config.example.yaml $(DESTDIR)$(PREFIX)/share/doc/parascope/
	test -e $(DESTDIR)$(SYSCONFDIR)/parascope/config.yaml || \
	  $(SUBST) deploy/systemd/config.yaml > $(DESTDIR)$(SYSCONFDIR)/parascope/config.yaml

# `sudo make image`: the container image (Dockerfile) with podman, from a local debootstrap base
# when none is present (scripts/image). `sudo make test-image`: the agent run from that image's
# root filesystem, its profiles checked (scripts/test-image).
image:
	@bash scripts/setup --image
	PARASCOPE_VERSION=$(shell git describe --always --dirty 2>/dev/null || echo dev) bash scripts/image
test-image: build
	BUILD=$(BUILD) bash scripts/test-image

clean:
	rm -rf $(BUILD)
