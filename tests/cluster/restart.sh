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
pids=""
owner_pid=""
# shellcheck source-path=SCRIPTDIR source=../node/lib.sh
source "$repo/tests/node/lib.sh"  # die, fail, alive, elapsed_since

env_var() { sed -n "s/^$1=//p" "$state/env"; }
# kubelet-2, containerd-3: node 2's kubelet, node 3's containerd (NODES=3); no suffix: node 1's.
node=1
[[ $name =~ ^(kubelet|containerd)-([0-9])$ ]] && node=${BASH_REMATCH[2]}
ctrd_dir=$state/node/ctrd
(( node == 1 )) || ctrd_dir=$state/node-$node/ctrd
case $name in
  kube-apiserver) pids=$state/controlplane/pids; log=$state/controlplane/apiserver.log ;;
  kubelet|kubelet-[0-9]) pids=$state/pids; log=$(env_var "NODE_${node}_KUBELET_LOG") ;;
  containerd|containerd-[0-9]) pids=$ctrd_dir/pids; log=$ctrd_dir/containerd.log ;;
  *) die "cannot restart $name (kube-apiserver, kubelet[-i] or containerd[-i])" ;;
esac
netns=$(env_var "NODE_${node}_NETNS")
mntns=$(env_var "NODE_${node}_MNTNS")
[[ -n $netns && -e $mntns && -n $log ]] || die "$state holds no running cluster with node $node (env, ns/mnt)"
timeout=${KRUISE_RS_RESTART_TIMEOUT:-90}

record=$name
[[ $name == containerd-* ]] && record=containerd
pid=$(recorded_pid "$record") || die "no running $name recorded in $pids"
mapfile -d '' argv <"/proc/$pid/cmdline"
cwd=$(readlink "/proc/$pid/cwd")
[[ ${#argv[@]} -gt 0 ]] || die "$name ($pid) has an empty command line"

t0=$(date +%s.%N)
# The process alone, not its group: containerd's shims must survive a containerd restart.
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq 200); do
  alive "$pid" || break
  sleep 0.1
done
if alive "$pid"; then
  echo "$script: $name ($pid) still runs 20 s after TERM; KILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  while alive "$pid"; do sleep 0.1; done
fi
forget_pid "$pid"

echo "---- $script: restarting $name $(date -u +%FT%TZ) ----" >>"$log"
# launch (lib.sh) records the new pid; nsenter execs in place, so $! is the server itself.
cd "$cwd"
launch "$record" "$log" nsenter --net="$netns" --mount="$mntns" "${argv[@]}"
new_pid=$(recorded_pid "$record") || fail "$name exited at once after its restart" "$log"

in_net() { nsenter --net="$netns" "$@"; }
case $name in
  kube-apiserver)
    pki=$state/controlplane/pki
    port=$(sed -n 's/^ *server: https:\/\/127\.0\.0\.1:\([0-9]*\)$/\1/p' "$state/controlplane/kubeconfig")
    ready() {
      in_net curl -fsS --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" \
        --key "$pki/admin.key" "https://127.0.0.1:$port/readyz"
    } ;;
  kubelet*) ready() { nsenter --net="$netns" curl -fsS --max-time 5 http://127.0.0.1:10248/healthz; } ;;
  containerd*)
    ready() { timeout 5 ctr --address "$ctrd_dir/containerd.sock" version; } ;;
esac
deadline=$(( $(date +%s) + timeout ))
until ready >/dev/null 2>&1; do
  alive "$new_pid" || fail "$name ($new_pid) exited after its restart" "$log"
  (( $(date +%s) < deadline )) || fail "$name did not answer within ${timeout}s of its restart" "$log"
  sleep 0.2
done
echo "$script: $name restarted (pid $pid -> $new_pid), answering after $(elapsed_since "$t0") s" >&2
elapsed_since "$t0"
echo
