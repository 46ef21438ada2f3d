# shellcheck shell=bash disable=SC2154  # globals are set by the sourcing script
# The processes the test scripts start and stop, recorded as "NAME PID" lines in a pid file
# (sourced, not run). Shared by tests/controlplane/start.sh and stop.sh, tests/node/stop.sh and
# tests/node/lib.sh (and through it tests/node/*.sh and tests/cluster/).
# For launch and wait_ready the caller sets: script (its name, for messages), pids (its pid
# file), owner_pid (may be empty), deadline (epoch seconds) and timeout (for the message);
# launch sets launched_pid.

# alive PID: running and not a zombie (a dead child not reaped yet still answers kill -0, and
# waiting for it would only cost the whole grace period).
alive() {
  local stat
  kill -0 "$1" 2>/dev/null || return 1
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# ours PID DIR: still a process we started, not an unrelated one that reused the pid. Every
# process the start scripts launch has its state directory (or a path under it) on its command
# line.
ours() {
  local cmdline
  [[ -r /proc/$1/cmdline ]] || return 0 # no procfs: trust the pid file
  # The braces: the redirection's own error (the process exited meanwhile) is silenced too.
  cmdline=$({ tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null) || return 1
  [[ $cmdline == *"$2"* ]]
}

# signal SIG PID...: each server runs under setsid, so its pid is also its process group:
# signal the group, or the process alone when it has none.
signal() {
  local sig=$1 pid
  shift
  for pid in "$@"; do
    kill "-$sig" -- "-$pid" 2>/dev/null || kill "-$sig" "$pid" 2>/dev/null || true
  done
}

# stop_recorded PIDS_FILE STATE_DIR GRACE_SECONDS NAME...: TERM the recorded processes of the
# listed kinds that are still ours, wait up to GRACE_SECONDS, then KILL whatever is left.
stop_recorded() {
  local pids=$1 state=$2 grace=$3 targets=() remaining=() name pid
  shift 3
  while read -r name pid; do
    [[ $pid =~ ^[0-9]+$ && " $* " == *" $name "* ]] || continue
    # The watchdog runs the stop script itself; it must not kill itself before it is done.
    if [[ $name == watchdog && $pid == "$PPID" ]]; then continue; fi
    if alive "$pid" && ours "$pid" "$state"; then targets+=("$pid"); fi
  done <"$pids"
  [[ ${#targets[@]} -gt 0 ]] || return 0
  signal TERM "${targets[@]}"
  for _ in $(seq $((grace * 10))); do
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
