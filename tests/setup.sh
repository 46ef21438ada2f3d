#!/usr/bin/env bash
# Installs what `make test` and `make run` need on a fresh Debian machine that already has Rust
# and Go: missing apt packages, then the Go-built control-plane binaries of every Kubernetes
# version the tests run (cached by version under ~/.cache/kruise-rs, so only the first run pays
# the build, minutes per version) and the node tests' images (cached by content, built offline in
# well under a second).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

missing=()
for tool in openssl:openssl curl:curl python3:python3 jq:jq setsid:util-linux; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
# The node tests (tests/node): containerd + runc pulling through CRI from docker registries,
# test images built with umoci from static busybox and pushed with skopeo, htpasswd for the
# auth registry; protoc builds the CRI bindings (k8s-cri). None of them starts a daemon.
# The real node (tests/cluster) adds the CNI plugins and iproute2 (network namespaces).
for pkg in containerd runc docker-registry skopeo umoci busybox-static protobuf-compiler apache2-utils \
  containernetworking-plugins iproute2; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
for tool in cargo go; do
  command -v "$tool" >/dev/null || { echo "setup: $tool is required (Rust stable, Go >= 1.26)" >&2; exit 1; }
done
# Every Kubernetes minor the integration matrix of `make test` runs (tests/integration-matrix.sh),
# plus KUBE_VERSION when set (for `make test-integration KUBE_VERSION=...`).
for version in $({ "$here/integration-matrix.sh" --versions; [[ -z ${KUBE_VERSION:-} ]] || echo "$KUBE_VERSION"; } | sort -u); do
  KUBE_VERSION=$version "$here/controlplane/build.sh" >/dev/null
done
# kubelet, kube-scheduler and kube-controller-manager for the real node (tests/cluster), of the
# default version only (minutes on the first run, ~2 min with the apiserver's Go cache warm).
"$here/controlplane/build.sh" node >/dev/null
# containerd 2 for the real node and the daemon's containerd-2 tests, from its Go module (~1 min).
"$here/node/build-containerd.sh" >/dev/null
"$here/node/images.sh" >/dev/null
# helm for the chart tests (tests/integration/helm.rs), from its Go module, cached by version.
"$here/deploy/build-helm.sh" >/dev/null
