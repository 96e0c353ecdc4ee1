# The two commands of the README, and the steps they are made of.
#   make demo   a local cluster (real etcd + systemd machines), a unit running; left up
#   make test   every test: unit, contract (real etcd), fleetctl end to end, functional
SHELL := /bin/bash
CARGO ?= cargo
DEMO_DIR ?= $(CURDIR)/target/demo
APT_PACKAGES := etcd-server etcd-client protobuf-compiler iproute2 dbus systemd util-linux

.PHONY: all deps build test test-unit lint demo demo-down bench clean

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

# Every test. Functional tests boot systemd machines in namespaces: they need root.
test: build
	$(CARGO) test --workspace --all-features -- --test-threads=4

test-unit:
	$(CARGO) test --workspace --lib

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings

demo: build
	@bash scripts/demo.sh "$(DEMO_DIR)"

demo-down:
	@if [ -f "$(DEMO_DIR)/cluster.json" ]; then ./target/debug/fleet-cluster down --dir "$(DEMO_DIR)"; else echo "no demo cluster at $(DEMO_DIR)"; fi

clean: demo-down
	$(CARGO) clean
