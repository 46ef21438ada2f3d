#!/usr/bin/env bash
# `make run`: the whole system on its embedded default. Where this machine can run a real node
# (root, containerd, runc, network namespaces), that is tests/cluster/demo.sh: a one-node cluster
# with a real kubelet, kruise-rs installed with its chart, the demo below on real pods
# (KRUISE_RS_NODE). Otherwise, or with KRUISE_RS_DEMO=0: starts a loopback-only control plane
# (the one the integration tests use), installs the CRDs, applies examples/ and runs the manager
# in the foreground. Ctrl-C stops the manager; the control plane goes with it.
# Unless KRUISE_RS_DEMO=0, it also runs a demo first: three Ready Nodes, the manager in the
# background (its log in the state directory), three app=web pods the example SidecarSet injects
# (played-node plays their kubelet), then an upgrade of the sidecar image, with the ImagePullJob
# and SidecarSet progress printed every second until everything finished. Node node-c is real where
# this machine has what tests/node needs (make deps installs it): a containerd and a registry on
# loopback and `kruise-rs daemon` pulling through CRI; played-node plays the daemon of the rest.
#
# Env: KRUISE_RS_DEMO          1: the demo, then the manager keeps running (default)
#                              0: no demo, the manager in the foreground at once
#                              once: the demo, then stop everything; the exit status says whether
#                              the demo finished (how the tests run it)
#      KRUISE_RS_DEMO_TIMEOUT  seconds each demo step may take before it is given up (300)
#      KRUISE_RS_PROBE_ADDR    where the manager serves /healthz, /readyz, /metrics (127.0.0.1:8080)
#      KRUISE_RS_WEBHOOK_ADDR  where it serves the admission webhooks, which the apiserver calls
#                              at https://<that address> (127.0.0.1:9443)
#      KRUISE_RS_BIN           a built kruise-rs to run (default: cargo build, then cargo run)
#      KRUISE_RS_PLAYED_NODE   a built played-node (crates/testkit) to play the kubelet and the
#                              node daemons with (default: cargo build, then cargo run)
#      KRUISE_RS_DAEMON_PROBE_ADDR  where node-c's daemon serves its probes and /metrics
#                              (127.0.0.1:10221)
#      KRUISE_RS_NODE          auto: the demo on a real node (tests/cluster/demo.sh: kubelet,
#                              containerd, the chart installed with helm) where this machine
#                              allows it (root, containerd, runc, network namespaces), else
#                              played as below, saying why (default)
#                              real: the real node or fail; played: the played kubelet
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

node_mode=${KRUISE_RS_NODE:-auto}
if [[ ${KRUISE_RS_DEMO:-1} != 0 && $node_mode != played ]]; then
  if why=$("$repo/tests/cluster/demo.sh" --check); then
    exec "$repo/tests/cluster/demo.sh"
  fi
  [[ $node_mode == real ]] && { echo "run-local.sh: KRUISE_RS_NODE=real, but $why" >&2; exit 1; }
  echo "run-local.sh: no real node on this machine ($why): the demo plays the kubelet" >&2
fi

# The binary: built here, or the one KRUISE_RS_BIN names (the tests pass theirs).
if [[ -n ${KRUISE_RS_BIN:-} ]]; then
  kruise_rs=("$KRUISE_RS_BIN")
else
  cargo build --quiet
  kruise_rs=(cargo run --quiet --)
fi
# What plays the kubelet and the node daemons (crates/testkit/src/bin/played-node.rs).
if [[ -n ${KRUISE_RS_PLAYED_NODE:-} ]]; then
  played_node=("$KRUISE_RS_PLAYED_NODE")
elif [[ ${KRUISE_RS_DEMO:-1} != 0 ]]; then
  cargo build --quiet -p kruise-rs-testkit --bin played-node
  played_node=(cargo run --quiet -p kruise-rs-testkit --bin played-node --)
