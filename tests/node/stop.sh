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

# alive PID: running and not a zombie (a dead child not reaped yet still answers kill -0).
alive() {
  local stat
  kill -0 "$1" 2>/dev/null || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# ours PID: still a process we started, not an unrelated one that reused the pid. Every process
# the start scripts launch has STATE_DIR (or a path under it) on its command line.
ours() {
  local cmdline
  [[ -r /proc/$1/cmdline ]] || return 0 # no procfs: trust the pid file
  cmdline=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"$state"* ]]
}

# stop NAME...: TERM the listed kinds of process, wait up to 10 s, then KILL whatever is left.
stop() {
  local targets=() remaining=() name pid
  while read -r name pid; do
    [[ $pid =~ ^[0-9]+$ && " $* " == *" $name "* ]] || continue
    # The watchdog runs this script itself; it must not kill itself before it is done.
    if [[ $name == watchdog && $pid == "$PPID" ]]; then continue; fi
    if alive "$pid" && ours "$pid"; then targets+=("$pid"); fi
  done <"$pids"
  [[ ${#targets[@]} -gt 0 ]] || return 0
  signal TERM "${targets[@]}"
  for _ in $(seq 100); do
    remaining=()
    for pid in "${targets[@]}"; do
      if alive "$pid"; then remaining+=("$pid"); fi
    done
    [[ ${#remaining[@]} -eq 0 ]] && return 0
    sleep 0.1
  done
  echo "stop.sh: killing ${remaining[*]} ($*) after the grace period" >&2
  signal KILL "${remaining[@]}"
}

signal() {  # signal SIG PID...
  local sig=$1 pid
  shift
  for pid in "$@"; do
    # Each server runs under setsid, so its pid is also its process group: signal the group.
    kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
  done
}

# containerd before the registries: it may be in the middle of a pull from them. start.sh's
# containerd is recorded in STATE_DIR/ctrd/pids by containerd.sh: stop such sub-directories too.
stop watchdog
for sub in "$state"/*/pids; do
  [[ -f $sub ]] && "$0" "$(dirname "$sub")"
done
stop containerd
stop registry auth-registry
: >"$pids"
