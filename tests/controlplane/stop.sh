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

# alive PID: running and not a zombie (a dead child that start.sh has not reaped yet still
# answers kill -0, and waiting for it would only cost the whole grace period).
alive() {
  local stat
  kill -0 "$1" 2>/dev/null || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# ours PID: the process still is one we started, not an unrelated process that reused the pid.
# Every process start.sh launches has STATE_DIR on its command line.
ours() {
  local cmdline
  [[ -r /proc/$1/cmdline ]] || return 0 # no procfs: trust the pid file
  cmdline=$(tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"$state"* ]]
}

# stop NAME...: TERM the listed kinds of process, wait up to 5 s, then KILL whatever is left.
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
  for _ in $(seq 50); do
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
    # start.sh runs each server under setsid, so pid is also its process group: signal the group.
    kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
  done
}

# The apiserver first: while it shuts down it still talks to etcd, and with etcd gone first it
# hangs for the whole grace period instead of exiting in about a second.
stop watchdog kube-apiserver
stop etcd
: >"$pids"
