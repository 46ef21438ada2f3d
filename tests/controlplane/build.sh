#!/usr/bin/env bash
# Build the control-plane binaries the integration tests run (kube-apiserver, kubectl, etcd) for
# one Kubernetes minor from the Go module proxy, into a cache keyed by version outside the
# repository. A second run with the binaries present does nothing.
#
# Usage: tests/controlplane/build.sh          prints the directory holding the binaries
#        tests/controlplane/build.sh node     the same for kubelet, kube-scheduler and
#                                             kube-controller-manager of that release (a directory
#                                             of its own, built only for tests/cluster)
# Env:   KUBE_VERSION     Kubernetes minor: one of the k8s/<minor>/ wrapper modules (1.33, 1.34,
#                         1.35, 1.36; default 1.36). k8s/<minor>/etcd names the etcd minor, whose
#                         wrapper module is etcd/<that>/. tests/controlplane/pin.sh makes both.
#        KRUISE_RS_CACHE  (default ~/.cache/kruise-rs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}
die() { echo "build.sh: $*" >&2; exit 1; }

kube_minor=${KUBE_VERSION:-1.36}
kube_minor=${kube_minor#v}
k8s_dir=$here/k8s/$kube_minor
if [[ ! -f $k8s_dir/go.mod ]]; then
  known=$(cd "$here/k8s" && ls -d -- */ | tr -d / | paste -sd' ')
  die "KUBE_VERSION=$kube_minor: no wrapper module k8s/$kube_minor (known: $known; add one with pin.sh $kube_minor)"
fi
etcd_dir=$here/etcd/$(cat "$k8s_dir/etcd")
[[ -f $etcd_dir/go.mod ]] || die "$etcd_dir/go.mod is missing (pin.sh etcd $(cat "$k8s_dir/etcd"))"

# The versions are whatever the wrapper modules require; `go mod tidy` may list them in any block.
module_version() { awk -v m="$2" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$1"; }
k8s_version=$(module_version "$k8s_dir/go.mod" k8s.io/kubernetes)
etcd_version=$(module_version "$etcd_dir/go.mod" go.etcd.io/etcd/server/v3)
[[ -n $k8s_version && -n $etcd_version ]] || die "cannot read versions from $k8s_dir/go.mod, $etcd_dir/go.mod"
[[ $k8s_version == "v$kube_minor."* ]] || die "k8s/$kube_minor/go.mod requires k8s.io/kubernetes $k8s_version"
out="$cache/bin/k8s-$k8s_version-etcd-$etcd_version"
node_components=(kubelet kube-scheduler kube-controller-manager)
if [[ ${1:-} == node ]]; then
  out="$cache/bin/k8s-$k8s_version-node"
  built() { [[ -x $out/kubelet && -x $out/kube-scheduler && -x $out/kube-controller-manager ]]; }
else
  built() { [[ -x $out/kube-apiserver && -x $out/kubectl && -x $out/etcd ]]; }
fi
if built; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || die "Go >= 1.26 is needed to build kube-apiserver and etcd"
# One build per version at a time (e.g. tests/setup.sh and a test run started meanwhile): the
# second waits for the first and then finds the binaries.
mkdir -p "$cache/bin"
exec 9>"$out.lock"
flock 9
if built; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial"

# Version stamping, as Kubernetes' hack/lib/version.sh does, so /version and kubectl report e.g. v1.36.3.
minor=$(echo "$k8s_version" | cut -d. -f2)
ldflags="-s -w"
for kv in "gitVersion=$k8s_version" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" "buildDate=1970-01-01T00:00:00Z"; do
  ldflags="$ldflags -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done

if [[ ${1:-} == node ]]; then
  echo "building ${node_components[*]} $k8s_version (first run only; minutes on 2 cores)" >&2
  (cd "$k8s_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out.partial/" \
    "${node_components[@]/#/k8s.io/kubernetes/cmd/}") >&2
  rm -rf "$out" && mv "$out.partial" "$out"
  "$out/kubelet" --version >&2
  echo "$out"
  exit 0
fi
echo "building kube-apiserver and kubectl $k8s_version (first run only; minutes on 2 cores)" >&2
(cd "$k8s_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out.partial/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl) >&2
echo "building etcd $etcd_version" >&2
(cd "$etcd_dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out.partial/etcd" \
  go.etcd.io/etcd/server/v3) >&2

rm -rf "$out" && mv "$out.partial" "$out"
"$out/kube-apiserver" --version >&2
"$out/etcd" --version >&2
echo "$out"
