#!/usr/bin/env bash
# `make run`: the whole system on its embedded default. Starts a loopback-only control plane
# (the one the integration tests use), installs the CRDs, applies examples/ and runs the manager
# in the foreground. Ctrl-C stops the manager; the control plane goes with it.
# Unless KRUISE_RS_DEMO=0, it also runs a demo first: three Ready Nodes, the manager in the
# background (its log in the state directory), three app=web pods the example SidecarSet injects
# (demo-kubelet.sh plays their kubelet and the nodes' daemon), then an upgrade of the sidecar image,
# with the ImagePullJob and SidecarSet progress printed every second until everything finished.
#
# Env: KRUISE_RS_DEMO          0: no demo, the manager in the foreground at once (default 1)
#      KRUISE_RS_PROBE_ADDR    where the manager serves /healthz, /readyz, /metrics (127.0.0.1:8080)
#      KRUISE_RS_WEBHOOK_ADDR  where it serves the admission webhooks, which the apiserver calls
#                              at https://<that address> (127.0.0.1:9443)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

cargo build --quiet
state=$(mktemp -d "${TMPDIR:-/tmp}/kruise-rs-local.XXXXXX")
# The control plane lives as long as this process, which becomes the manager below (exec keeps
# the PID), so stopping the manager tears everything down.
kubeconfig=$("$here/start.sh" --owner-pid $$ "$state")
kubectl() { "$state/bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

cargo run --quiet -- crds | kubectl apply --server-side -f - >&2
kubectl wait --for=condition=Established crd --all --timeout=60s >&2
kubectl create namespace payments >&2     # the namespace the v1alpha1 SidecarSet example names
# The demo applies examples/ once the manager (its webhooks) and the NodeImages are up.
[[ ${KRUISE_RS_DEMO:-1} == 0 ]] && kubectl apply -f examples/ >&2
# The example SidecarSet patches a pod annotation: allow it, as upstream's whitelist does.
kubectl create namespace kruise-system >&2
kubectl -n kruise-system create configmap kruise-configuration >&2 \
  --from-literal=SidecarSet_PatchPodMetadata_WhiteList='{"rules":[{"allowedAnnotationKeyExprs":["^log-agent\\.example\\.com/"]}]}'

export KRUISE_RS_PROBE_ADDR=${KRUISE_RS_PROBE_ADDR:-127.0.0.1:8080}
webhook_addr=${KRUISE_RS_WEBHOOK_ADDR:-127.0.0.1:9443}
manager=(cargo run --quiet -- manager --kubeconfig "$kubeconfig"
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
# No kubelet and no node runs here: demo-kubelet.sh plays both for the demo nodes and pods.
say() { printf '\n==> %s\n' "$*" >&2; }
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
for _ in $(seq 30); do kubectl apply -f examples/ >&2 && break; sleep 1; done

"$here/demo-kubelet.sh" kubelet shop &
helpers+=($!)
"$here/demo-kubelet.sh" daemon &
helpers+=($!)
say "playing the kubelet for the pods of namespace shop and the node daemon for node-a..c"

say "creating 3 app=web pods in namespace shop, one per node (the log-agent SidecarSet injects them)"
for i in 1 2 3; do
  node=node-$(echo x a b c | cut -d' ' -f$((i + 1)))
  pod=$(cat <<YAML
apiVersion: v1
kind: Pod
metadata: {name: web-$i, namespace: shop, labels: {app: web}}
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
  echo "    web-$i on $node: containers $(kubectl -n shop get pod "web-$i" -o jsonpath='{.spec.containers[*].name}')" >&2
done

progress() {
  local jobs set
  jobs=$(kubectl get imagepulljobs -A -o json | jq -r '[.items[] |
    "\(.metadata.name) \(.status.succeeded // 0)/\(.status.desired // 0)\(if .status.completionTime then " done" else "" end)"] | join(", ")') || true
  set=$(kubectl get sidecarset log-agent -o json | jq -r '.status as $s |
    "matched \($s.matchedPods // 0) updated \($s.updatedPods // 0) ready \($s.readyPods // 0) updatedReady \($s.updatedReadyPods // 0)"
    + ([$s.conditions[]? | select(.type == "RolloutHeld" or .type == "ImagePreDownload")
        | " | \(.type)=\(.status)\(if .reason then " (\(.reason))" else "" end)"] | join(""))') || true
  printf '    [%3ss] jobs: %s\n           log-agent: %s\n' "$(( $(date +%s) - t0 ))" "${jobs:-none}" "$set" >&2
}
# watch_until CONDITION_COMMAND: progress every second until it holds (at most 5 minutes).
watch_until() {
  local i
  for i in $(seq 300); do
    progress
    if "$@"; then return 0; fi
    sleep 1
  done
  echo "    (still not finished after 5 minutes: see $log)" >&2
}
rollout_done() {
  kubectl get sidecarset log-agent -o json | jq -e --arg img "$1" '
    (.spec.containers[0].image == $img) and (.status.observedGeneration == .metadata.generation)
    and (.status.matchedPods == 3) and (.status.updatedReadyPods == .status.matchedPods)' >/dev/null
}
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
The demo's kubelet and node daemon keep answering. Ctrl-C stops the manager and the control plane.
(KRUISE_RS_DEMO=0 make run skips the demo.)

MSG
wait "$manager_pid"
