#!/usr/bin/env bash
# Build the node tests' container images offline with umoci from the static /bin/busybox, as OCI
# layouts, into a cache keyed by content (this script and the busybox binary), so only the first
# run builds them (~2 s); later runs print the cached directory at once.
#
# Usage: tests/node/images.sh     prints the OCI layout directory; tags in it:
#   v1  busybox, entrypoint `/bin/busybox sleep 3600`
#   v2  v1 + one more layer holding /etc/kruise-rs-variant ("v2"): a distinct digest, shared base
#   v3  v1 + one more layer holding /etc/kruise-rs-variant ("v3")
#   pause  v1's layer running `/bin/busybox sleep infinity`: the CRI sandbox ("pause") image, which
#          must outlive any test (v1's `sleep 3600` would end a real kubelet's pods after an hour)
# Push one with: skopeo copy --dest-tls-verify=false oci:LAYOUT:v1 docker://127.0.0.1:PORT/repo:tag
# Env: KRUISE_RS_CACHE (default ~/.cache/kruise-rs)
set -euo pipefail
die() { echo "images.sh: $*" >&2; exit 1; }
for tool in umoci sha256sum flock; do command -v "$tool" >/dev/null || die "$tool is missing (tests/setup.sh installs it)"; done
busybox=/bin/busybox
[[ -x $busybox ]] || die "$busybox is missing (apt-get install busybox-static)"
# A dynamically linked busybox would not run inside the image.
if command -v file >/dev/null && file -L "$busybox" | grep -q 'dynamically linked'; then
  die "$busybox is dynamically linked; the images need busybox-static"
fi

cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}/node-images
key=$(cat "$0" "$busybox" | sha256sum | cut -c1-16)
out=$cache/$key
if [[ -f $out/index.json ]]; then echo "$out"; exit 0; fi

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9 # another test process may be building the same images
if [[ -f $out/index.json ]]; then echo "$out"; exit 0; fi

t0=$(date +%s.%N)
tmp=$cache/.partial-$key-$$
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
{
  mkdir -p "$tmp/files"
  umoci init --layout "$tmp/oci"
  umoci new --image "$tmp/oci:v1"
  umoci insert --image "$tmp/oci:v1" "$busybox" /bin/busybox
  umoci config --image "$tmp/oci:v1" --config.entrypoint=/bin/busybox --config.cmd=sleep \
    --config.cmd=3600 --config.workingdir=/ --author=kruise-rs-tests
  for variant in v2 v3; do
    umoci tag --image "$tmp/oci:v1" "$variant"
    echo "$variant" >"$tmp/files/$variant"
    umoci insert --image "$tmp/oci:$variant" "$tmp/files/$variant" /etc/kruise-rs-variant
  done
  umoci tag --image "$tmp/oci:v1" pause
  umoci config --image "$tmp/oci:pause" --config.cmd=sleep --config.cmd=infinity
  umoci gc --layout "$tmp/oci"
} >&2 || die "building the images with umoci failed"
rm -rf "$out"
mv "$tmp/oci" "$out"
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "images.sh: built test images v1 v2 v3 pause into $out in ${elapsed}s" >&2
echo "$out"
