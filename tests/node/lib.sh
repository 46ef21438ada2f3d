# shellcheck shell=bash disable=SC2154  # globals are set by the sourcing script
# Helpers shared by tests/node/start.sh and tests/node/containerd.sh (sourced, not run).
# The caller sets: script (its name, for messages), pids (its pid file), owner_pid (may be
# empty) and deadline (epoch seconds); launch() sets launched_pid.

die() { echo "$script: $*" >&2; exit 1; }

owner_alive() { [[ -z $owner_pid ]] || kill -0 "$owner_pid" 2>/dev/null; }

# free_ports N: N distinct free loopback ports. All sockets stay open until every port is chosen,
# so the N ports differ; another process may still grab one before we bind it (callers retry).
free_ports() {
  python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
' "$1"
}

# launch NAME LOG CMD...: run CMD in its own session (setsid) so terminal signals aimed at the
# caller's process group do not reach it and stop.sh can signal its whole process group; output
# is appended to LOG (a restarted server keeps its earlier log). stdio must not be the caller's
# pipes, or a caller reading our output to EOF would wait forever. The script never enables job
# control, so the background child is not a group leader and setsid execs in place: $! is the
# server's own pid.
launch() {
  local name=$1 log=$2
  shift 2
  setsid "$@" </dev/null >>"$log" 2>&1 &
  launched_pid=$!
  echo "$name $launched_pid" >>"$pids"
}

forget_pid() {  # drop a process from the pid file (dead, or about to be replaced)
  local tmp
  tmp=$(grep -v " $1\$" "$pids" || true)
  printf '%s\n' "$tmp" | sed '/^$/d' >"$pids"
}

fail() {  # fail WHAT [LOG]: report with the log tail and exit (the caller's EXIT trap cleans up)
  echo "$script: $1" >&2
  if [[ -n ${2:-} && -f $2 ]]; then
    echo "---- last lines of $2 ----" >&2
    tail -n 40 "$2" >&2
    echo "----" >&2
  fi
  exit 1
}

# wait_ready NAME PID LOG CHECK...: poll CHECK until it succeeds. Returns 0 when ready, 2 when the
# process died because its port was taken (the caller retries with new ports); otherwise fails.
wait_ready() {
  local name=$1 pid=$2 log=$3
  shift 3
  while :; do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      if grep -q 'address already in use' "$log" 2>/dev/null; then return 2; fi
      fail "$name exited before becoming ready" "$log"
    fi
    owner_alive || fail "owner process $owner_pid is gone; giving up"
    if (( $(date +%s) >= deadline )); then
      fail "$name was not ready within ${timeout}s" "$log"
    fi
    sleep 0.1
  done
}

# alive, ours, signal, stop_recorded
# shellcheck source=../lib/processes.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/processes.sh"

# recorded_pid NAME: the last pid recorded for NAME in the pid file, if that process still runs
# and has DIR (the pid file's directory) on its command line (not a reused pid).
recorded_pid() {
  local pid cmdline dir
  dir=$(dirname "$pids")
  pid=$(awk -v n="$1" '$1 == n { p = $2 } END { print p }' "$pids" 2>/dev/null)
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"$dir"* ]] || return 1
  echo "$pid"
}

elapsed_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
