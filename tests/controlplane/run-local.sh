#!/usr/bin/env bash
# `make run`: the whole system on its embedded default. Starts a loopback-only control plane
# (the one the integration tests use), installs the CRDs, applies examples/ and runs the manager
# in the foreground. Ctrl-C stops the manager; the control plane goes with it.
#
# Env: KRUISE_RS_PROBE_ADDR    where the manager serves /healthz, /readyz, /metrics (127.0.0.1:8080)
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
kubectl apply -f examples/ >&2
# The example SidecarSet patches a pod annotation: allow it, as upstream's whitelist does.
kubectl create namespace kruise-system >&2
kubectl -n kruise-system create configmap kruise-configuration >&2 \
  --from-literal=SidecarSet_PatchPodMetadata_WhiteList='{"rules":[{"allowedAnnotationKeyExprs":["^log-agent\\.example\\.com/"]}]}'

cat >&2 <<MSG

kruise-rs is running against a local control plane. In another shell:
  export KUBECONFIG=$kubeconfig
  $state/bin/kubectl get sidecarsets,imagepulljobs,nodeimages -A
Probes and metrics: http://${KRUISE_RS_PROBE_ADDR:-127.0.0.1:8080}/readyz and /metrics
Webhooks (sidecar injection, defaulting, validation): https://${KRUISE_RS_WEBHOOK_ADDR:-127.0.0.1:9443}
Ctrl-C stops the manager and the control plane.

MSG
export KRUISE_RS_PROBE_ADDR=${KRUISE_RS_PROBE_ADDR:-127.0.0.1:8080}
webhook_addr=${KRUISE_RS_WEBHOOK_ADDR:-127.0.0.1:9443}
exec cargo run --quiet -- manager --kubeconfig "$kubeconfig" \
  --webhook-addr "$webhook_addr" --webhook-url "https://$webhook_addr"
