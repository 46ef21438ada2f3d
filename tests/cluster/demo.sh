#!/usr/bin/env bash
# `make run` on a real node (tests/controlplane/run-local.sh runs this where the machine allows
# it): a cluster of three nodes (NODES), each with a real kubelet and containerd
# (tests/cluster/start.sh), kruise-rs installed with its Helm chart from the product image
# (tests/cluster/image.sh), examples/ applied (each ImagePullJob doing work on this cluster: see
# "the examples" below), a Deployment of three app=web pods spread one per node that the example
# SidecarSet injects, then an upgrade of the sidecar image. Prints, before and after, what each
# node's daemon pulled (its NodeImage) and each pod's node and sidecar and app containers
# (restart count, image), then a timeline of the upgrade: when each node got the new sidecar
# image and from whom (the daemon's pre-download or the kubelet), when each pod was patched and
# its sidecar restarted, and what the kubelet said about the image.
#
# Usage: tests/cluster/demo.sh            the demo, then keep running until Ctrl-C
#        tests/cluster/demo.sh --check    exit 0 if this machine can run a real node, else say why
# Env: NODES                      how many nodes, 1 to 3 (default 3; one node cannot show
#                                 pre-download: the canary's kubelet pulls the image onto it)
#      KRUISE_RS_DEMO=once        stop after the demo; the exit status says whether it finished
#                                 and, with two nodes or more, whether the daemons pre-downloaded
#                                 the new sidecar image on the nodes of the pods the rollout had
#                                 not reached yet, before those pods were patched
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
nodes=${NODES:-3}
[[ $nodes =~ ^[1-3]$ ]] || { echo "demo.sh: NODES=$nodes: 1, 2 or 3" >&2; exit 1; }

# shellcheck source-path=SCRIPTDIR source=../lib/demo.sh
source "$repo/tests/lib/demo.sh"  # say, progress, watch_until, rollout_done
demo_timeout=${KRUISE_RS_DEMO_TIMEOUT:-300}
demo_t0=$(date +%s)

