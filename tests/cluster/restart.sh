#!/usr/bin/env bash
# Restart one process of a cluster started by tests/cluster/start.sh, as an operator's restart
# or a crash-and-supervisor would: TERM (KILL after 20 s), then the same command line, working
# directory and namespaces (the cluster's network and mount namespaces) again, its output
# appended to the log it had, the pid file updated so that stop.sh stops the new process. Waits
# until the new process answers (the apiserver's /readyz, the kubelet's /healthz, containerd's
# gRPC) and prints how long it was down, in seconds, on stdout. Pods keep running through a
# kubelet or containerd restart (their shims are not the restarted process's children).
#
# Usage: tests/cluster/restart.sh STATE_DIR kube-apiserver|kubelet[-i]|containerd[-i]
#   (kubelet-2: node 2's kubelet, on a NODES=3 cluster)
# Env: KRUISE_RS_RESTART_TIMEOUT  seconds to wait for the new process to answer (default 90)
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: restart.sh STATE_DIR kube-apiserver|kubelet[-i]|containerd[-i]" >&2; exit 1; }
state=$(cd "$1" && pwd)
name=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
script=restart.sh
owner_pid=""
# shellcheck source-path=SCRIPTDIR source=../node/lib.sh
source "$repo/tests/node/lib.sh"  # die, fail, alive, launch, elapsed_since
# shellcheck source-path=SCRIPTDIR source=process.sh
source "$repo/tests/cluster/process.sh"  # server, save_command, stop_process, start_saved, wait_answers
timeout=${KRUISE_RS_RESTART_TIMEOUT:-90}

server "$name"
pid=$(recorded_pid "$record") || die "no running $name recorded in $pids"
saved=$(mktemp -d)
trap 'rm -rf "$saved"' EXIT
save_command "$pid" "$saved/$record"

t0=$(date +%s.%N)
stop_process "$pid" TERM 20
# A process that exits within a second of its start is started again, twice at most, as its
# supervisor would (systemd's Restart=always): a kubelet 1.36 on containerd 2.2.9 was once seen
# to exit at once, its first CRI call `Canceled`.
for try in 1 2 3; do
  start_saved "$saved/$record"
  sleep 1
  if recorded_pid "$record" >/dev/null; then break; fi
  (( try < 3 )) || fail "$name exited at once after its restart, three times" "$log"
  echo "$script: $name exited at once after its restart; starting it again" >&2
done
wait_answers "$name" "$new_pid" "$timeout"
echo "$script: $name restarted (pid $pid -> $new_pid), answering after $(elapsed_since "$t0") s" >&2
elapsed_since "$t0"
echo
