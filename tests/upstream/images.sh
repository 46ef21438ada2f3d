#!/usr/bin/env bash
# Stand-ins for the images upstream's e2e specs name (Kubernetes' e2e busybox, nginx, httpd and
# agnhost, Docker Hub's busybox and nginx, openkruise/hotupgrade-sample), built offline with umoci
# from the static /bin/busybox as one OCI layout, into a cache keyed by content. Each reference
# gets a layer of its own naming it, so every reference has a distinct digest (the specs tell
# images apart), over one shared base layer: busybox with its applets. Each behaves as the image
# it stands for where the specs can tell: busybox's run `sh` and, as PID 1, ignore SIGTERM; the
# nginx and httpd stand-ins serve HTTP on port 80 (busybox httpd) and exit on SIGTERM.
#
# Usage: tests/upstream/images.sh          prints the OCI layout directory
#        tests/upstream/images.sh --refs   prints "TAG REFERENCE" lines: push oci:LAYOUT:TAG to the
#                                          registry as REFERENCE's repository and tag
# Env: KRUISE_RS_CACHE (default ~/.cache/kruise-rs)
set -euo pipefail
die() { echo "images.sh: $*" >&2; exit 1; }

# TAG (in the layout) | KIND (what it runs) | REFERENCE as a spec names it, normalised
refs=(
  "busybox-latest|shell|docker.io/library/busybox:latest"
  "busybox-1.32|shell|docker.io/library/busybox:1.32"
  "busybox-1.34|shell|docker.io/library/busybox:1.34"
  "nginx-1.14.2|http|docker.io/library/nginx:1.14.2"
  "nginx-1.15.1|http|docker.io/library/nginx:1.15.1"
  "nginx-1.19.10|http|docker.io/library/nginx:1.19.10"
  "nginx-1.20|http|docker.io/library/nginx:1.20"
  "nginx-1.20.1|http|docker.io/library/nginx:1.20.1"
  "nginx-1.21|http|docker.io/library/nginx:1.21"
  "nginx-1.21.1|http|docker.io/library/nginx:1.21.1"
  "nginx-1.23.1|http|docker.io/library/nginx:1.23.1"
  "nginx-latest|http|docker.io/library/nginx:latest"
  "hotupgrade-sidecarv1|idle|docker.io/openkruise/hotupgrade-sample:sidecarv1"
  "hotupgrade-sidecarv2|idle|docker.io/openkruise/hotupgrade-sample:sidecarv2"
  "hotupgrade-empty|idle|docker.io/openkruise/hotupgrade-sample:empty"
  "e2e-busybox|shell|registry.k8s.io/e2e-test-images/busybox:1.36.1-1"
  "e2e-nginx|http|registry.k8s.io/e2e-test-images/nginx:1.14-4"
  "e2e-nginx-new|http|registry.k8s.io/e2e-test-images/nginx:1.15-4"
  "e2e-httpd|http|registry.k8s.io/e2e-test-images/httpd:2.4.38-4"
  "e2e-httpd-new|http|registry.k8s.io/e2e-test-images/httpd:2.4.39-4"
  "e2e-agnhost|agnhost|registry.k8s.io/e2e-test-images/agnhost:2.53"
)
if [[ ${1:-} == --refs ]]; then
  for r in "${refs[@]}"; do IFS='|' read -r tag _ ref <<<"$r"; echo "$tag $ref"; done
  exit 0
