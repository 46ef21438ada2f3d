# shellcheck shell=bash disable=SC2154  # globals are set by the sourcing script
# Helpers shared by tests/node/start.sh, tests/node/containerd.sh and tests/cluster/ (sourced,
# not run): tests/lib/processes.sh (die, fail, launch, wait_ready, ...) and recorded_pid.

# shellcheck source-path=SCRIPTDIR source=../lib/processes.sh
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
