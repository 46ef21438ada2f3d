#!/usr/bin/env bash
# Upstream OpenKruise's own end-to-end specs for the kinds kruise-rs serves, run unmodified against
# kruise-rs (`make test-upstream UPSTREAM_SRC=DIR`): upstream's `test/e2e` built from a checkout
# kept outside this repository (tests/upstream/build.sh), a real cluster of NODES nodes
# (tests/cluster/start.sh, default 3, as upstream's CI has three workers), kruise-rs installed with
# its chart (values below, as upstream's CI configures its manager), the images the specs name
# served from the loopback registry through containerd's registry hosts for docker.io and
# registry.k8s.io (stand-ins: tests/upstream/images.sh), then ginkgo's focus on the SidecarSet,
# SidecarResourcesPolicy, PullImage and PullImages specs of both API versions.
#
# Prints one line per spec (state, seconds, API version, name) and a summary; writes ginkgo's JSON
# and JUnit reports and the summary as Markdown into KRUISE_RS_UPSTREAM_OUT (default
# /tmp/kruise-rs-upstream-results). Fails when any spec failed.
#
# Usage: tests/upstream/run.sh                     (needs root, like tests/cluster/e2e.sh)
# Env: UPSTREAM_SRC    a git clone of https://github.com/openkruise/kruise (required)
#      UPSTREAM_REF    its tag or commit to build (default v1.9.0)
#      UPSTREAM_FOCUS  ginkgo focus regexp (default: the four kinds' specs)
#      UPSTREAM_SKIP   ginkgo skip regexp (default: kinds kruise-rs does not serve)
#      UPSTREAM_HELM_ARGS  more helm arguments for the install
#      UPSTREAM_PROCS  parallel ginkgo processes (default 4; the specs mostly wait on pods)
#      NODES           nodes of the cluster (default 3)
#      KRUISE_RS_UPSTREAM_KEEP=1  leave the cluster running (stop: tests/cluster/stop.sh STATE_DIR)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
die() { echo "run.sh: $*" >&2; exit 1; }
src=${UPSTREAM_SRC:?UPSTREAM_SRC=DIR: a git clone of https://github.com/openkruise/kruise}
ref=${UPSTREAM_REF:-v1.9.0}
# What upstream's CI focuses for these kinds (.github/workflows/e2e-*.yaml); "SidecarSet" also
# names a PodUnavailableBudget spec and the SidecarTerminator, kinds kruise-rs does not serve.
focus=${UPSTREAM_FOCUS:-SidecarSet|SidecarResourcesPolicy|PullImage|PullImages}
skip=${UPSTREAM_SKIP:-SidecarTerminator|ContainerPriority|PodUnavailableBudget}
out=${KRUISE_RS_UPSTREAM_OUT:-/tmp/kruise-rs-upstream-results}
procs=${UPSTREAM_PROCS:-4}
t0=$(date +%s)

e2e_test=$("$here/build.sh" "$src" "$ref")
standins=$("$here/images.sh")
export KRUISE_RS_IMAGE_PROFILE=${KRUISE_RS_IMAGE_PROFILE:-dev}
product=$(tests/cluster/image.sh)
helm=$(tests/deploy/build-helm.sh)

state=$(mktemp -d /tmp/kruise-rs-upstream.XXXXXX)
keep=${KRUISE_RS_UPSTREAM_KEEP:-}
finish() {
  if [[ -n $keep ]]; then
    echo "run.sh: cluster left running in $state (tests/cluster/stop.sh $state stops it)" >&2
    return
  fi
  tests/cluster/stop.sh "$state" || true
  rm -rf "$state"
}
trap finish EXIT
trap 'exit 130' INT TERM HUP
owner=()
[[ -n $keep ]] || owner=(--owner-pid $$)
NODES=${NODES:-3} tests/cluster/start.sh "${owner[@]}" "$state" >/dev/null
env_var() { sed -n "s/^$1=//p" "$state/env"; }
netns=$(env_var NETNS)
kubeconfig=$(env_var KUBECONFIG)
registry=$(env_var REGISTRY)
certs_d=$(env_var CERTS_D)
in_net() { nsenter --net="$netns" "$@"; }
kubectl() { in_net "$(dirname "$kubeconfig")/bin/kubectl" --kubeconfig="$kubeconfig" "$@"; }

# --- images ------------------------------------------------------------------------------------
# docker.io and registry.k8s.io resolve to the loopback registry and nowhere else (the server
# itself, not a mirror with a fallback); invalid.registry.k8s.io stays unknown, as the specs want.
for host in docker.io registry.k8s.io; do
  mkdir -p "$certs_d/$host"
  cat >"$certs_d/$host/hosts.toml" <<TOML
server = "http://$registry"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
  skip_verify = true
TOML
done
push() { in_net skopeo copy -q --dest-tls-verify=false "$1" "docker://$registry/$2"; }
while read -r tag reference; do
  push "oci:$standins:$tag" "${reference#*/}" || die "pushing the stand-in for $reference failed"
done < <("$here/images.sh" --refs)
push "$product" kruise-rs/kruise-rs:upstream-e2e || die "pushing the product image failed"

# --- kruise-rs ---------------------------------------------------------------------------------
# The chart's defaults, but for what upstream's CI turns on (its manager runs with
# AllAlpha=true,AllBeta=true): the SidecarSetUpgradable condition written on every upgrade, and
# the SidecarSetPatchPodMetadataDefaultsAllowed gate. Pre-download stays on, as users get it.
# UPSTREAM_HELM_ARGS adds more (e.g. "--set manager.sidecarsetPredownload=false").
values=(
  --set "image.repository=$registry/kruise-rs/kruise-rs" --set image.tag=upstream-e2e
  --set manager.sidecarsetUpgradableConditionOnUpgrade=true
  --set manager.sidecarsetPatchPodMetadataDefaultsAllowed=true
)
read -r -a extra_values <<<"${UPSTREAM_HELM_ARGS:-}"
in_net "$helm" install kruise-rs deploy/chart/kruise-rs --kubeconfig "$kubeconfig" \
  "${values[@]}" "${extra_values[@]}" >/dev/null || die "helm install failed"
kubectl -n kruise-system rollout status deployment/kruise-rs-manager --timeout=180s >&2
kubectl -n kruise-system rollout status daemonset/kruise-rs-daemon --timeout=180s >&2
# The PullImage specs count NodeImages against Nodes in their first step.
nodes=$(kubectl get nodes -o name | wc -l)
deadline=$(( $(date +%s) + 120 ))
until [[ $(kubectl get nodeimages -o name 2>/dev/null | wc -l) -eq $nodes ]]; do
  (( $(date +%s) < deadline )) || die "not one NodeImage per Node ($nodes) within 120 s"
  sleep 1
done
echo "run.sh: kruise-rs installed on $nodes nodes in $(( $(date +%s) - t0 )) s; running upstream's specs" >&2

# --- the specs ---------------------------------------------------------------------------------
mkdir -p "$out"
rc=0
# In parallel processes, as upstream's CI runs them (`ginkgo -p`); the specs marked Serial (the
# PullImage ones) run alone at the end.
in_net env KUBECONFIG="$kubeconfig" "$(dirname "$e2e_test")/ginkgo" run \
  --procs="$procs" --focus="$focus" --skip="$skip" --timeout=4h -v --no-color \
  --output-dir="$out" --json-report=report.json --junit-report=junit.xml \
  "$e2e_test" >"$out/e2e.log" 2>&1 || rc=$?
python3 "$here/summary.py" "$out/report.json" "$ref" "$nodes" >"$out/summary.md" ||
  die "no report from the specs (exit $rc); their output: $out/e2e.log"
cat "$out/summary.md"
echo "run.sh: upstream's specs ran in $(( $(date +%s) - t0 )) s in all; output, reports: $out" >&2
exit "$rc"
