#!/usr/bin/env bash
# Stop a cluster started by tests/cluster/start.sh and undo what it changed on the machine: the
# kubelets first (so they restart nothing), then every pod process and containerd shim, the
# scheduler and controller-manager, the registry forwarders, the containerds and the registries,
# the control plane; then the kubelets' cgroups, the sysctls they set, the mount namespaces and
# the network namespaces.
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

# The kubelets' cgroup roots: node 1's is /, nodes 2 and 3 have /kruise-rs-node-i.
cgroup_roots() {
  local d
  for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kruise-rs-node-*; do
    [[ -d $d ]] && echo "$d"
  done
  return 0
}

# pod_processes: every process in a kubelet's cgroups, and the containerd shims of our
# containerds (their command line names its socket, under STATE_DIR).
pod_processes() {
  local f pid
  for f in $(cgroup_roots); do
    [[ $f == /sys/fs/cgroup/pids/* || $f == /sys/fs/cgroup/memory/* ]] &&
      find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
  for pid in $(pgrep -f containerd-shim 2>/dev/null); do
    ours "$pid" "$state" && echo "$pid"
  done
  return 0
}

stop watchdog
stop kubelet kubelet-2 kubelet-3
for _ in $(seq 50); do
  victims=$(pod_processes | sort -u)
  [[ -z $victims ]] && break
  # shellcheck disable=SC2086  # one pid per word
  kill -KILL $victims 2>/dev/null || true
  sleep 0.1
done
stop kube-scheduler kube-controller-manager forwarder-2 forwarder-3
for node in "$state"/node-[0-9]*; do
  [[ -d $node/ctrd ]] && "$repo/tests/node/stop.sh" "$node/ctrd"
done
[[ -d $state/node ]] && "$repo/tests/node/stop.sh" "$state/node"
[[ -d $state/controlplane ]] && "$repo/tests/controlplane/stop.sh" "$state/controlplane"

# The kubelets' cgroups, deepest first (a cgroup is removable once it has no processes and no
# children).
for root in $(cgroup_roots); do
  [[ -d $root ]] && { find "$root" -depth -type d -exec rmdir {} + 2>/dev/null || true; }
  [[ -d $root ]] && echo "stop.sh: could not remove $root (processes left in it?)" >&2
done

if [[ -f $state/sysctl.saved ]]; then
  while IFS='=' read -r key value; do sysctl -qw "$key=$value" || true; done <"$state/sysctl.saved"
  rm -f "$state/sysctl.saved"
fi

# A mount namespace lives as long as a process or the bind mount on ns/mnt(-i) holds it.
if mountpoint -q "$state/ns" 2>/dev/null; then
  for mnt in "$state"/ns/mnt*; do umount "$mnt" 2>/dev/null || true; done
  umount "$state/ns" 2>/dev/null || true
fi
if [[ -f $state/netns ]]; then
  while read -r name; do
    [[ -n $name ]] && { ip netns del "$name" 2>/dev/null || true; }
  done <"$state/netns"
  rm -f "$state/netns"
fi
[[ -f $pids ]] && : >"$pids"
exit 0
