#!/usr/bin/env bash
# make demo: a local fleet cluster (real etcd + 3 systemd machines in namespaces, fleetd in
# each), units started through fleetctl and running, left up for you to play with.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/target/demo}
# The debug build: wherever cargo's target directory is (the Makefile passes it).
bin=${FLEET_BIN_DIR:-$root/target/debug}
mkdir -p "$(dirname "$dir")"

if [ -f "$dir/cluster.json" ]; then
  echo "A demo cluster is already up in $dir; tearing it down first."
  "$bin/fleet-cluster" down --dir "$dir" >/dev/null || true
fi
"$bin/fleet-cluster" cleanup >/dev/null 2>&1 || true
if ! "$bin/fleet-cluster" up --machines 3 --dir "$dir" --agent-ttl 5s >"$dir.up.log" 2>&1; then
  cat "$dir.up.log"
  exit 1
fi
endpoint=$(sed -n 's/^etcd: *\(http[^ ]*\).*/\1/p' "$dir.up.log" | head -1)
fleetctl() { "$bin/fleetctl" --endpoint "$endpoint" "$@"; }
q() { printf '%q' "$1"; }  # one shell word, for the lines printed to paste

mkdir -p "$dir/units"
cat >"$dir/units/hello.service" <<'UNIT'
[Unit]
Description=Hello World

[Service]
ExecStart=/bin/bash -c "while true; do echo \"Hello, world\"; sleep 1; done"
UNIT
cat >"$dir/units/web@.service" <<'UNIT'
[Unit]
Description=Web server %i

[Service]
ExecStart=/bin/sleep infinity

[X-Fleet]
Conflicts=web@*.service
UNIT

say() { printf '\n$ %s\n' "$*"; }
cd "$dir/units"
# Wait for every machine to register (a condition, not a fixed sleep).
for _ in $(seq 1 100); do
  [ "$(fleetctl list-machines --no-legend 2>/dev/null | wc -l)" -ge 3 ] && break
  sleep 0.1
done
say fleetctl list-machines
fleetctl list-machines
say fleetctl start hello.service
fleetctl start hello.service
say fleetctl start web@1 web@2 web@3
fleetctl start web@1 web@2 web@3
say fleetctl list-unit-files
fleetctl list-unit-files
say fleetctl list-units
fleetctl list-units

cat <<EOF

The cluster is up and stays up. Use it:

  export FLEETCTL_ENDPOINT=$endpoint
  alias fleetctl=$(q "$bin/fleetctl")
  cd $(q "$dir/units")
  fleetctl list-units
  fleetctl cat hello.service
  fleetctl stop hello.service; fleetctl start hello.service
  fleetctl destroy web@3.service

Enter a machine (its own systemd, journal and network; no sshd, so the status of a unit is
\`systemctl status hello.service\` in there, and fleetd's own log \`journalctl -u fleet\`,
its warnings \`journalctl -u fleet -p warning\`):
$(grep -E '^ +m[0-9]+ ' "$dir.up.log" | sed 's/^ */  /')

Tear it down:

  make -C $(q "$root") DEMO_DIR=$(q "$dir") demo-down
  # or: $(q "$bin/fleet-cluster") down --dir $(q "$dir")
EOF
