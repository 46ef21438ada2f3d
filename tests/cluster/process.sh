# shellcheck shell=bash disable=SC2154  # state and script are set by the sourcing script
# One server process of a cluster started by tests/cluster/start.sh, stopped and started again by
# hand (sourced by restart.sh and node.sh, not run). The caller sets `state` (the cluster's
# STATE_DIR, absolute) and `script` (its name, for messages), and sources tests/node/lib.sh.

cluster_env() { sed -n "s/^$1=//p" "$state/env"; }

# server NAME: for kube-apiserver, kubelet[-i] or containerd[-i] (kubelet-2: node 2's kubelet;
# no suffix: node 1's), sets: pids (the pid file that records it), record (its name there), log,
# netns and mntns (the namespaces it runs in) and ctrd_dir (its node's containerd directory).
server() {
  local node=1
  [[ $1 =~ ^(kubelet|containerd)-([0-9])$ ]] && node=${BASH_REMATCH[2]}
  ctrd_dir=$state/node/ctrd
  (( node == 1 )) || ctrd_dir=$state/node-$node/ctrd
  record=$1
  case $1 in
    kube-apiserver) pids=$state/controlplane/pids; log=$state/controlplane/apiserver.log ;;
    kubelet|kubelet-[0-9]) pids=$state/pids; log=$(cluster_env "NODE_${node}_KUBELET_LOG") ;;
    containerd|containerd-[0-9]) pids=$ctrd_dir/pids; log=$ctrd_dir/containerd.log; record=containerd ;;
    *) die "no server $1 (kube-apiserver, kubelet[-i] or containerd[-i])" ;;
  esac
  netns=$(cluster_env "NODE_${node}_NETNS")
  mntns=$(cluster_env "NODE_${node}_MNTNS")
  [[ -n $netns && -e $mntns && -n $log ]] || die "$state holds no running cluster with node $node (env, ns/mnt)"
}

# save_command PID FILE: the process's command line (NUL-separated) and working directory, for
# start_saved once it is gone.
save_command() {
  cp "/proc/$1/cmdline" "$2.cmdline"
  readlink "/proc/$1/cwd" >"$2.cwd"
  [[ -s $2.cmdline ]] || die "process $1 has an empty command line"
}

# stop_process PID SIGNAL [GRACE_SECONDS]: SIGNAL the process alone (not its group: containerd's
# shims must survive a containerd restart), KILL after GRACE_SECONDS (default 20), wait until it is
# gone and drop it from the pid file.
stop_process() {
  local pid=$1 sig=$2 grace=${3:-20}
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq $((grace * 10))); do
    alive "$pid" || break
    sleep 0.1
  done
  if alive "$pid"; then
    echo "$script: $record ($pid) still runs ${grace} s after $sig; KILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    while alive "$pid"; do sleep 0.1; done
  fi
  forget_pid "$pid"
}

# start_saved FILE: server's command line saved by save_command, again, in its working directory
# and namespaces, its output appended to its log, recorded in its pid file; sets new_pid.
start_saved() {
  local argv
  mapfile -d '' argv <"$1.cmdline"
  echo "---- $script: starting $record again $(date -u +%FT%TZ) ----" >>"$log"
  # launch (lib.sh) records the new pid; nsenter execs in place, so $! is the server itself.
  local back=$PWD
  cd "$(cat "$1.cwd")"
  launch "$record" "$log" nsenter --net="$netns" --mount="$mntns" "${argv[@]}"
  cd "$back"
  new_pid=$launched_pid
}

# answers NAME: the server named as for `server` (called after it) answers its health check.
answers() {
  case $1 in
    kube-apiserver)
      local pki=$state/controlplane/pki port
      port=$(sed -n 's/^ *server: https:\/\/127\.0\.0\.1:\([0-9]*\)$/\1/p' "$state/controlplane/kubeconfig")
      nsenter --net="$netns" curl -fsS --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" \
        --key "$pki/admin.key" "https://127.0.0.1:$port/readyz" ;;
    kubelet*) nsenter --net="$netns" curl -fsS --max-time 5 http://127.0.0.1:10248/healthz ;;
    containerd*) timeout 5 ctr --address "$ctrd_dir/containerd.sock" version ;;
  esac
}

# wait_answers NAME PID TIMEOUT_SECONDS: until the server answers; fails when it exits or the
# time is up.
wait_answers() {
  local name=$1 pid=$2 until=$(( $(date +%s) + $3 ))
  until answers "$name" >/dev/null 2>&1; do
    alive "$pid" || fail "$name ($pid) exited after it was started again" "$log"
    (( $(date +%s) < until )) || fail "$name did not answer within $3 s of its start" "$log"
    sleep 0.2
  done
}
