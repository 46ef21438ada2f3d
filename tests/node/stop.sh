#!/usr/bin/env bash
# Stop what tests/node/start.sh (or tests/node/containerd.sh) started in STATE_DIR: TERM, then
# KILL after a grace period, for every process listed in STATE_DIR/pids (watchdog, containerd,
# registries). Idempotent: a missing STATE_DIR, missing pid file or dead processes are fine.
# Containers a test ran through CRI (shims, pods) are not tracked; pulls leave none.
#
# Usage: tests/node/stop.sh STATE_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: stop.sh STATE_DIR" >&2; exit 1; }
state=$(cd "$1" 2>/dev/null && pwd) || exit 0
pids=$state/pids
[[ -f $pids ]] || exit 0

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../lib/processes.sh
source "$here/../lib/processes.sh"
stop() { stop_recorded "$pids" "$state" 10 "$@"; }

# containerd before the registries: it may be in the middle of a pull from them. start.sh's
# containerd is recorded in STATE_DIR/ctrd/pids by containerd.sh: stop such sub-directories too.
stop watchdog
for sub in "$state"/*/pids; do
  [[ -f $sub ]] && "$0" "$(dirname "$sub")"
done
stop containerd
stop registry auth-registry
: >"$pids"
