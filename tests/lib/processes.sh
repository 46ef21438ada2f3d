# shellcheck shell=bash
# The processes the test scripts start and stop, recorded as "NAME PID" lines in a pid file
# (sourced, not run). Shared by tests/controlplane/stop.sh, tests/node/stop.sh and
# tests/node/lib.sh (and through it tests/cluster/).

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
