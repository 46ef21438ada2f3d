#!/usr/bin/env bash
# Start a real one-node Kubernetes cluster on this machine, for the end-to-end suite (tests/e2e)
# and `make run`: etcd + kube-apiserver (tests/controlplane/start.sh), a registry + containerd +
# runc (tests/node/start.sh), and kubelet, kube-scheduler and kube-controller-manager built from
# the same k8s.io/kubernetes release (tests/controlplane/build.sh node). Needs root.
#
# Everything runs inside a network namespace of its own (`ip netns`), so every address stays
# private to it: loopback, the node's address NODE_IP on a veth pair (the kubelet refuses a
# loopback node IP), 10.0.0.1 (the kubernetes Service; the apiserver listens on 0.0.0.0:443
# there, since no kube-proxy translates Service addresses) and the pods' bridge 10.88.0.0/16.
# The apiserver calls webhooks at their endpoints' pod IPs (--enable-aggregator-routing).
# The node's processes also share a mount namespace of their own in which STATE_DIR/run is /run
# and STATE_DIR/log is /var/log: containerd's socket is at the usual
# /run/containerd/containerd.sock for the kubelet and for the daemon's hostPath mount of it (the
# chart's default daemon.criSocket), and the kubelet's mounts and logs never reach the host's. What stays global and
# stop.sh restores: the sysctls the kubelet sets, its kubepods cgroups.
#
# NODES=3 adds nodes 2 and 3, each a network namespace of its own (NODE_i_NETNS: node IP
# 10.77.i.2, pods 10.(87+i).0.0/16, a veth to the cluster namespace, which routes between them
# and holds the control plane, the registries and the tests), a mount namespace, a containerd, a
# kubelet with the cgroup root /kruise-rs-node-i, and a forwarder (forward.py) that makes the
# registries' 127.0.0.1 ports answer inside the node's namespace too, so image references are the
# same on every node. Their kubelets reach the apiserver at 10.0.0.1:443 (the kubernetes
# Service's address, routed to the cluster namespace).
#
# Usage: tests/cluster/start.sh [--owner-pid PID] STATE_DIR
#   Prints KEY=VALUE lines on stdout (also written to STATE_DIR/env):
#     KUBECONFIG            admin kubeconfig (https://127.0.0.1:443: valid inside NETNS only)
#     NETNS                 the network namespace (a path for `nsenter --net=`); run clients
#                           with tests/cluster/exec.sh STATE_DIR CMD...
#     NODE_NAME, NODE_IP
#     REGISTRY              127.0.0.1:PORT inside NETNS: the open registry containerd pulls from
#     REGISTRY_LOG
#     AUTH_REGISTRY, AUTH_USER, AUTH_PASSWORD
#                           the htpasswd registry (containerd pulls from it too) and its account
#     CONTAINERD_SOCKET     the socket's path as seen from outside the mount namespace
#     CERTS_D               containerd's registry hosts (a hosts.toml per host:port, read at
#                           every pull: add one for another loopback registry)
#     IMAGES                the test images' OCI layout (tests/node/images.sh)
#     KUBELET_LOG, STATE_DIR
#     NODES, NODE_NAMES     how many nodes, their names (space-separated, node 1 first)
#     NODE_i_NAME, NODE_i_IP, NODE_i_NETNS, NODE_i_MNTNS, NODE_i_CONTAINERD_SOCKET,
#     NODE_i_KUBELET_LOG    for every node i (node 1's are also the keys above without i)
#   Progress and errors go to stderr. With --owner-pid, a detached watchdog stops everything and
#   removes STATE_DIR once PID is gone.
# Stop with tests/cluster/stop.sh STATE_DIR.
# Env: NODES                   how many nodes, 1 to 3 (default 1)
#      KUBE_VERSION            Kubernetes minor (default 1.36)
#      KRUISE_RS_CLUSTER_TIMEOUT  seconds to wait for the node to be Ready (default 180)
#      KRUISE_RS_CONTAINERD_BIN   the nodes' containerd binaries (default: 2.x built by
#                                 tests/node/build-containerd.sh; /usr/bin for Debian's 1.6)
#      KRUISE_RS_KUBELET_IMAGE_MAX_AGE  node 1's kubelet's imageMaximumGCAge (e.g. 1m; default: none)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
script=start.sh
# shellcheck source-path=SCRIPTDIR source=../node/lib.sh
source "$repo/tests/node/lib.sh"

