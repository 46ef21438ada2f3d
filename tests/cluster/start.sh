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
#   Progress and errors go to stderr. With --owner-pid, a detached watchdog stops everything and
#   removes STATE_DIR once PID is gone.
# Stop with tests/cluster/stop.sh STATE_DIR.
# Env: KUBE_VERSION            Kubernetes minor (default 1.36)
#      KRUISE_RS_CLUSTER_TIMEOUT  seconds to wait for the node to be Ready (default 180)
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
    -h|--help) sed -n '2,38p' "$0" >&2; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $# -eq 1 ]] || die "usage: start.sh [--owner-pid PID] STATE_DIR"
[[ $(id -u) == 0 ]] || die "a real node needs root (network and mount namespaces, cgroups, runc)"
if [[ -n $owner_pid ]]; then
  kill -0 "$owner_pid" 2>/dev/null || die "owner pid $owner_pid is not running"
fi
for tool in ip nsenter unshare mount containerd runc ctr curl python3 setsid; do
  command -v "$tool" >/dev/null || die "$tool is missing (tests/setup.sh installs it)"
done
for plugin in bridge host-local loopback; do
  [[ -x /usr/lib/cni/$plugin ]] || die "/usr/lib/cni/$plugin is missing (apt-get install containernetworking-plugins)"
done
# One real node per machine: the kubelet's cgroups (kubepods) and sysctls are global.
for dir in /sys/fs/cgroup/*/kubepods; do
  [[ -d $dir ]] && die "$dir exists: another kubelet runs (or ran) here; stop it first (tests/cluster/stop.sh)"
done
mkdir -p "$1"
state=$(cd "$1" && pwd)
timeout=${KRUISE_RS_CLUSTER_TIMEOUT:-180}
deadline=$(( $(date +%s) + timeout ))
t0=$(date +%s.%N)

# Binaries first (minutes on the first run, instant once cached).
cp_bin=$("$repo/tests/controlplane/build.sh")
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
cat >"$state/node/ctrd/cni/10-bridge.conflist" <<JSON
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
        "ranges": [[{ "subnet": "10.88.0.0/16" }]],
        "dataDir": "$state/cni-ipam"
      }
    },
    { "type": "loopback" }
  ]
}
JSON
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
cat >"$state/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $node_ip
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
cgroupsPerQOS: true
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# No cluster DNS and none of the host's resolvers in pods: only loopback is ever contacted.
resolvConf: ""
clusterDomain: cluster.local
# A test machine's disk is not the node's business: no image GC, no evictions.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
serializeImagePulls: false
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
# No imagePullCredentialsVerificationPolicy: the kubelet's default (KEP-2535), which a 1.33 or 1.34
# kubelet refuses to read with its feature gate off. tests/e2e/pull_verification.rs appends
# AlwaysVerify for a while, around kubelet restarts.
YAML
kubelet_log=$state/kubelet.log
launch kubelet "$kubelet_log" nsenter --net="$netns" --mount="$mntns" "$node_bin/kubelet" \
  --config="$state/kubelet/config.yaml" \
  --kubeconfig="$kubeconfig" \
  --root-dir="$state/kubelet" \
  --cert-dir="$state/kubelet/pki" \
  --hostname-override="$node_name" \
  --node-ip="$node_ip" \
  --v=2
kubelet_pid=$launched_pid

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
  kubectl get node "$node_name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.spec.taints}' 2>/dev/null |
    grep -qx 'True ' || return 1
  kubectl get serviceaccount default -n default >/dev/null 2>&1
}
while ! node_ready; do
  for p in "$kubelet_pid:kubelet:$kubelet_log" "$scheduler_pid:kube-scheduler:$state/kube-scheduler.log" \
    "$cm_pid:kube-controller-manager:$state/kube-controller-manager.log"; do
    IFS=: read -r pid name log <<<"$p"
    alive "$pid" || fail "$name exited" "$log"
  done
  owner_alive || fail "owner process $owner_pid is gone; giving up"
  (( $(date +%s) < deadline )) || fail "node $node_name was not Ready within ${timeout}s" "$kubelet_log"
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
} >"$state/env"
echo "start.sh: node $node_name Ready (kubelet $("$node_bin/kubelet" --version | cut -d' ' -f2), containerd," \
  "registry $registry, network namespace $netns_name) in $(elapsed_since "$t0")s" >&2
cat "$state/env"
