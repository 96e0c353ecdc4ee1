#!/usr/bin/env bash
# make demo: a local fleet cluster (real etcd + 3 systemd machines in namespaces, fleetd in
# each), units started through fleetctl and running, left up for you to play with. Every
# fleetd serves its API on TCP with TLS (port 49153 of its machine's IP; certificates in
# $dir/tls), so fleetctl on the host reaches it, and status and journal need no ssh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$root/target/demo}
# The debug build: wherever cargo's target directory is (the Makefile passes it; run alone,
# CARGO_TARGET_DIR or target/ says).
bin=${FLEET_BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/debug}
mkdir -p "$(dirname "$dir")"

if [ -f "$dir/cluster.json" ]; then
  echo "A demo cluster is already up in $dir; tearing it down first."
  "$bin/fleet-cluster" down --dir "$dir" >/dev/null || true
fi
"$bin/fleet-cluster" cleanup >/dev/null 2>&1 || true
if ! "$bin/fleet-cluster" up --machines 3 --dir "$dir" --agent-ttl 5s --api-tls-port 49153 >"$dir.up.log" 2>&1; then
  cat "$dir.up.log"
  exit 1
fi
endpoint=$(sed -n 's/^etcd: *\(http[^ ]*\).*/\1/p' "$dir.up.log" | head -1)
printed() { sed -n "s/^$1: *//p" "$dir.up.log" | head -1; }
api=$(printed api)
ca=$(printed ca)
cert=$(printed cert)
key=$(printed key)
fleetctl() { "$bin/fleetctl" --driver etcd --endpoint "$endpoint" "$@"; }
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
# The host's bin dir is mounted here in every machine (functional-tests/src/fleetd.rs).
MACHINE_FLEETCTL=/opt/fleet/bin/fleetctl
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

  export FLEETCTL_ENDPOINT=$api
  export FLEETCTL_API_CA_FILE=$(q "$ca") FLEETCTL_API_CERT_FILE=$(q "$cert") FLEETCTL_API_KEY_FILE=$(q "$key")
  alias fleetctl=$(q "$bin/fleetctl")
  cd $(q "$dir/units")
  fleetctl list-units
  fleetctl cat hello.service
  fleetctl status hello.service
  fleetctl journal hello.service
  fleetctl stop hello.service; fleetctl start hello.service
  fleetctl destroy web@3.service
  fleetctl ui
  openssl pkcs12 -export -in "\$FLEETCTL_API_CERT_FILE" -inkey "\$FLEETCTL_API_KEY_FILE" -out fleetctl.p12 -passout pass:

fleetctl talks to the API of m1's fleetd over TLS ($api); status and journal
ask the fleetd of the unit's own machine, at the address it publishes (\`fleetctl journal -f
hello.service\` follows until Ctrl-C). The FLEETCTL_API_* files are the fleetds' authority
and fleetctl's certificate; etcd's own files, if it had TLS, would be FLEETCTL_CA_FILE and
friends.

\`fleetctl ui\` prints the web dashboard's address ($api/ui/): a browser on this host opens
it with fleetctl's certificate, fleetctl.p12 (no password; the openssl line above writes it),
imported into the browser, and the authority $(q "$ca") trusted.

Or over etcd, fleetctl reading and writing the registry itself (status and journal still ask
each unit's fleetd, with the API files above):

  FLEETCTL_DRIVER=etcd FLEETCTL_ENDPOINT=$endpoint fleetctl list-units
  FLEETCTL_DRIVER=etcd FLEETCTL_ENDPOINT=$endpoint fleetctl status hello.service

Enter a machine (its own systemd, journal and network; no sshd: \`fleetctl ssh\` needs one),
with fleetd's own log \`journalctl -u fleet\` and its warnings \`journalctl -u fleet -p warning\`.
Inside, fleetctl needs no address: it talks to that machine's fleetd over /var/run/fleet.sock
(\`$MACHINE_FLEETCTL list-units\`):
$(grep -E '^ +m[0-9]+ ' "$dir.up.log" | sed 's/^ */  /')

Tear it down:

  make -C $(q "$root") DEMO_DIR=$(q "$dir") FLEET_BIN_DIR=$(q "$bin") demo-down
  # or: $(q "$bin/fleet-cluster") down --dir $(q "$dir")
EOF