# --- internal mode: the watchdog (started below by this very script, detached) -----------------
if [[ ${1:-} == --watchdog ]]; then
  owner=${2:?owner pid}; starter=${3:?starter pid}; state=${4:?state dir}
  while kill -0 "$owner" 2>/dev/null; do sleep 1; done
  while kill -0 "$starter" 2>/dev/null; do sleep 0.2; done
  "$here/stop.sh" "$state" || true
  rm -rf "$state"
  exit 0
fi

owner_pid=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --owner-pid) owner_pid=${2:?--owner-pid needs a PID}; shift 2 ;;
    -h|--help) sed -n '2,50p' "$0" >&2; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $# -eq 1 ]] || die "usage: start.sh [--owner-pid PID] STATE_DIR"
[[ $(id -u) == 0 ]] || die "a real node needs root (network and mount namespaces, cgroups, runc)"
if [[ -n $owner_pid ]]; then
  kill -0 "$owner_pid" 2>/dev/null || die "owner pid $owner_pid is not running"
fi
for tool in ip nsenter unshare mount runc curl python3 setsid; do
  command -v "$tool" >/dev/null || die "$tool is missing (tests/setup.sh installs it)"
done
for plugin in bridge host-local loopback; do
  [[ -x /usr/lib/cni/$plugin ]] || die "/usr/lib/cni/$plugin is missing (apt-get install containernetworking-plugins)"
done
nodes=${NODES:-1}
[[ $nodes =~ ^[1-3]$ ]] || die "NODES=$nodes: 1, 2 or 3"
# One cluster per machine: the kubelets' cgroups (kubepods) and sysctls are global.
for dir in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/kruise-rs-node-*; do
  [[ -d $dir ]] && die "$dir exists: another kubelet runs (or ran) here; stop it first (tests/cluster/stop.sh)"
done
mkdir -p "$1"
state=$(cd "$1" && pwd)
timeout=${KRUISE_RS_CLUSTER_TIMEOUT:-180}
deadline=$(( $(date +%s) + timeout ))
t0=$(date +%s.%N)

# Binaries first (minutes on the first run, instant once cached).
cp_bin=$("$repo/tests/controlplane/build.sh")
# Every node's containerd (tests/node/containerd.sh): 2.x, as kubelet 1.36 wants, unless set.
KRUISE_RS_CONTAINERD_BIN=${KRUISE_RS_CONTAINERD_BIN:-$("$repo/tests/node/build-containerd.sh")}
export KRUISE_RS_CONTAINERD_BIN
node_bin=$("$repo/tests/controlplane/build.sh" node)

pids=$state/pids
: >"$pids"
ok=false
cleanup_on_failure() {
  if [[ $ok != true ]]; then
    "$here/stop.sh" "$state" >&2 || true
    if [[ -n $owner_pid ]] && ! owner_alive; then rm -rf "$state"; fi
  fi
}
trap cleanup_on_failure EXIT
trap 'exit 130' INT TERM HUP

if [[ -n $owner_pid ]]; then
  setsid "$here/start.sh" --watchdog "$owner_pid" "$$" "$state" </dev/null >/dev/null 2>&1 &
  echo "watchdog $!" >>"$pids"
fi

# --- namespaces --------------------------------------------------------------------------------
# The name is derived from STATE_DIR, so stop.sh finds it again.
netns_name=kruise-rs-$(echo -n "$state" | sha256sum | cut -c1-10)
netns=/run/netns/$netns_name
node_ip=10.77.0.2
node_name=kruise-rs-node
echo "$netns_name" >"$state/netns"
ip netns add "$netns_name" || die "ip netns add $netns_name failed"
in_net() { nsenter --net="$netns" "$@"; }
in_net ip link set lo up
in_net ip addr add 10.0.0.1/32 dev lo
# The node's interface: a veth pair with both ends in NETNS (these kernels have no dummy driver).
in_net ip link add node0 type veth peer name node0-peer
in_net ip addr add "$node_ip/24" dev node0
in_net ip link set node0-peer up
in_net ip link set node0 up
# The kubelet wants a default route; this one leads nowhere outside NETNS.
in_net ip route add default dev node0
# NETNS routes between the nodes' namespaces (NODES > 1).
in_net sysctl -qw net.ipv4.ip_forward=1

