# The two commands of the README, and the steps they are made of.
#   make demo   a local cluster (real etcd + systemd machines), a unit running; left up
#   make test   every test: unit, contract (real etcd), fleetctl end to end, functional
SHELL := /bin/bash
CARGO ?= cargo
# Cargo's target directory (CARGO_TARGET_DIR or a cargo config may move it), asked lazily.
TARGET_DIR = $(or $(shell $(CARGO) metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p'),$(CURDIR)/target)
DEMO_DIR ?= $(TARGET_DIR)/demo
APT_PACKAGES := gcc libc6-dev protobuf-compiler libprotobuf-dev etcd-server etcd-client systemd dbus dbus-daemon dbus-system-bus-common util-linux iproute2 openssl git

.PHONY: all deps build test test-api test-unit lint demo demo-down bench soak soak-only clean man

all: build

# Installs what the build and the tests need, once (skipped when everything is there), then
# checks that every file they use is really there (scripts/deps.tsv lists each file with its
# package; functional-tests/tests/packages.rs keeps that list and APT_PACKAGES true). Every
# package is named directly: apt-get runs with --no-install-recommends, as on a bare machine.
deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@bash scripts/check-deps.sh

build: deps
	$(CARGO) build --workspace --bins

# Every test. Functional tests boot systemd machines in namespaces: they need root. The
# long fault-injection variants (`make soak`, ~5 min) run last: ignored by `cargo test` so
# that a plain `cargo test` stays quick, but part of every `make test` and so of CI.
test: build
	$(CARGO) test --workspace --all-features -- --test-threads=4
	$(MAKE) --no-print-directory test-api
	$(MAKE) --no-print-directory soak-only

# fleetctl's functional suites once more over the API driver: every fleetctl command of them
# goes through a machine's fleetd (its /var/run/fleet.sock) instead of straight to etcd
# (functional-tests/README.md, "fleetctl's two drivers"; ~2 min). Then fleetctl's end-to-end
# suites over fleet-api served by the test on a unix socket over the same etcd
# (crates/fleetctl/tests/over/mod.rs; ~15 s).
# The API's own functional suites (api, api_roles, remote, metrics, doc_clients) speak to
# fleetd's API whatever the driver, so `make test`'s cargo test runs them once.
FLEETCTL_SUITES := agent bad_input disruption drain remote replace scheduling
test-api:
	FLEET_TEST_DRIVER=api $(CARGO) test -p fleet-functional-tests $(addprefix --test ,$(FLEETCTL_SUITES)) -- --test-threads=4
	FLEETCTL_TEST_DRIVER=api $(CARGO) test -p fleetctl --test cli --test bad_input --test blocking

# The long fault-injection variants alone (50 units with 20 kills of fleetd, 100 rounds of
# racing clients, and the ~5 min chaos soak of functional-tests/tests/chaos.rs).
soak: build
	$(MAKE) --no-print-directory soak-only

soak-only:
	$(CARGO) test -p fleet-functional-tests --test faults --test chaos -- --ignored --test-threads=4

# fleetctl's man pages, generated from its command-line definition (fleetctl.1 and one page
# per command), into $(TARGET_DIR)/man.
man: build
	"$(TARGET_DIR)/debug/fleetctl" man "$(TARGET_DIR)/man"

test-unit:
	$(CARGO) test --workspace --lib

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

demo: build
	@FLEET_BIN_DIR="$(TARGET_DIR)/debug" bash scripts/demo.sh "$(DEMO_DIR)"

demo-down:
	@if [ -f "$(DEMO_DIR)/cluster.json" ]; then "$(TARGET_DIR)/debug/fleet-cluster" down --dir "$(DEMO_DIR)"; else echo "no demo cluster at $(DEMO_DIR)"; fi

# Every benchmark of issues 6 and 15 (not part of `make test`), each scenario writing its section
# of docs/benchmarks.md: release build, then e2e, one-agent, scale, api, plot. Needs root; ~7 min
# (~14 from a clean clone, with the release build).
bench: deps
	@start=$$(date +%s); \
	$(CARGO) build --release -p fleetd -p fleetctl -p fleet-bench && \
	"$(TARGET_DIR)/release/fleet-bench" e2e && \
	"$(TARGET_DIR)/release/fleet-bench" one-agent && \
	"$(TARGET_DIR)/release/fleet-bench" scale && \
	"$(TARGET_DIR)/release/fleet-bench" api && \
	"$(TARGET_DIR)/release/fleet-bench" plot && \
	"$(TARGET_DIR)/release/fleet-bench" total --secs $$(( $$(date +%s) - start ))

clean: demo-down
	$(CARGO) clean
