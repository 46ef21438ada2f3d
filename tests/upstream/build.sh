#!/usr/bin/env bash
# Build upstream OpenKruise's end-to-end suite (`test/e2e` of openkruise/kruise) as a test binary,
# from a git checkout kept outside this repository, into a cache keyed by the commit. Nothing of
# upstream's is copied here: the sources are `git archive`d from the checkout into the cache, and
# its Go dependencies come from the Go module proxy (which refuses the kruise module itself, so the
# checkout is the only source of it). A second run for the same commit does nothing.
#
# Usage: tests/upstream/build.sh UPSTREAM_SRC [REF]   prints the path of the e2e.test binary;
#                                                      the ginkgo CLI is beside it
#   UPSTREAM_SRC  a git clone of https://github.com/openkruise/kruise (bare or not)
#   REF           tag or commit (default v1.9.0)
# Env: KRUISE_RS_CACHE (default ~/.cache/kruise-rs)
set -euo pipefail
die() { echo "build.sh: $*" >&2; exit 1; }
[[ $# -ge 1 && $# -le 2 ]] || die "usage: build.sh UPSTREAM_SRC [REF]"
src=$1
ref=${2:-v1.9.0}
git -C "$src" rev-parse --git-dir >/dev/null 2>&1 || die "$src is not a git checkout of openkruise/kruise"
commit=$(git -C "$src" rev-parse --verify --quiet "$ref^{commit}") ||
  die "$src has no $ref (git -C $src fetch --tags)"
git -C "$src" cat-file -e "$commit:test/e2e/e2e_test.go" 2>/dev/null ||
  die "$ref in $src has no test/e2e/e2e_test.go: not openkruise/kruise?"

cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}/upstream-e2e
out=$cache/$commit
built() { [[ -x $out/e2e.test && -x $out/ginkgo ]]; }
if built; then echo "$out/e2e.test"; exit 0; fi
command -v go >/dev/null || die "Go is needed to build upstream's e2e suite"
mkdir -p "$cache"
exec 9>"$cache/$commit.lock"
flock 9
if built; then echo "$out/e2e.test"; exit 0; fi

t0=$(date +%s)
work=$cache/.partial-$commit
rm -rf "$work"
mkdir -p "$work/src"
git -C "$src" archive "$commit" | tar -x -C "$work/src"
# -mod=mod: the proxy serves every dependency go.sum names; upstream keeps no vendor directory.
(cd "$work/src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go test -c -o "$work/e2e.test" ./test/e2e) >&2 ||
  die "go test -c ./test/e2e failed (see above)"
# The ginkgo CLI upstream's go.mod names, which runs the binary's specs in parallel processes as
# upstream's CI does (tools/hack/run-kruise-e2e-test.sh: `ginkgo -p`).
ginkgo_version=$(awk '$1 == "github.com/onsi/ginkgo/v2" && $2 ~ /^v/ { print $2; exit }' "$work/src/go.mod")
[[ -n $ginkgo_version ]] || die "$ref's go.mod names no github.com/onsi/ginkgo/v2"
GOBIN=$work GOFLAGS= go install "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo_version" >&2 ||
  die "go install ginkgo@$ginkgo_version failed (see above)"
rm -rf "$out"
mkdir -p "$out"
mv "$work/e2e.test" "$work/ginkgo" "$out/"
echo "$ref ($commit)" >"$out/VERSION"
rm -rf "$work"
echo "build.sh: built upstream's e2e suite at $ref ($commit) in $(( $(date +%s) - t0 )) s" >&2
echo "$out/e2e.test"