fi
state=$(mktemp -d "${TMPDIR:-/tmp}/kruise-rs-local.XXXXXX")
# The control plane lives as long as this process, which becomes the manager below (exec keeps
# the PID), so stopping the manager tears everything down.
kubeconfig=$("$here/start.sh" --owner-pid $$ "$state")
kubectl() { "$state/bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

"${kruise_rs[@]}" crds | kubectl apply --server-side -f - >&2
# kubectl 1.33's wait fails at once ("accessor error: <nil>") on a CRD whose status the apiserver
# has not written yet, instead of waiting: retry until it waits.
for attempt in $(seq 20); do
  kubectl wait --for=condition=Established crd --all --timeout=60s >&2 && break
  (( attempt < 20 )) || { echo "run-local.sh: the CRDs did not become Established" >&2; exit 1; }
  sleep 0.5
done
kubectl create namespace payments >&2     # the namespace the v1alpha1 SidecarSet example names
# The demo applies examples/ once the manager (its webhooks) and the NodeImages are up.
[[ ${KRUISE_RS_DEMO:-1} == 0 ]] && kubectl apply -f examples/ >&2
# The example SidecarSet patches a pod annotation: allow it, as upstream's whitelist does.
kubectl create namespace kruise-system >&2
kubectl -n kruise-system create configmap kruise-configuration >&2 \
  --from-literal=SidecarSet_PatchPodMetadata_WhiteList='{"rules":[{"allowedAnnotationKeyExprs":["^log-agent\\.example\\.com/"]}]}'

export KRUISE_RS_PROBE_ADDR=${KRUISE_RS_PROBE_ADDR:-127.0.0.1:8080}
webhook_addr=${KRUISE_RS_WEBHOOK_ADDR:-127.0.0.1:9443}
manager=("${kruise_rs[@]}" manager --kubeconfig "$kubeconfig"
  --webhook-addr "$webhook_addr" --webhook-url "https://$webhook_addr")

if [[ ${KRUISE_RS_DEMO:-1} == 0 ]]; then
  cat >&2 <<MSG

kruise-rs is running against a local control plane. In another shell:
  export KUBECONFIG=$kubeconfig
  $state/bin/kubectl get sidecarsets,imagepulljobs,nodeimages -A
Probes and metrics: http://$KRUISE_RS_PROBE_ADDR/readyz and /metrics
Webhooks (sidecar injection, defaulting, validation): https://$webhook_addr
Ctrl-C stops the manager and the control plane.

MSG
  exec "${manager[@]}"
fi

# --- the demo ------------------------------------------------------------------------------------
# No kubelet and no node runs here: played-node plays both for the demo nodes and pods.
# shellcheck source-path=SCRIPTDIR source=../lib/demo.sh
source "$repo/tests/lib/demo.sh"  # say, progress, watch_until, rollout_done
helpers=()
manager_pid=""
stop_all() {
  local pid
  for pid in "${helpers[@]}" $manager_pid; do kill "$pid" 2>/dev/null || true; done
  [[ -n $manager_pid ]] && wait "$manager_pid" 2>/dev/null
}
trap stop_all EXIT
trap 'exit 130' INT TERM HUP
export KUBECTL=$state/bin/kubectl KUBECONFIG=$kubeconfig

say "registering 3 Ready nodes (node-a, node-b, node-c)"
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
for node in node-a node-b node-c; do
  kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $node
  labels: {kubernetes.io/hostname: $node, kubernetes.io/os: linux, kubernetes.io/arch: amd64, kruise-rs-demo: "true"}
YAML
  kubectl patch node "$node" --subresource=status --type=merge -p "{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"lastHeartbeatTime\":\"$now\",\"lastTransitionTime\":\"$now\"}]}}" >/dev/null
done
# The namespace of the demo pods (the example SidecarSet selects team=storefront namespaces) and the
# pull secrets the examples name.
kubectl create namespace shop >/dev/null
kubectl label namespace shop team=storefront >/dev/null
kubectl -n shop create secret docker-registry infra-registry --docker-server=registry.example.com \
  --docker-username=demo --docker-password=demo >/dev/null
kubectl create secret docker-registry storefront-registry --docker-server=registry.example.com \
  --docker-username=demo --docker-password=demo >/dev/null

# --- node-c: a real containerd, registry and node daemon, where this machine has them ----------
# The demo images are pushed to the loopback registry tests/node/start.sh brings, and node-c's
# containerd resolves registry.example.com to it (a hosts.toml whose server is that registry, so
# nothing is ever asked of registry.example.com itself): the examples pull as written.
real_node=""
daemon_pid=""
cri_socket=""
daemon_addr=${KRUISE_RS_DAEMON_PROBE_ADDR:-127.0.0.1:10221}
start_real_node() {
  local tool env key value registry="" images="" certs_d="" pair
  for tool in containerd ctr runc docker-registry skopeo umoci htpasswd; do
    if ! command -v "$tool" >/dev/null; then
      echo "    $tool is missing (make deps installs it): node-c is played like the others" >&2
      return 1
    fi
  done
  # A directory of its own, not under $state: the control plane's watchdog removes $state when
  # this process ends, and must not pull the pid files from under the node's watchdog, which
  # stops containerd by them.
  node_state=$(mktemp -d "${TMPDIR:-/tmp}/kruise-rs-node.XXXXXX")
  if ! env=$("$repo/tests/node/start.sh" --owner-pid $$ "$node_state" 2>"$state/node-start.log"); then
    echo "    tests/node/start.sh failed: node-c is played like the others. Its last words:" >&2
    tail -n 15 "$state/node-start.log" | sed 's/^/      /' >&2
    return 1
  fi
  while IFS='=' read -r key value; do
    case $key in
      REGISTRY) registry=$value ;;
      CONTAINERD_SOCKET) cri_socket=$value ;;
      CERTS_D) certs_d=$value ;;
      IMAGES) images=$value ;;
    esac
  done <<<"$env"
  if [[ -z $registry || -z $cri_socket || -z $certs_d || -z $images ]]; then
    echo "    tests/node/start.sh did not say where its registry and containerd are: node-c is played" >&2
    return 1
  fi
  for pair in v1=infra/log-agent:1.4.2 v2=infra/log-agent:1.5.0 v1=storefront/web:2.7.0; do
    skopeo copy -q --dest-tls-verify=false "oci:$images:${pair%%=*}" "docker://$registry/${pair#*=}" \
      || { echo "    pushing ${pair#*=} to $registry failed: node-c is played like the others" >&2; return 1; }
  done
  # Without this file containerd would ask registry.example.com itself: no daemon then.
  mkdir -p "$certs_d/registry.example.com" || return 1
  cat >"$certs_d/registry.example.com/hosts.toml" <<TOML || return 1
