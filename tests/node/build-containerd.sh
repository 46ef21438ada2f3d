#!/usr/bin/env bash
# Build containerd 2 (containerd, containerd-shim-runc-v2, ctr) for the real node (tests/cluster)
# from the Go module proxy, into the cache tests/controlplane/build.sh uses, keyed by version. A
# second run with the binaries present does nothing. The node tests (tests/node, the integration
# suite) keep Debian's containerd 1.6, so the daemon is tested against both; kubelet 1.36 wants
# 2.x, and only 1.7 and later report an image's pinned label to the kubelet's image GC.
#
# Usage: tests/node/build-containerd.sh   prints the directory holding the binaries
# Env:   KRUISE_RS_CACHE (default ~/.cache/kruise-rs)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}
die() { echo "build-containerd.sh: $*" >&2; exit 1; }

module=github.com/containerd/containerd/v2
version=$(awk -v m="$module" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$here/containerd2/go.mod")
[[ -n $version ]] || die "cannot read the containerd version from $here/containerd2/go.mod"
out="$cache/bin/containerd-$version"
tools=(containerd containerd-shim-runc-v2 ctr)
built() { for t in "${tools[@]}"; do [[ -x $out/$t ]] || return 1; done; }
if built; then
  echo "$out"
  exit 0
fi
command -v go >/dev/null || die "Go >= 1.26 is needed to build containerd"
mkdir -p "$cache/bin"
# One build at a time (tests/setup.sh and a test run started meanwhile).
exec 9>"$out.lock"
flock 9
if built; then
  echo "$out"
  exit 0
fi
rm -rf "$out.partial"
mkdir -p "$out.partial"
echo "building containerd $version (first run only; ~3-5 min on 2 cores)" >&2
# Static, without the snapshotters that need C libraries (the node uses the native one); the
# version stamp is what `containerd --version` and the CRI's RuntimeVersion report.
ldflags="-s -w -X $module/version.Version=$version -X $module/version.Package=$module"
for t in "${tools[@]}"; do
  (cd "$here/containerd2" && CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "$ldflags" -o "$out.partial/$t" "$module/cmd/$t") >&2
done
rm -rf "$out" && mv "$out.partial" "$out"
"$out/containerd" --version >&2
echo "$out"
