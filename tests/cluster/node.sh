#!/usr/bin/env bash
# Node I of a NODES=3 cluster (tests/cluster/start.sh) going away and coming back, as a machine
# would. Node 1 hosts the control plane and cannot go.
#
#   down  the machine powers off: its kubelet, every process of its pods (the kubelet's cgroup
#         root), its containerd shims and its containerd are killed, nothing is told. The Node
#         object stays (NotReady once the controller-manager notices); delete it to model a
#         removal. The command lines are kept under STATE_DIR/node-I/down for `up`.
#   up    the machine boots again: containerd, then the kubelet, with the command lines they had;
#         waits until both answer. The kubelet registers the Node again if it was deleted; pods
#         the machine ran before are gone (their sandboxes are cleaned up as after a reboot).
#   cut   the node's link to the rest of the cluster goes down: everything on it keeps running,
#         cut off from the apiserver, the other nodes and the registries' forwarder.
#   mend  the link comes back, with the route to the node's pods.
#
# Usage: tests/cluster/node.sh STATE_DIR down|up|cut|mend I
# Env: KRUISE_RS_RESTART_TIMEOUT  seconds `up` waits for each process to answer (default 90)
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: node.sh STATE_DIR down|up|cut|mend I" >&2; exit 1; }
state=$(cd "$1" && pwd)
action=$2
i=$3
repo=$(cd "$(dirname "$0")/../.." && pwd)
script=node.sh
owner_pid=""
# shellcheck source-path=SCRIPTDIR source=../node/lib.sh
source "$repo/tests/node/lib.sh"  # die, fail, alive, ours, launch, recorded_pid
# shellcheck source-path=SCRIPTDIR source=process.sh
source "$repo/tests/cluster/process.sh"  # cluster_env, server, save_command, start_saved, wait_answers
timeout=${KRUISE_RS_RESTART_TIMEOUT:-90}

nodes=$(cluster_env NODES)
[[ $i =~ ^[0-9]+$ ]] && (( i >= 2 && i <= nodes )) ||
  die "node $i: only nodes 2..$nodes can go (node 1 hosts the control plane)"
dir=$state/node-$i
down=$dir/down
in_cluster_net() { nsenter --net="$(cluster_env NETNS)" "$@"; }

# node_processes: every process in node I's cgroups (its pods) and its containerd's shims (their
# command line names its socket, under node-I/).
node_processes() {
  local f pid
  for f in /sys/fs/cgroup/pids/kruise-rs-node-$i /sys/fs/cgroup/memory/kruise-rs-node-$i \
    /sys/fs/cgroup/kruise-rs-node-$i; do
    [[ -d $f ]] && find "$f" -name cgroup.procs -exec cat {} + 2>/dev/null
  done
  for pid in $(pgrep -f containerd-shim 2>/dev/null); do
    ours "$pid" "$dir/" && echo "$pid"
  done
  return 0
}

case $action in
  down)
    [[ ! -d $down ]] || die "node $i is already down ($down exists)"
    mkdir -p "$down"
    for name in "kubelet-$i" "containerd-$i"; do
      server "$name"
      pid=$(recorded_pid "$record") || die "no running $name recorded in $pids"
      save_command "$pid" "$down/$record"
      # Power off: no TERM, no grace.
      stop_process "$pid" KILL 5
      if [[ $name == kubelet-* ]]; then
        for _ in $(seq 100); do
          victims=$(node_processes | sort -u)
          [[ -z $victims ]] && break
          # shellcheck disable=SC2086  # one pid per word
          kill -KILL $victims 2>/dev/null || true
          sleep 0.1
        done
        [[ -z $(node_processes) ]] || die "node $i's pods still run after 10 s of KILL"
      fi
    done
    echo "$script: node $i is down" >&2 ;;
  up)
    [[ -d $down ]] || die "node $i is not down (no $down)"
    t0=$(date +%s.%N)
    for name in "containerd-$i" "kubelet-$i"; do
      server "$name"
      start_saved "$down/$record"
      wait_answers "$name" "$new_pid" "$timeout"
    done
    rm -rf "$down"
    echo "$script: node $i is up (containerd and kubelet answering after $(elapsed_since "$t0") s)" >&2 ;;
  cut)
    in_cluster_net ip link set "node$i" down
    echo "$script: node $i is cut off" >&2 ;;
  mend)
    in_cluster_net ip link set "node$i" up
    # Setting the link down dropped the route to the node's pods through it.
    in_cluster_net ip route replace "10.$((87 + i)).0.0/16" via "10.77.$i.2"
    echo "$script: node $i is connected again" >&2 ;;
  *) die "unknown action $action (down, up, cut or mend)" ;;
esac