# A mount namespace kept by a bind mount on a file, which must sit on a private mount.
mkdir -p "$state/ns" "$state/run" "$state/log" "$state/node/ctrd/cni" "$state/kubelet"
mount --bind "$state/ns" "$state/ns"
mount --make-private "$state/ns"
touch "$state/ns/mnt"
unshare --mount="$state/ns/mnt" --propagation private true || die "unshare --mount failed"
mntns=$state/ns/mnt
in_ns() { nsenter --net="$netns" --mount="$mntns" "$@"; }
in_ns sh -ec "
  mount --bind '$state/run' /run
  mkdir -p /run/containerd
  mount --bind '$state/node/ctrd' /run/containerd
  mount --bind '$state/log' /var/log
" || die "setting up the node's mounts failed"

# --- control plane -----------------------------------------------------------------------------
# ServiceAccount admission back on (the controller-manager creates the accounts and tokens); the
# kubelet reached by its InternalIP (logs, exec), never by a host name the host's DNS would get.
kubeconfig=$(in_ns env KRUISE_RS_APISERVER_ADDRESS=0.0.0.0 KRUISE_RS_APISERVER_ADVERTISE="$node_ip" \
  KRUISE_RS_APISERVER_PORT=443 KRUISE_RS_SERVICE_ACCOUNTS=1 \
  KRUISE_RS_APISERVER_ARGS="--enable-aggregator-routing=true --kubelet-preferred-address-types=InternalIP ${KRUISE_RS_APISERVER_ARGS:-}" \
  "$repo/tests/controlplane/start.sh" "$state/controlplane") || die "starting the control plane failed (see above)"
echo "controlplane $state/controlplane" >>"$pids"
pki=$state/controlplane/pki

# --- registry + containerd ---------------------------------------------------------------------
# The pods' network: a bridge in NETNS, addresses and CNI caches under STATE_DIR.
# cni_config SUBNET IPAM_DIR: one node's pod network configuration.
cni_config() {
  cat <<JSON
{
  "cniVersion": "1.0.0",
  "name": "kruise-rs-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$1" }]],
        "dataDir": "$2"
      }
    },
    { "type": "loopback" }
  ]
}
JSON
}
cni_config 10.88.0.0/16 "$state/cni-ipam" >"$state/node/ctrd/cni/10-bridge.conflist"
node_env=$(in_ns env KRUISE_RS_NODE_TIMEOUT=$(( deadline - $(date +%s) )) "$repo/tests/node/start.sh" "$state/node") \
  || die "starting the registry and containerd failed (see above)"
echo "node $state/node" >>"$pids"
node_var() { sed -n "s/^$1=//p" <<<"$node_env"; }
registry=$(node_var REGISTRY)

# --- kubelet -----------------------------------------------------------------------------------
# The sysctls the kubelet sets (protectKernelDefaults: false), to restore them on stop.
for key in vm.overcommit_memory kernel.panic kernel.panic_on_oops; do
  echo "$key=$(sysctl -n "$key")"
done >"$state/sysctl.saved"
# kubelet_config NODE_IP CGROUP_ROOT IMAGE_MAX_AGE: the configuration of one node's kubelet (an
# empty CGROUP_ROOT is the default; with IMAGE_MAX_AGE, its GC, which runs every 5 min from the
# kubelet's start, removes images unused for that long).
kubelet_config() {
  cat <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
# cgroup v1 and no systemd on these machines.
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupsPerQOS: true${2:+
cgroupRoot: $2}
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# No cluster DNS and none of the host's resolvers in pods: only loopback is ever contacted.
resolvConf: ""
clusterDomain: cluster.local
# A test machine's disk is not the node's business: no image GC by disk usage, no evictions.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99${3:+
imageMinimumGCAge: 30s
imageMaximumGCAge: $3}
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
# No imagePullCredentialsVerificationPolicy: the kubelet's default (KEP-2535), which a 1.33 or 1.34
# kubelet refuses to read with its feature gate off. tests/e2e/pull_verification.rs appends
# AlwaysVerify for a while, around kubelet restarts.
YAML
}
# launch_kubelet RECORD NODE_NAME NODE_IP NETNS MNTNS DIR KUBECONFIG: a node's kubelet, in the
# node's namespaces, its state under DIR/kubelet and its log DIR/kubelet.log.
launch_kubelet() {
  local record=$1 name=$2 ip=$3 net=$4 mnt=$5 dir=$6 config=$7
  launch "$record" "$dir/kubelet.log" nsenter --net="$net" --mount="$mnt" "$node_bin/kubelet" \
    --config="$dir/kubelet/config.yaml" --kubeconfig="$config" \
    --root-dir="$dir/kubelet" --cert-dir="$dir/kubelet/pki" \
    --hostname-override="$name" --node-ip="$ip" --v=2
}
kubelet_config "$node_ip" "" "${KRUISE_RS_KUBELET_IMAGE_MAX_AGE:-}" >"$state/kubelet/config.yaml"
kubelet_log=$state/kubelet.log
launch_kubelet kubelet "$node_name" "$node_ip" "$netns" "$mntns" "$state" "$kubeconfig"
kubelet_pid=$launched_pid
kubelets=("$kubelet_pid:kubelet:$kubelet_log")
node_names=("$node_name")

