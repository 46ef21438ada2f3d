#!/usr/bin/env bash
# `make run` on a real node (tests/controlplane/run-local.sh runs this where the machine allows
# it): a one-node cluster with a real kubelet and containerd (tests/cluster/start.sh), kruise-rs
# installed with its Helm chart from the product image (tests/cluster/image.sh), examples/
# applied, a Deployment of three app=web pods the example SidecarSet injects, then an upgrade of
# the sidecar image: pre-download by the daemon pod, then in-place restarts of the sidecar
# containers by the kubelet. Prints each pod's sidecar and app containers (restart count, image)
# before and after.
#
# Usage: tests/cluster/demo.sh            the demo, then keep running until Ctrl-C
#        tests/cluster/demo.sh --check    exit 0 if this machine can run a real node, else say why
# Env: KRUISE_RS_DEMO=once        stop after the demo; the exit status says whether it finished
#      KRUISE_RS_DEMO_TIMEOUT     seconds each step may take (default 300)
#      KRUISE_RS_IMAGE_PROFILE    release (default) or dev: the build the image packs (image.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

# --- can this machine run a real node? -----------------------------------------------------------
check() {
  local tool probe
  [[ $(id -u) == 0 ]] || { echo "not root"; return 1; }
  for tool in containerd runc ip nsenter unshare umoci skopeo jq; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (make deps installs it)"; return 1; }
  done
  [[ -x /usr/lib/cni/bridge ]] || { echo "the CNI plugins are missing (make deps installs them)"; return 1; }
  ls -d /sys/fs/cgroup/*/kubepods >/dev/null 2>&1 && { echo "another kubelet runs here"; return 1; }
  probe=kruise-rs-probe-$$
  ip netns add "$probe" 2>/dev/null || { echo "cannot create a network namespace"; return 1; }
  ip netns del "$probe"
}
if [[ ${1:-} == --check ]]; then
  if why=$(check); then exit 0; fi
  echo "$why"
  exit 1
fi
if ! why=$(check); then echo "demo.sh: no real node here: $why" >&2; exit 1; fi

say() { printf '\n==> %s\n' "$*" >&2; }
timeout=${KRUISE_RS_DEMO_TIMEOUT:-300}

say "building the product image (${KRUISE_RS_IMAGE_PROFILE:-release} build; the first release build takes ~13 min) and the node binaries"
image=$("$here/image.sh")
helm=$(tests/deploy/build-helm.sh)
state=$(mktemp -d /tmp/kruise-rs-demo.XXXXXX)
trap '"$here/stop.sh" "$state/cluster"; rm -rf "$state"' EXIT
trap 'exit 130' INT TERM HUP
say "starting a one-node cluster: etcd, kube-apiserver, containerd, kubelet, scheduler, controller-manager"
"$here/start.sh" --owner-pid $$ "$state/cluster" >/dev/null
env_var() { sed -n "s/^$1=//p" "$state/cluster/env"; }
netns=$(env_var NETNS)
registry=$(env_var REGISTRY)
kubeconfig=$(env_var KUBECONFIG)
node=$(env_var NODE_NAME)
images=$(env_var IMAGES)
certs_d=$(env_var CERTS_D)
in_net() { nsenter --net="$netns" "$@"; }
kubectl() { in_net "$state/cluster/controlplane/bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
helm() {
  in_net env HELM_CACHE_HOME="$state/helm/cache" HELM_CONFIG_HOME="$state/helm/config" \
    HELM_DATA_HOME="$state/helm/data" "$helm" --kubeconfig "$kubeconfig" "$@"
}

# --- images --------------------------------------------------------------------------------------
# The examples name registry.example.com: containerd resolves it to the loopback registry (a
# hosts.toml whose server is that registry), so nothing is ever asked of registry.example.com.
say "pushing the product image and the demo images to the node's registry $registry"
in_net skopeo copy -q --dest-tls-verify=false "$image" "docker://$registry/kruise-rs/kruise-rs:demo"
mkdir -p "$certs_d/registry.example.com"
cat >"$certs_d/registry.example.com/hosts.toml" <<TOML
server = "http://$registry"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
TOML
# Busybox images whose programs exit on TERM: /bin/agent (the log-agent sidecar), /bin/web (the
# app), /bin/sh (the init container's shell). Each version's script differs, so each has its
# own digest.
layout=$state/demo-images
cp -r "$images" "$layout"
script() {  # script NAME VERSION: a busybox shell script that idles until TERM
  printf '#!/bin/busybox sh\ntrap "exit 0" TERM\necho "%s %s started: $*"\nwhile true; do /bin/busybox sleep 1; done\n' "$1" "$2"
}
demo_image() {  # demo_image TAG PROGRAM VERSION REPO:TAG
  local file=$state/$1
  script "$2" "$3" >"$file"
  chmod 0755 "$file"
  umoci tag --image "$layout:v1" "$1"
  umoci insert --image "$layout:$1" "$file" "/bin/$2"
  umoci insert --image "$layout:$1" /bin/busybox /bin/sh
  umoci config --image "$layout:$1" --clear=config.cmd --config.entrypoint="/bin/$2"
  in_net skopeo copy -q --dest-tls-verify=false "oci:$layout:$1" "docker://$registry/$4"
}
{
  demo_image agent-1 agent 1.4.2 infra/log-agent:1.4.2
  demo_image agent-2 agent 1.5.0 infra/log-agent:1.5.0
  demo_image web-1 web 2.7.0 storefront/web:2.7.0
  demo_image web-2 web 2.8.0 storefront/web:2.8.0
  demo_image busybox agent busybox infra/busybox:1.36
} >&2

# --- kruise-rs, installed as a user would --------------------------------------------------------
say "helm install kruise-rs deploy/chart/kruise-rs (image $registry/kruise-rs/kruise-rs:demo)"
# The NodeImage of a node younger than --nodeimage-creation-delay (30 s) waits; the node is new.
helm install kruise-rs deploy/chart/kruise-rs --wait --timeout "${timeout}s" \
  --set image.repository="$registry/kruise-rs/kruise-rs" --set image.tag=demo \
  --set 'manager.extraArgs[0]=--nodeimage-creation-delay=0s' >&2
kubectl -n kruise-system get pods -o wide >&2

kubectl create namespace shop >/dev/null
kubectl label namespace shop team=storefront >/dev/null
kubectl create namespace payments >/dev/null
for ns_secret in shop/infra-registry default/storefront-registry; do
  kubectl -n "${ns_secret%/*}" create secret docker-registry "${ns_secret#*/}" \
    --docker-server=registry.example.com --docker-username=demo --docker-password=demo >/dev/null
