#!/usr/bin/env bash
# Run a command inside a private network namespace: loopback up plus a veth pair with
# private addresses (10.77.0.1/24, 10.77.0.2/24), so no packet (mDNS included) leaves the
# machine, and Chromium, which ignores loopback for ICE, still has an interface to use.
set -euo pipefail
if [ "${DAISY_IN_NETNS:-}" = 1 ]; then exec "$@"; fi
exec unshare -n -- env DAISY_IN_NETNS=1 bash -c '
  set -e
  ip link set lo up
  ip link add dc0 type veth peer name dc1
  ip addr add 10.77.0.1/24 dev dc0
  ip addr add 10.77.0.2/24 dev dc1
  ip link set dc0 up
  ip link set dc1 up
  ip route add default dev dc0  # Chromium gathers no ICE candidates without a default route
  exec "$@"' bash "$@"
