#!/usr/bin/env bash
# Stop a cluster started by tests/cluster/start.sh and undo what it changed on the machine: the
# kubelet first (so it restarts nothing), then every pod process and containerd shim, the
# scheduler and controller-manager, containerd and the registry, the control plane; then the
# kubelet's kubepods cgroups, the sysctls it set, the mount namespace and the network namespace.
# Idempotent: a missing STATE_DIR or a half-started cluster is fine.
#
# Usage: tests/cluster/stop.sh STATE_DIR
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: stop.sh STATE_DIR" >&2; exit 1; }
state=$(cd "$1" 2>/dev/null && pwd) || exit 0
repo=$(cd "$(dirname "$0")/../.." && pwd)
pids=$state/pids

script=stop.sh
# shellcheck source-path=SCRIPTDIR source=../node/lib.sh
source "$repo/tests/node/lib.sh"  # alive, ours, stop_recorded (tests/lib/processes.sh)
# stop NAME...: TERM the listed kinds of process (their process groups), KILL after 10 s.
stop() {
  [[ -f $pids ]] || return 0
  stop_recorded "$pids" "$state" 10 "$@"
}

# pod_processes: every process in a kubepods cgroup, and the containerd shims of our containerd
# (their command line names its socket, under STATE_DIR).
pod_processes() {
  local f pid
  for f in /sys/fs/cgroup/pids/kubepods /sys/fs/cgroup/memory/kubepods; do
    [[ -d $f ]] && find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
  for pid in $(pgrep -f containerd-shim 2>/dev/null); do
    ours "$pid" "$state" && echo "$pid"
  done
  return 0
}

stop watchdog
stop kubelet
for _ in $(seq 50); do
  victims=$(pod_processes | sort -u)
  [[ -z $victims ]] && break
  # shellcheck disable=SC2086  # one pid per word
  kill -KILL $victims 2>/dev/null || true
  sleep 0.1
done
stop kube-scheduler kube-controller-manager
[[ -d $state/node ]] && "$repo/tests/node/stop.sh" "$state/node"
[[ -d $state/controlplane ]] && "$repo/tests/controlplane/stop.sh" "$state/controlplane"

# The kubelet's cgroups, deepest first (a cgroup is removable once it has no processes and no
# children).
for root in /sys/fs/cgroup/*/kubepods; do
  [[ -d $root ]] && { find "$root" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
  [[ -d $root ]] && echo "stop.sh: could not remove $root (processes left in it?)" >&2
done

if [[ -f $state/sysctl.saved ]]; then
  while IFS='=' read -r key value; do sysctl -qw "$key=$value" || true; done <"$state/sysctl.saved"
  rm -f "$state/sysctl.saved"
fi

# The mount namespace lives as long as a process or the bind mount on ns/mnt holds it.
if mountpoint -q "$state/ns" 2>/dev/null; then
  umount "$state/ns/mnt" 2>/dev/null || true
  umount "$state/ns" 2>/dev/null || true
fi
if [[ -f $state/netns ]]; then
  ip netns del "$(cat "$state/netns")" 2>/dev/null || true
  rm -f "$state/netns"
fi
[[ -f $pids ]] && : >"$pids"
exit 0