done
# The example SidecarSet patches a pod annotation: allow it, as upstream's whitelist does.
kubectl -n kruise-system create configmap kruise-configuration >/dev/null \
  --from-literal=SidecarSet_PatchPodMetadata_WhiteList='{"rules":[{"allowedAnnotationKeyExprs":["^log-agent\\.example\\.com/"]}]}'
for _ in $(seq 60); do kubectl get nodeimage "$node" >/dev/null 2>&1 && break; sleep 1; done
kubectl apply -f examples/ >&2

say "a Deployment of 3 app=web pods in namespace shop (the log-agent SidecarSet injects them)"
kubectl apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web, tier: low}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: web
          image: registry.example.com/storefront/web:2.7.0
          env: [{name: APP_ENV, value: demo}]
YAML

progress() {
  local set
  set=$(kubectl get sidecarset log-agent -o json | jq -r '.status as $s |
    "matched \($s.matchedPods // 0) updated \($s.updatedPods // 0) updatedReady \($s.updatedReadyPods // 0)"
    + ([$s.conditions[]? | select(.type == "RolloutHeld" or .type == "ImagePreDownload")
        | " | \(.type)=\(.status)\(if .reason then " (\(.reason))" else "" end)"] | join(""))') || true
  printf '    [%3ss] log-agent: %s\n' "$(( $(date +%s) - t0 ))" "$set" >&2
}
finished=true
watch_until() {  # progress every 2 s until CONDITION holds (at most the step timeout)
  local i
  for i in $(seq $(( timeout / 2 ))); do
    progress
    if "$@"; then return 0; fi
    sleep 2
  done
  echo "    (not finished after ${timeout}s)" >&2
  finished=false
}
rollout_done() {
  kubectl get sidecarset log-agent -o json | jq -e --arg img "$1" '
    (.spec.containers[0].image == $img) and (.status.observedGeneration == .metadata.generation)
    and (.status.matchedPods == 3) and (.status.updatedReadyPods == 3)' >/dev/null
}
containers() {
  kubectl -n shop get pods -l app=web -o json | jq -r '.items[] | .metadata.name as $pod |
    [.status.containerStatuses[] | {key: .name, value: "\(.restartCount) restarts, \(.image) (\(.imageID | split("@")[1] | .[0:19]))"}] | from_entries |
    "    \($pod)\n      log-agent: \(.["log-agent"])\n      web:       \(.web)"' >&2
}

t0=$(date +%s)
say "waiting for the pods to run with their log-agent sidecar"
watch_until rollout_done registry.example.com/infra/log-agent:1.4.2
containers

new_image=registry.example.com/infra/log-agent:1.5.0
say "upgrading the log-agent sidecar to $new_image: pre-download on the node, then in-place restarts"
kubectl patch sidecarset log-agent --type=json \
  -p "[{\"op\":\"replace\",\"path\":\"/spec/containers/0/image\",\"value\":\"$new_image\"}]" >/dev/null
t0=$(date +%s)
watch_until rollout_done "$new_image"
say "after the upgrade: the same pods, each log-agent restarted once with the new image, web untouched"
containers
kubectl get imagepulljobs -A >&2

if [[ ${KRUISE_RS_DEMO:-1} == once ]]; then
  say "the demo $([[ $finished == true ]] && echo finished || echo "did not finish"); stopping"
  [[ $finished == true ]]
  exit
fi
cat >&2 <<MSG

The demo is done; the cluster keeps running. In another shell:
  tests/cluster/exec.sh $state/cluster kubectl get pods -A -o wide
  tests/cluster/exec.sh $state/cluster kubectl get sidecarsets,imagepulljobs,nodeimages -A
  tests/cluster/exec.sh $state/cluster kubectl -n kruise-system logs deploy/kruise-rs-manager
Ctrl-C stops everything.
MSG
while kill -0 "$(sed -n 's/^kubelet //p' "$state/cluster/pids" | tail -1)" 2>/dev/null; do sleep 5; done