say "building the product image (${KRUISE_RS_IMAGE_PROFILE:-release} build; the first release build takes ~13 min) and the node binaries"
image=$("$here/image.sh")
helm=$(tests/deploy/build-helm.sh)
state=$(mktemp -d /tmp/kruise-rs-demo.XXXXXX)
trap '"$here/stop.sh" "$state/cluster"; rm -rf "$state"' EXIT
trap 'exit 130' INT TERM HUP
say "starting a cluster of $nodes node(s): etcd, kube-apiserver, kube-scheduler, kube-controller-manager, and per node a containerd and a kubelet"
NODES=$nodes "$here/start.sh" --owner-pid $$ "$state/cluster" >/dev/null
env_var() { sed -n "s/^$1=//p" "$state/cluster/env"; }
netns=$(env_var NETNS)
registry=$(env_var REGISTRY)
kubeconfig=$(env_var KUBECONFIG)
read -r -a node_names <<<"$(env_var NODE_NAMES)"
images=$(env_var IMAGES)
certs_d=$(env_var CERTS_D)
in_net() { nsenter --net="$netns" "$@"; }
kubectl() { in_net "$state/cluster/controlplane/bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }
helm() {
  in_net env HELM_CACHE_HOME="$state/helm/cache" HELM_CONFIG_HOME="$state/helm/config" \
    HELM_DATA_HOME="$state/helm/data" "$helm" --kubeconfig "$kubeconfig" "$@"
}
# until DESCRIPTION COMMAND...: poll COMMAND every 0.5 s until it holds, at most the step timeout.
until_true() {
  local what=$1 deadline=$(( $(date +%s) + demo_timeout ))
  shift
  until "$@"; do
    (( $(date +%s) < deadline )) || { echo "demo.sh: $what: not within ${demo_timeout}s" >&2; return 1; }
    sleep 0.5
  done
}

# --- images --------------------------------------------------------------------------------------
# The examples name registry.example.com: containerd resolves it to the loopback registry (a
# hosts.toml whose server is that registry; every node's containerd reads the same directory), so
# nothing is ever asked of registry.example.com.
say "pushing the product image and the demo images to the cluster's registry $registry"
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
  demo_image runtime runtime 1.0 base/runtime:1.0
} >&2
runtime_digest=$(in_net skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$registry/base/runtime:1.0")

# --- kruise-rs, installed as a user would --------------------------------------------------------
say "helm install kruise-rs deploy/chart/kruise-rs (image $registry/kruise-rs/kruise-rs:demo)"
# The NodeImage of a node younger than --nodeimage-creation-delay (30 s) waits; the nodes are new.
helm install kruise-rs deploy/chart/kruise-rs --wait --timeout "${demo_timeout}s" \
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
nodeimages_exist() {
  local name
  for name in "${node_names[@]}"; do kubectl get nodeimage "$name" >/dev/null 2>&1 || return 1; done
}
until_true "the NodeImages of ${node_names[*]}" nodeimages_exist

# --- the examples --------------------------------------------------------------------------------
# Two example ImagePullJobs would match nothing here as written (TOTAL 0), so they are applied as
# a user of this cluster would apply them:
# - imagepulljob-digest-nodes.yaml names the nodes node-a and node-b (the played demo's, see
#   tests/controlplane/run-local.sh) and a digest made up for the example: it gets this
#   cluster's first two nodes and the digest of the base/runtime:1.0 image pushed above;
# - imagepulljob-podselector.yaml pulls on the nodes of the app=web pods of its own namespace:
#   in `default` there are none, so it goes to shop, once the web pods run there.
pin_nodes=$(printf '%s\n' "${node_names[@]:0:2}" | jq -R . | jq -sc .)
say "kubectl apply -f examples/: the SidecarSets log-agent and mesh-proxy, the ImagePullJob prefetch-web"
kubectl apply -f examples/sidecarset.yaml -f examples/sidecarset-v1alpha1.yaml -f examples/imagepulljob.yaml >&2
say "the ImagePullJob pin-base-image (examples/imagepulljob-digest-nodes.yaml) with this cluster's nodes $pin_nodes and base/runtime's digest (the example names node-a, node-b and a made-up digest)"
kubectl create --dry-run=client -o json -f examples/imagepulljob-digest-nodes.yaml |
  jq --arg image "registry.example.com/base/runtime@$runtime_digest" --argjson names "$pin_nodes" \
    '.spec.image = $image | .spec.selector.names = $names' | kubectl apply -f - >&2

say "a Deployment of 3 app=web pods in namespace shop, spread over the nodes (the log-agent SidecarSet injects them)"
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
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: DoNotSchedule
          labelSelector: {matchLabels: {app: web}}
      containers:
        - name: web
          image: registry.example.com/storefront/web:2.7.0
          env: [{name: APP_ENV, value: demo}]
YAML

# --- watching ---------------------------------------------------------------------------------------
obs=$state/observed
mkdir -p "$obs"
finished=true
examples_done() {
  kubectl get imagepulljobs -A -o json | jq -e --argjson pinned "$(jq length <<<"$pin_nodes")" '
    [.items[] | {key: .metadata.name, value: .status}] | from_entries
    | (.["prefetch-web"].completionTime != null) and (.["prefetch-next-web"].completionTime != null)
      and (.["pin-base-image"].succeeded == $pinned)' >/dev/null
}
pods() {  # each app=web pod: its node, its containers' restart counts and images
  kubectl -n shop get pods -l app=web -o json | jq -r '.items | sort_by(.spec.nodeName, .metadata.name)[]
    | .metadata.name as $pod | .spec.nodeName as $node
    | [.status.containerStatuses[] | {key: .name, value: "\(.restartCount) restart(s), \(.image) (\(.imageID | split("@")[1] | .[0:19]))"}] | from_entries
    | "    \($pod) on \($node)\n      log-agent: \(.["log-agent"])\n      web:       \(.web)"' >&2
}
# The events of the whole cluster (events.k8s.io, whose eventTime has microseconds), in $obs/events.json.
# The daemon records one on its node's NodeImage for every pull it finishes (PullImageSucceed or
# PullImageFailed, related to the pull's first job), so they say what each daemon pulled, and when,
# after the jobs and their NodeImage entries are gone.
events() { kubectl get events.events.k8s.io -A -o json >"$obs/events.json"; }
# jq definitions for the events: t, seconds since $t0 (whole seconds: the pods' own times have no
# more); ago, such a time as +Ns; pulls, the daemons' finished pulls.
# shellcheck disable=SC2016 # a jq program
jq_defs='
  def t: if . then capture("^(?<s>[^.Z]+)(?<f>\\.[0-9]+)?Z$")
    | ((.s + "Z") | fromdateiso8601) + ("0\(.f // "")" | tonumber) - $t0 | floor else null end;
  def ago: if . == null then "?" elif . < 0 then "\(.)s" else "+\(.)s" end;
  def pulls: .items[] | select(.regarding.kind == "NodeImage")
    | select(.reason == "PullImageSucceed" or .reason == "PullImageFailed")
    | {node: .regarding.name, at: (.eventTime // .deprecatedLastTimestamp | t), ok: (.reason == "PullImageSucceed"),
       image: ([.note | capture("^Image (?<i>[^ ,]+)").i] | first),
       took: ([.note | capture("elapsed time (?<e>[0-9.]+s)").e] | first),
       job: (.related | if . then "\(.namespace)/\(.name)" else "?" end),
       note};'
# node_pulls SINCE: per node, what its daemon pulled from SINCE (seconds since $t0) on.
node_pulls() {
  events
  jq -r --argjson t0 "$t0" --argjson since "$1" \
    --argjson nodes "$(printf '%s\n' "${node_names[@]}" | jq -R . | jq -sc .)" "$jq_defs"'
    [pulls | select(.at >= $since)] as $pulls
    | $nodes[] as $node
    | "    \($node):",
      ([$pulls[] | select(.node == $node)] | sort_by(.at) as $mine
       | if ($mine | length) == 0 then "      (nothing)"
         else $mine[] | "      \(.at | ago)  \(.image)  \(if .ok then "pulled in \(.took)" else "FAILED: \(.note)" end)  (job \(.job))" end)' \
    "$obs/events.json" >&2
}

t0=$(date +%s)
say "waiting for the pods to run with their log-agent sidecar"
watch_until rollout_done registry.example.com/infra/log-agent:1.4.2
say "the ImagePullJob prefetch-next-web (examples/imagepulljob-podselector.yaml) in namespace shop, where the app=web pods run: kubectl apply -n shop -f examples/imagepulljob-podselector.yaml"
kubectl apply -n shop -f examples/imagepulljob-podselector.yaml >&2
say "waiting for the example ImagePullJobs: prefetch-web and prefetch-next-web complete, pin-base-image pulled on $pin_nodes"
until_true "the example ImagePullJobs" examples_done || finished=false
kubectl get imagepulljobs,imagelistpulljobs -A >&2

say "before the upgrade: each pod's node and containers"
pods
say "before the upgrade: what each node's daemon pulled (its events; seconds since the Deployment was created)"
node_pulls -100000

new_image=registry.example.com/infra/log-agent:1.5.0
say "upgrading the log-agent sidecar to $new_image: one pod at a time (maxUnavailable 20%); its pre-download starts once 20% of the pods (one) are updated and ready"
t0=$(date +%s)
kubectl patch sidecarset log-agent --type=json \
  -p "[{\"op\":\"replace\",\"path\":\"/spec/containers/0/image\",\"value\":\"$new_image\"}]" >/dev/null
watch_until rollout_done "$new_image"

say "after the upgrade: each pod's node and containers"
pods
say "during the upgrade: what each node's daemon pulled (its events; seconds since the SidecarSet's patch)"
node_pulls 0

# The story of the upgrade, from the objects' own times: the daemons' pull events, the
# SidecarSet's CreatedImagePullJob event, each pod's kruise.io/sidecarset-hash annotation (when the
# SidecarSet patched it), its sidecar's startedAt and the kubelet's Pulled event for it ("already
# present on machine", or "Successfully pulled" when the kubelet had to pull it itself).
kubectl -n shop get pods -l app=web -o json >"$obs/pods.json"
events
jq -nr --arg image "$new_image" --argjson t0 "$t0" --argjson nodes "$nodes" \
  --slurpfile pods "$obs/pods.json" --slurpfile events "$obs/events.json" "$jq_defs"'
  def at: ago | (" " * (5 - length)) + .;
  def short: sub("^registry.example.com/infra/"; "");
  ($events[0] | [pulls | select(.image == $image and .at >= 0)]) as $pulls
  | ($pulls | map(select(.ok)) | group_by(.node) | map(min_by(.at))) as $daemon
  | [$events[0].items[] | select(.reason == "CreatedImagePullJob" and .regarding.kind == "SidecarSet"
      and .regarding.name == "log-agent" and (.note | contains($image)))
     | {at: (.eventTime // .deprecatedLastTimestamp | t), note}] as $created
  | ($created | map(.at) | min) as $job_created
  | [$pods[0].items[] | . as $p
      | ([$events[0].items[] | select(.reason == "Pulled" and .regarding.name == $p.metadata.name
          and .regarding.fieldPath == "spec.containers{log-agent}" and (.note | contains("\"" + $image + "\"")))]
         | sort_by(.deprecatedLastTimestamp // .eventTime) | last) as $event
      | {pod: $p.metadata.name, node: $p.spec.nodeName,
         patched: ($p.metadata.annotations["kruise.io/sidecarset-hash"] // "{}" | fromjson | .["log-agent"].updateTimestamp | t),
         started: ([$p.status.containerStatuses[]? | select(.name == "log-agent") | .state.running.startedAt] | first | t),
         present: ($event.note // "" | test("already present")),
         pulled: (if $event and ($event.note | test("already present") | not)
                  then ($event.deprecatedLastTimestamp // $event.eventTime | t) else null end),
         kubelet: ($event.note // "no Pulled event" | sub(" Image size: .*"; "") | sub(" and can be accessed by the pod"; ""))}] as $pods
  # Per node, who brought the new image: the kubelet pulls only what its node lacks.
  | ([$pods[] | .node] + [$daemon[] | .node] | unique | map(. as $node
      | ($daemon | map(select(.node == $node)) | first) as $d
      | ([$pods[] | select(.node == $node and .pulled != null)] | min_by(.pulled)) as $k
      | {node: $node, daemon: $d, kubelet: $k,
         patched: [$pods[] | select(.node == $node) | .patched] | sort,
         by: (if $k then "kubelet" elif $d then "daemon" else "none" end)})) as $by_node
  # The pods patched once pre-download had started, on the nodes whose daemon pulled the image:
  # each must have been patched after that pull, and its kubelet found the image there.
  | [$pods[] | select($job_created != null and .patched != null and .patched >= $job_created)
      | . as $p | ($daemon | map(select(.node == $p.node)) | first) as $d | select($d)
      | select(($d.at <= $p.patched and $p.present) | not)
      | "\($p.pod) on \($p.node) was patched at \($p.patched | ago), its node'"'"'s daemon pulled the image at \($d.at | ago), and the kubelet said: \($p.kubelet)"] as $violations
  | ($by_node | map(select(.by == "daemon")) | length) as $predownloaded
  | "    pre-download: " + (if ($created | length) == 0 then "no job created"
        else ($created | map("\(.at | ago) \(.note)") | join("; ")) end),
    "    timeline (seconds after the SidecarSet'"'"'s patch, in whole seconds as the API has them):",
    # Within a second: a pod is patched before its kubelet pulls, and after the daemon of its node
    # pulled, unless the kubelet pulled there first (the daemon then finds the image).
    ($by_node | map(select(.by == "kubelet") | .node)) as $kubelet_nodes
    | ([($daemon[] | {at, o: (.node as $n | if any($kubelet_nodes[]; . == $n) then 2.5 else 0 end), what: "node \(.node): its daemon pulled \($image | short) (in \(.took), job \(.job))"}),
      ($pulls[] | select(.ok | not) | {at, o: 0, what: "node \(.node): its daemon FAILED to pull \($image | short): \(.note)"}),
      ($pods[] | select(.pulled) | {at: .pulled, o: 2, what: "node \(.node): the kubelet pulled \($image | short) itself, for \(.pod)"}),
      ($pods[] | select(.patched) | {at: .patched, o: 1, what: "pod \(.pod) on \(.node): patched by the SidecarSet to \($image | short)"}),
      ($pods[] | select(.started) | {at: .started, o: 3, what: "pod \(.pod) on \(.node): log-agent restarted; the kubelet: \(.kubelet)"})]
     | sort_by(.at, .o)[] | "      \(.at | at)  \(.what)"),
    "    per node, who brought \($image | short):",
    ($by_node[] | "      \(.node): " + (if .by == "daemon" then "its daemon'"'"'s pre-download, at \(.daemon.at | ago); its pod(s) patched at \(.patched | map(ago) | join(", "))"
        elif .by == "kubelet" then "the kubelet, for \(.kubelet.pod) at \(.kubelet.pulled | ago), the first pod upgraded here"
          + (if .daemon then " (its daemon'"'"'s pre-download came after, at \(.daemon.at | ago))" else " (its daemon did not pull it)" end)
        else "nobody (no pod here moved to it)" end)),
    (if $nodes == 1 then "    one node: the first pod upgraded (the canary) had the kubelet pull the image onto the only node before pre-download started; NODES=3 shows pre-download"
     else empty end),
    ($violations[] | "    NOT PRE-DOWNLOADED: \(.)"),
    "PREDOWNLOAD \($predownloaded) \($violations | length)"
' >"$obs/story.txt"
grep -v '^PREDOWNLOAD ' "$obs/story.txt" >&2
read -r _ predownloaded violations < <(grep '^PREDOWNLOAD ' "$obs/story.txt")
# With n nodes and the pods spread, the canary's node is the only one the kubelet pulls on.
if (( violations > 0 || predownloaded < nodes - 1 )); then
  echo "    pre-download did not do what the demo says: $predownloaded node(s) pre-downloaded (expected $(( nodes - 1 ))), $violations pod(s) patched before their node had the image" >&2
  finished=false
fi

say "the ImagePullJobs and ImageListPullJobs (the examples'; the SidecarSet's pre-download jobs are gone once nothing is left to pull)"
kubectl get imagepulljobs,imagelistpulljobs -A >&2
echo "    (no example ImageListPullJob: examples/ holds none)" >&2
say "the SidecarSets (mesh-proxy, examples/sidecarset-v1alpha1.yaml, selects mesh=enabled pods in namespace payments: the demo runs none, so it matches 0)"
kubectl get sidecarsets >&2
echo "    the demo took $(( $(date +%s) - demo_t0 )) s" >&2

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