server = "http://$registry"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
TOML
  # The image filesystem check off: this containerd keeps its images in the host's $state, whose
  # fullness is the machine's, not a node's (docs/decisions/0035).
  "${kruise_rs[@]}" daemon --node-name node-c --kubeconfig "$kubeconfig" \
    --cri-socket "$cri_socket" --probe-addr "$daemon_addr" \
    --image-fs-high-threshold-percent 100 >"$state/daemon-node-c.log" 2>&1 &
  daemon_pid=$!
  helpers+=("$daemon_pid")
  echo "    containerd $cri_socket, registry $registry (serving registry.example.com to node-c)," \
    "daemon log $state/daemon-node-c.log" >&2
  real_node="node-c"
}
say "starting a real containerd, registry and node daemon for node-c"
start_real_node || true

log=$state/manager.log
say "starting the manager (log: $log)"
"${manager[@]}" --nodeimage-creation-delay 2s >"$log" 2>&1 &
manager_pid=$!
for _ in $(seq 300); do
  curl -sf --noproxy '*' "http://$KRUISE_RS_PROBE_ADDR/readyz" >/dev/null 2>&1 && break
  kill -0 "$manager_pid" 2>/dev/null || { tail -n 30 "$log" >&2; echo "the manager exited" >&2; exit 1; }
  sleep 0.5
done

say "waiting for the NodeImages of node-a..c, then applying examples/"
for _ in $(seq 120); do
  kubectl get nodeimage node-a node-b node-c >/dev/null 2>&1 && break
  sleep 0.5
done
if [[ -n $real_node ]]; then
  for _ in $(seq 60); do
    curl -sf --noproxy '*' "http://$daemon_addr/readyz" >/dev/null 2>&1 && break
    kill -0 "$daemon_pid" 2>/dev/null || { tail -n 20 "$state/daemon-node-c.log" >&2; echo "node-c's daemon exited" >&2; exit 1; }
    sleep 0.5
  done
  curl -sf --noproxy '*' "http://$daemon_addr/readyz" >/dev/null 2>&1 \
    || echo "    node-c's daemon is not ready yet (log: $state/daemon-node-c.log)" >&2
fi
for _ in $(seq 30); do kubectl apply -f examples/ >&2 && break; sleep 1; done

"${played_node[@]}" kubelet shop &
helpers+=($!)
"${played_node[@]}" daemon $real_node &
helpers+=($!)
if [[ -n $real_node ]]; then
  say "playing the kubelet for the pods of namespace shop and the node daemon for node-a and node-b"
else
  say "playing the kubelet for the pods of namespace shop and the node daemon for node-a..c"
fi