# --- nodes 2 and 3 (NODES > 1) -----------------------------------------------------------------
sandbox_image=$(node_var SANDBOX_IMAGE)
certs_d=$(node_var CERTS_D)
registry_ports="${registry##*:} $(node_var AUTH_REGISTRY | sed 's/.*://')"
# registries_answer NETNS: both registries answer /v2/ on 127.0.0.1 inside NETNS.
registries_answer() {
  local port code
  for port in $registry_ports; do
    code=$(nsenter --net="$1" curl -s --noproxy '*' -o /dev/null -w '%{http_code}' --max-time 2 \
      "http://127.0.0.1:$port/v2/") || return 1
    [[ $code == 200 || $code == 401 ]] || return 1
  done
}
# start_node I: node I in a network and a mount namespace of its own (see the top of this file).
start_node() {
  local i=$1 name=kruise-rs-node-$1 ip=10.77.$1.2 gateway=10.77.$1.1 pods=10.$((87 + $1)).0.0/16
  local dir=$state/node-$i ns_name=$netns_name-$i mnt=$state/ns/mnt-$i cgroup=/kruise-rs-node-$1
  local ns=/run/netns/$netns_name-$i ctl
  mkdir -p "$dir/run" "$dir/log" "$dir/ctrd/cni" "$dir/kubelet"
  echo "$ns_name" >>"$state/netns"
  ip netns add "$ns_name" || die "ip netns add $ns_name failed"
  ln -sfn "$ns" "$dir/netns"
  in_net ip link add "node$i" type veth peer name eth0 netns "$ns_name"
  in_net ip addr add "$gateway/24" dev "node$i"
  in_net ip link set "node$i" up
  in_net ip route add "$pods" via "$ip"
  nsenter --net="$ns" sh -ec "
    ip link set lo up
    ip addr add '$ip/24' dev eth0
    ip link set eth0 up
    ip route add default via '$gateway'
    sysctl -qw net.ipv4.ip_forward=1
  " || die "setting up node $i's network failed"
  touch "$mnt"
  unshare --mount="$mnt" --propagation private true || die "unshare --mount for node $i failed"
  nsenter --net="$ns" --mount="$mnt" sh -ec "
    mount --bind '$dir/run' /run
    mkdir -p /run/containerd
    mount --bind '$dir/ctrd' /run/containerd
    mount --bind '$dir/log' /var/log
  " || die "setting up node $i's mounts failed"

  launch "forwarder-$i" "$dir/forward.log" nsenter --net="$netns" python3 "$here/forward.py" \
    "$dir/netns" $registry_ports
  wait_ready "forwarder-$i" "$launched_pid" "$dir/forward.log" registries_answer "$ns" ||
    fail "the registries do not answer in node $i's namespace" "$dir/forward.log"

  cni_config "$pods" "$state/cni-ipam-$i" >"$dir/ctrd/cni/10-bridge.conflist"
  nsenter --net="$ns" --mount="$mnt" env KRUISE_RS_NODE_TIMEOUT=$(( deadline - $(date +%s) )) \
    "$repo/tests/node/containerd.sh" --sandbox-image "$sandbox_image" "$dir/ctrd" "$certs_d" >/dev/null ||
    die "starting node $i's containerd failed (see above)"

  # The kubelet's own cgroup root in every hierarchy (it refuses a root that does not exist); a
  # new cpuset cgroup has no CPUs or memory nodes until given its parent's.
  for ctl in /sys/fs/cgroup/*; do
    [[ -d $ctl && ! -L $ctl ]] && mkdir -p "$ctl$cgroup"
  done
  if [[ -d /sys/fs/cgroup/cpuset$cgroup ]]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset$cgroup/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset$cgroup/cpuset.mems"
  fi
  kubelet_config "$ip" "$cgroup" "" >"$dir/kubelet/config.yaml"
  sed 's#server: https://127\.0\.0\.1:443$#server: https://10.0.0.1:443#' "$kubeconfig" >"$dir/kubeconfig"
  launch_kubelet "kubelet-$i" "$name" "$ip" "$ns" "$mnt" "$dir" "$dir/kubeconfig"
  kubelets+=("$launched_pid:kubelet-$i:$dir/kubelet.log")
  node_names+=("$name")
}
for (( i = 2; i <= nodes; i++ )); do start_node "$i"; done

# --- scheduler and controller-manager ----------------------------------------------------------
launch kube-scheduler "$state/kube-scheduler.log" nsenter --net="$netns" "$node_bin/kube-scheduler" \
  --kubeconfig="$kubeconfig" --leader-elect=false --secure-port=0 --v=1
scheduler_pid=$launched_pid
# Service-account tokens, the kube-root-ca.crt ConfigMaps, Deployments, DaemonSets, endpoints (the
# apiserver dials webhooks through them), garbage collection and the node's not-ready taint.
launch kube-controller-manager "$state/kube-controller-manager.log" nsenter --net="$netns" \
  "$node_bin/kube-controller-manager" \
  --kubeconfig="$kubeconfig" --leader-elect=false --secure-port=0 \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --use-service-account-credentials=false --v=1
cm_pid=$launched_pid

kubectl() { in_net "$cp_bin/kubectl" --kubeconfig="$kubeconfig" "$@"; }
# node_ready: Ready, without the not-ready taint, and the default ServiceAccount exists (pods
# created before it are refused).
node_ready() {
  kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.spec.taints}' 2>/dev/null |
    grep -qx 'True ' || return 1
  kubectl get serviceaccount default -n default >/dev/null 2>&1
}
nodes_ready() {
  local name
  for name in "${node_names[@]}"; do node_ready "$name" || return 1; done
}
while ! nodes_ready; do
  for p in "${kubelets[@]}" "$scheduler_pid:kube-scheduler:$state/kube-scheduler.log" \
    "$cm_pid:kube-controller-manager:$state/kube-controller-manager.log"; do
    IFS=: read -r pid name log <<<"$p"
    alive "$pid" || fail "$name exited" "$log"
  done
  owner_alive || fail "owner process $owner_pid is gone; giving up"
  (( $(date +%s) < deadline )) || fail "nodes ${node_names[*]} were not all Ready within ${timeout}s" "$kubelet_log"
  sleep 0.5
done

ok=true
{
  echo "STATE_DIR=$state"
  echo "KUBECONFIG=$kubeconfig"
  echo "NETNS=$netns"
  echo "NODE_NAME=$node_name"
  echo "NODE_IP=$node_ip"
  echo "REGISTRY=$registry"
  echo "REGISTRY_LOG=$(node_var REGISTRY_LOG)"
  echo "AUTH_REGISTRY=$(node_var AUTH_REGISTRY)"
  echo "AUTH_USER=$(node_var AUTH_USER)"
  echo "AUTH_PASSWORD=$(node_var AUTH_PASSWORD)"
  echo "CONTAINERD_SOCKET=$(node_var CONTAINERD_SOCKET)"
  echo "CERTS_D=$(node_var CERTS_D)"
  echo "IMAGES=$(node_var IMAGES)"
  echo "KUBELET_LOG=$kubelet_log"
  echo "NODES=$nodes"
  echo "NODE_NAMES=${node_names[*]}"
  echo "NODE_1_NAME=$node_name"
  echo "NODE_1_IP=$node_ip"
  echo "NODE_1_NETNS=$netns"
  echo "NODE_1_MNTNS=$mntns"
  echo "NODE_1_CONTAINERD_SOCKET=$(node_var CONTAINERD_SOCKET)"
  echo "NODE_1_KUBELET_LOG=$kubelet_log"
  for (( i = 2; i <= nodes; i++ )); do
    echo "NODE_${i}_NAME=kruise-rs-node-$i"
    echo "NODE_${i}_IP=10.77.$i.2"
    echo "NODE_${i}_NETNS=/run/netns/$netns_name-$i"
    echo "NODE_${i}_MNTNS=$state/ns/mnt-$i"
    echo "NODE_${i}_CONTAINERD_SOCKET=$state/node-$i/ctrd/containerd.sock"
    echo "NODE_${i}_KUBELET_LOG=$state/node-$i/kubelet.log"
  done
} >"$state/env"
echo "start.sh: nodes ${node_names[*]} Ready (kubelet $("$node_bin/kubelet" --version | cut -d' ' -f2)," \
  "containerd $("$KRUISE_RS_CONTAINERD_BIN/containerd" --version | awk '{print $3}')," \
  "registry $registry, network namespace $netns_name) in $(elapsed_since "$t0")s" >&2
cat "$state/env"
