#!/usr/bin/env bash
# Build helm (helm.sh/helm/v3/cmd/helm) for the chart tests (tests/integration/helm.rs) from the
# Go module proxy, into the cache tests/controlplane/build.sh uses, keyed by version. A second
# run with the binary present does nothing.
#
# Usage: tests/deploy/build-helm.sh          prints the path of the helm binary
#        tests/deploy/build-helm.sh --check  prints it only if already built (exit 1 otherwise)
# Env:   KRUISE_RS_CACHE (default ~/.cache/kruise-rs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}

# The versions are whatever the wrapper module requires; `go mod tidy` may list them in any block.
module_version() { awk -v m="$2" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$1"; }
helm_version=$(module_version "$here/helm/go.mod" helm.sh/helm/v3)
k8s_modules=$(module_version "$here/helm/go.mod" k8s.io/client-go)
[[ -n $helm_version && -n $k8s_modules ]] || { echo "build-helm.sh: cannot read versions from go.mod" >&2; exit 1; }
out="$cache/bin/helm-$helm_version"

if [[ -x $out/helm ]]; then
  echo "$out/helm"
  exit 0
fi
if [[ ${1:-} == --check ]]; then
  echo "build-helm.sh: $out/helm is not built; run tests/deploy/build-helm.sh (or tests/setup.sh)" >&2
  exit 1
fi
command -v go >/dev/null || { echo "build-helm.sh: Go >= 1.26 is needed to build helm" >&2; exit 1; }
mkdir -p "$out.partial"

# Version stamping, as helm's Makefile does: `helm version` reports the tag, and the default
# Capabilities.KubeVersion follows the k8s.io modules it is built with (v0.37 -> v1.37).
k8s_minor=$(echo "$k8s_modules" | cut -d. -f2)
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in lint/rules chartutil; do
  ldflags="$ldflags -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMinor=$k8s_minor"
done

echo "building helm $helm_version (first run only; ~2-4 min on 2 cores)" >&2
(cd "$here/helm" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out.partial/helm" \
  helm.sh/helm/v3/cmd/helm) >&2

rm -rf "$out" && mv "$out.partial" "$out"
"$out/helm" version >&2
echo "$out/helm"