fi
[[ $# -eq 0 ]] || die "usage: images.sh [--refs]"
for tool in umoci sha256sum flock; do command -v "$tool" >/dev/null || die "$tool is missing (tests/setup.sh installs it)"; done
busybox=/bin/busybox
[[ -x $busybox ]] || die "$busybox is missing (apt-get install busybox-static)"

cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}/upstream-images
key=$(cat "$0" "$busybox" | sha256sum | cut -c1-16)
out=$cache/$key
if [[ -f $out/index.json ]]; then echo "$out"; exit 0; fi
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [[ -f $out/index.json ]]; then echo "$out"; exit 0; fi

t0=$(date +%s)
tmp=$cache/.partial-$key-$$
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
root=$tmp/rootfs
mkdir -p "$root/bin" "$root/usr/bin" "$root/usr/sbin" "$root/sbin" "$root/etc" "$root/tmp" \
  "$root/var/www" "$root/usr/share/nginx/html"
cp "$busybox" "$root/bin/busybox"
# Every applet as a symlink, where busybox would install it.
while read -r applet; do
  [[ -n $applet ]] || continue
  [[ -e $root$applet ]] || ln -s /bin/busybox "$root$applet"
done < <("$busybox" --list-full | sed 's|^|/|')
# Signals as the real images take them, since upstream's specs time their steps by them: busybox
# as PID 1 has no handler for SIGTERM (`sleep`, `tail`, `sh` are its applets: a pod waits out its
# grace period, and an in-place sidecar upgrade takes 30 s), while nginx, httpd, agnhost and the
# hot-upgrade sample exit on it.
cat >"$root/bin/standin-idle" <<'SH'
#!/bin/sh
# The hot-upgrade sample's stand-in: idles until SIGTERM.
trap 'exit 0' TERM INT
/bin/busybox sleep 2147483647 &
wait $!
SH
cat >"$root/bin/standin-http" <<'SH'
#!/bin/sh
# The nginx/httpd stand-in: HTTP on port 80 until SIGTERM.
trap 'exit 0' TERM INT
/bin/busybox httpd -f -p 80 -h /usr/share/nginx/html &
wait $!
SH
cat >"$root/bin/agnhost" <<'SH'
#!/bin/sh
# The agnhost stand-in: its subcommands only idle (or serve HTTP) until SIGTERM.
trap 'exit 0' TERM INT
case ${1:-} in
  netexec|serve-hostname|porter) /bin/busybox httpd -f -p "${2#--http-port=}" 2>/dev/null & ;;
  *) /bin/busybox sleep 2147483647 & ;;
esac
wait $!
SH
chmod 0755 "$root/bin/standin-http" "$root/bin/agnhost" "$root/bin/standin-idle"
echo "kruise-rs stand-in" >"$root/usr/share/nginx/html/index.html"
echo "root:x:0:0:root:/root:/bin/sh" >"$root/etc/passwd"
echo "root:x:0:" >"$root/etc/group"

{
  umoci init --layout "$tmp/oci"
  umoci new --image "$tmp/oci:base"
  umoci insert --image "$tmp/oci:base" "$root" /
  umoci config --image "$tmp/oci:base" --config.workingdir=/ --author=kruise-rs-tests \
    --config.env=PATH=/usr/sbin:/usr/bin:/sbin:/bin
  for r in "${refs[@]}"; do
    IFS='|' read -r tag kind ref <<<"$r"
    umoci tag --image "$tmp/oci:base" "$tag"
    mkdir -p "$tmp/files/$tag"
    echo "$ref" >"$tmp/files/$tag/standin"
    umoci insert --image "$tmp/oci:$tag" "$tmp/files/$tag/standin" /etc/kruise-rs-standin
    case $kind in
      shell) umoci config --image "$tmp/oci:$tag" --config.cmd=sh ;;
      http) umoci config --image "$tmp/oci:$tag" --config.cmd=/bin/standin-http ;;
      idle) umoci config --image "$tmp/oci:$tag" --config.cmd=/bin/standin-idle ;;
      agnhost) umoci config --image "$tmp/oci:$tag" --config.entrypoint=/bin/agnhost ;;
      *) die "unknown kind $kind" ;;
    esac
  done
  umoci rm --image "$tmp/oci:base"
  umoci gc --layout "$tmp/oci"
} >&2 || die "building the stand-in images with umoci failed"
rm -rf "$out"
mv "$tmp/oci" "$out"
echo "images.sh: built ${#refs[@]} stand-in images into $out in $(( $(date +%s) - t0 )) s" >&2
echo "$out"
