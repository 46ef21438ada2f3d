#!/usr/bin/env bash
# Build the control-plane binaries the integration tests run (kube-apiserver, kubectl, etcd) from
# the Go module proxy, into a cache keyed by version outside the repository. A second run with the
# binaries present does nothing.
#
# Usage: tests/controlplane/build.sh          prints the directory holding the binaries
# Env:   KRUISE_RS_CACHE (default ~/.cache/kruise-rs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}

# The versions are whatever the wrapper modules require; `go mod tidy` may list them in any block.
module_version() { awk -v m="$2" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$1"; }
k8s_version=$(module_version "$here/k8s/go.mod" k8s.io/kubernetes)
etcd_version=$(module_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)
[[ -n $k8s_version && -n $etcd_version ]] || { echo "build.sh: cannot read versions from go.mod" >&2; exit 1; }
out="$cache/bin/k8s-$k8s_version-etcd-$etcd_version"

if [[ -x $out/kube-apiserver && -x $out/kubectl && -x $out/etcd ]]; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: Go >= 1.26 is needed to build kube-apiserver and etcd" >&2; exit 1; }
mkdir -p "$out.partial"

# Version stamping, as Kubernetes' hack/lib/version.sh does, so /version and kubectl report v1.36.x.
minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w"
for kv in "gitVersion=$k8s_version" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" "buildDate=1970-01-01T00:00:00Z"; do
  ldflags="$ldflags -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done

echo "building kube-apiserver and kubectl $k8s_version (first run only; ~15 min on 2 cores)" >&2
(cd "$here/k8s" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out.partial/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl) >&2
echo "building etcd $etcd_version" >&2
(cd "$here/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.partial/etcd" \
  go.etcd.io/etcd/server/v3) >&2

rm -rf "$out" && mv "$out.partial" "$out"
"$out/kube-apiserver" --version >&2
"$out/etcd" --version >&2
echo "$out"
