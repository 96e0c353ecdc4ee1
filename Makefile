# The two commands of the README, and the steps they are made of.
#   make demo   a local cluster (real etcd + systemd machines), a unit running; left up
#   make test   every test: unit, contract (real etcd), fleetctl end to end, functional
SHELL := /bin/bash
CARGO ?= cargo
DEMO_DIR ?= $(CURDIR)/target/demo
APT_PACKAGES := etcd-server etcd-client protobuf-compiler iproute2 dbus systemd util-linux openssl

.PHONY: all deps build test test-unit lint demo demo-down bench soak soak-only clean

all: build

# Installs what the build and the tests need, once (skipped when everything is there).
deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (rustup, 1.85 or newer) first"; exit 1; }

build: deps
	$(CARGO) build --workspace --bins

# Every test. Functional tests boot systemd machines in namespaces: they need root. The
# long fault-injection variants (`make soak`, ~5 min) run last: ignored by `cargo test` so
# that a plain `cargo test` stays quick, but part of every `make test` and so of CI.
test: build
	$(CARGO) test --workspace --all-features -- --test-threads=4
	$(MAKE) --no-print-directory soak-only

# The long fault-injection variants alone (50 units with 20 kills of fleetd, 100 rounds of
# racing clients, and the ~5 min chaos soak of functional-tests/tests/chaos.rs).
soak: build
	$(MAKE) --no-print-directory soak-only

soak-only:
	$(CARGO) test -p fleet-functional-tests --test faults --test chaos -- --ignored --test-threads=4

test-unit:
	$(CARGO) test --workspace --lib

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

demo: build
	@bash scripts/demo.sh "$(DEMO_DIR)"

demo-down:
	@if [ -f "$(DEMO_DIR)/cluster.json" ]; then ./target/debug/fleet-cluster down --dir "$(DEMO_DIR)"; else echo "no demo cluster at $(DEMO_DIR)"; fi

# Every benchmark of issue 6 (not part of `make test`), each scenario writing its section of
# docs/benchmarks.md: release build, then e2e, one-agent, scale, plot. Needs root; ~7 min
# (~14 from a clean clone, with the release build).
bench: deps
	@start=$$(date +%s); \
	$(CARGO) build --release -p fleetd -p fleetctl -p fleet-bench && \
	./target/release/fleet-bench e2e && \
	./target/release/fleet-bench one-agent && \
	./target/release/fleet-bench scale && \
	./target/release/fleet-bench plot && \
	./target/release/fleet-bench total --secs $$(( $$(date +%s) - start ))

clean: demo-down
	$(CARGO) clean
