#!/usr/bin/env bash
# Stop a control plane started by tests/controlplane/start.sh: TERM, then KILL after a grace
# period, for every process listed in STATE_DIR/pids (etcd, kube-apiserver, watchdog).
# Idempotent: a missing STATE_DIR, missing pid file or already-dead processes are fine.
#
# Usage: tests/controlplane/stop.sh STATE_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: stop.sh STATE_DIR" >&2; exit 1; }
state=$(cd "$1" 2>/dev/null && pwd) || exit 0
pids=$state/pids
[[ -f $pids ]] || exit 0

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib/processes.sh
source "$here/../lib/processes.sh"
stop() { stop_recorded "$pids" "$state" 5 "$@"; }

# The apiserver first: while it shuts down it still talks to etcd, and with etcd gone first it
# hangs for the whole grace period instead of exiting in about a second.
stop watchdog kube-apiserver
stop etcd
: >"$pids"