say "creating 3 app=web pods in namespace shop, one per node (the log-agent SidecarSet injects them)"
# web-1 and web-2 are tier=low, which the SidecarSet's priorityStrategy upgrades first; once the
# first of them (its first batch, 20%) is upgraded and ready, the pre-download starts on the nodes
# of the other two, and web-3 on node-c goes last, once node-c has pre-downloaded the image.
for i in 1 2 3; do
  node=node-$(echo x a b c | cut -d' ' -f$((i + 1)))
  tier=$( ((i < 3)) && echo low || echo high)
  pod=$(cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: web-$i, namespace: shop, labels: {app: web, tier: $tier}}
spec:
  nodeName: $node
  containers:
    - name: web
      image: registry.example.com/storefront/web:2.7.0
      env: [{name: APP_ENV, value: demo}]
YAML
)
  # The manager registers its webhooks when it starts: retry until the pod comes out injected.
  for _ in $(seq 60); do
    if echo "$pod" | kubectl create -f - >/dev/null 2>&1; then
      if kubectl -n shop get pod "web-$i" -o jsonpath='{.spec.containers[*].name}' | grep -qw log-agent; then break; fi
      kubectl -n shop delete pod "web-$i" --grace-period=0 --force >/dev/null 2>&1 || true
    fi
    sleep 1
  done
  echo "    web-$i on $node, tier=$tier: containers $(kubectl -n shop get pod "web-$i" -o jsonpath='{.spec.containers[*].name}')" >&2
done

demo_timeout=${KRUISE_RS_DEMO_TIMEOUT:-300}
demo_log=$log
finished=true
jobs_done() {
  kubectl get imagepulljob prefetch-web -o json | jq -e '.status.completionTime != null' >/dev/null
}

t0=$(date +%s)
say "waiting for the pods to run and for the ImagePullJob prefetch-web to pull on node-a..c"
watch_until eval 'rollout_done registry.example.com/infra/log-agent:1.4.2 && jobs_done'

new_image=registry.example.com/infra/log-agent:1.5.0
say "upgrading the log-agent sidecar to $new_image: pre-download on the nodes, then in-place upgrade"
kubectl patch sidecarset log-agent --type=json \
  -p "[{\"op\":\"replace\",\"path\":\"/spec/containers/0/image\",\"value\":\"$new_image\"}]" >/dev/null
sleep 1
watch_until rollout_done "$new_image"
kubectl get sidecarsets,imagepulljobs -A >&2
kubectl -n shop get pods -o custom-columns='POD:.metadata.name,NODE:.spec.nodeName,IMAGES:.status.containerStatuses[*].image' >&2
if [[ -n $real_node ]]; then
  say "what node-c's daemon reported (events on its NodeImage) and its containerd holds"
  kubectl get events --field-selector involvedObject.kind=NodeImage,involvedObject.name=node-c \
    -o json | jq -r '.items | sort_by(.eventTime // .firstTimestamp)[]
      | "    \(.type) \(.reason): \(.message)"' >&2 || true
  ctr --address "$cri_socket" --namespace k8s.io images ls -q 2>/dev/null \
    | grep '^registry.example.com/' | sed 's/^/    containerd: /' >&2 || true
fi
if [[ ${KRUISE_RS_DEMO:-1} == once ]]; then
  say "the demo $([[ $finished == true ]] && echo finished || echo "did not finish"); stopping"
  [[ $finished == true ]] && exit 0
  exit 1
fi

cat >&2 <<MSG

The demo is done; kruise-rs keeps running against the local control plane. In another shell:
  export KUBECONFIG=$kubeconfig
  alias kubectl=$state/bin/kubectl
  kubectl get sidecarsets,imagepulljobs,nodeimages -A
  kubectl get sidecarset log-agent -o jsonpath='{.status.conditions}'
  kubectl -n shop get pods -o wide
  kubectl get nodeimage node-a -o yaml
Manager log: $log
Probes and metrics: http://$KRUISE_RS_PROBE_ADDR/readyz and /metrics
Webhooks (sidecar injection, defaulting, validation): https://$webhook_addr
$([[ -n $real_node ]] && printf '%s\n' \
  "node-c is real: ctr --address $cri_socket -n k8s.io images ls; daemon log $state/daemon-node-c.log," \
  "its probes and metrics http://$daemon_addr/metrics")
The demo's kubelet and node daemon keep answering. Ctrl-C stops the manager and the control plane.
(KRUISE_RS_DEMO=0 make run skips the demo.)

MSG
wait "$manager_pid"
