#!/usr/bin/env bash
# Build the product image without Docker, laid out like the Dockerfile's final stage (distroless
# static nonroot + /usr/local/bin/kruise-rs and kruise-rs-daemon), as an OCI layout a real kubelet can run once pushed.
# The musl target is not installable here, so the release binary is glibc-dynamic: the image also
# holds exactly the shared libraries `ldd` reports, at the paths the loader looks them up.
# The layout is cached under a key of its contents (this script, the binaries, those libraries and
# the CA bundle): the first run spends minutes in the release build (lto=fat, codegen-units=1),
# later runs only cargo's no-op check and print the cached layout at once.
# `--profile dev` packs the debug binaries instead (symbols stripped): the one the tests already
# built, so it costs nothing; `make test` uses it to stay in CI's time budget
# (docs/decisions/0002-e2e-image-from-the-dev-build.md).
#
# Usage: tests/cluster/image.sh [--profile release|dev] [--push REGISTRY/REPO:TAG]
#   Prints one line on stdout, `oci:<layout dir>:latest` (a skopeo source). With --push, also
#   copies it to docker://REGISTRY/REPO:TAG over plain HTTP (the test registries on loopback)
#   and prints the pushed manifest's digest to stderr. Progress and errors go to stderr.
# Env: KRUISE_RS_CACHE (default ~/.cache/kruise-rs)
set -euo pipefail
die() { echo "image.sh: $*" >&2; exit 1; }

push=""
profile=${KRUISE_RS_IMAGE_PROFILE:-release}
while [[ $# -gt 0 ]]; do
  case $1 in
    --push) push=${2:?--push needs REGISTRY/REPO:TAG}; shift 2 ;;
    --profile) profile=${2:?--profile needs release or dev}; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0" >&2; exit 0 ;;
    *) die "unknown argument $1 (usage: image.sh [--profile release|dev] [--push REGISTRY/REPO:TAG])" ;;
  esac
done
for tool in cargo umoci jq sha256sum flock; do
  command -v "$tool" >/dev/null || die "$tool is missing (tests/setup.sh installs it)"
done
[[ -z $push ]] || command -v skopeo >/dev/null || die "skopeo is missing (tests/setup.sh installs it)"
script=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/../.."

# cargo holds its own lock on the target dir, so concurrent runs simply wait for one build.
target_dir=$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)
case $profile in
  release)
    echo "image.sh: cargo build --release (minutes when the binary is out of date)" >&2
    cargo build --release --locked --bin kruise-rs >&2 || die "cargo build --release failed"
    # The daemon as the Dockerfile builds it: the size-optimized profile.
    cargo build --profile release-daemon --locked --bin kruise-rs-daemon >&2 \
      || die "cargo build --profile release-daemon failed"
    bin=$target_dir/release/kruise-rs
    daemon_bin=$target_dir/release-daemon/kruise-rs-daemon
    ;;
  dev)
    cargo build --locked --bin kruise-rs --bin kruise-rs-daemon >&2 || die "cargo build failed"
    # Without their debug info: a sixth of the size, and the image has no debugger anyway.
    mkdir -p "$target_dir/image-dev"
    for name in kruise-rs kruise-rs-daemon; do
      strip -o "$target_dir/image-dev/$name" "$target_dir/debug/$name" || die "strip failed"
    done
    bin=$target_dir/image-dev/kruise-rs
    daemon_bin=$target_dir/image-dev/kruise-rs-daemon
    ;;
  *) die "--profile $profile: release or dev" ;;
esac
version=$(cargo metadata --format-version 1 --no-deps | jq -r '.packages[] | select(.name == "kruise-rs") | .version')
[[ -x $bin && -x $daemon_bin ]] || die "$bin or $daemon_bin was not built"

# Every absolute path ldd lists: the `=> /path` of each library and the loader's own line.
# The vDSO has no path and is skipped. Both binaries link the same libraries; the union is taken.
# One ldd per binary: given two, ldd heads each list with the binary's own path.
linked() { ldd "$bin"; ldd "$daemon_bin"; }
mapfile -t libs < <(linked | awk '$2 == "=>" { print $3; next } $1 ~ /^\// { print $1 }' | sort -u)
if linked | grep -q 'not found'; then die "ldd: a library is not found"; fi
((${#libs[@]} > 0)) || die "ldd $bin lists no libraries (a static binary needs no change here)"
certs=/etc/ssl/certs/ca-certificates.crt
[[ -f $certs ]] || { echo "image.sh: $certs is missing; the image gets no CA bundle" >&2; certs=""; }

cache=${KRUISE_RS_CACHE:-$HOME/.cache/kruise-rs}/product-image
key=$(cat "$script" "$bin" "$daemon_bin" "${libs[@]}" ${certs:+"$certs"} | sha256sum | cut -c1-16)
out=$cache/$key
ref=oci:$out:latest

build() {
  tmp=$cache/.partial-$key-$$ # global: the EXIT trap removes it
  local root=$tmp/root
  rm -rf "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$root"/{etc/ssl/certs,tmp,home/nonroot,usr/local/bin}
  install -m 0755 "$bin" "$root/usr/local/bin/kruise-rs"
  install -m 0755 "$daemon_bin" "$root/usr/local/bin/kruise-rs-daemon"
  # Real files, not the host's symlinks (/lib64/ld-linux-x86-64.so.2 links into /lib on Debian).
  for lib in "${libs[@]}"; do install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"; done
  [[ -z $certs ]] || install -m 0644 "$certs" "$root/etc/ssl/certs/ca-certificates.crt"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$root/etc/group"
  chmod 0644 "$root/etc/passwd" "$root/etc/group"
  find "$root" -type d -exec chmod 0755 {} +
  chmod 1777 "$root/tmp"
  # One layer, written with tar rather than `umoci insert` (which keeps the host's owners):
  # everything root-owned, then /home/nonroot appended owned by 65532. This needs no root and
  # the fixed mtime and order keep the layer's digest stable.
  local opts=(--numeric-owner --sort=name --mtime=@0 --format=gnu -C "$root")
  tar "${opts[@]}" --owner=0 --group=0 --exclude=./home/nonroot -cf "$tmp/layer.tar" .
  tar "${opts[@]}" --owner=65532 --group=65532 --no-recursion -rf "$tmp/layer.tar" ./home/nonroot
  {
    umoci init --layout "$tmp/oci"
    umoci new --image "$tmp/oci:latest"
    umoci raw add-layer --image "$tmp/oci:latest" --history.created_by="tests/cluster/image.sh" \
      "$tmp/layer.tar"
    umoci config --image "$tmp/oci:latest" --config.user=65532:65532 \
      --config.entrypoint=/usr/local/bin/kruise-rs --config.cmd=manager --config.workingdir=/ \
      --config.label=org.opencontainers.image.version="$version" \
      --manifest.annotation=org.opencontainers.image.version="$version"
    umoci gc --layout "$tmp/oci"
  } >&2 || die "building the image with umoci failed"

  # Prove the binaries run inside the image root: unpack what was built (not the staging dir)
  # and run it chrooted as the image's user, so a missing library, a wrong loader path or an
  # unreadable file fails here, not in a pod. Without root, a user namespace stands in.
  local check=$tmp/check run=(chroot --userspec=65532:65532) unpack=()
  if ((EUID != 0)); then run=(unshare --map-root-user chroot); unpack=(--rootless); fi
  umoci raw unpack "${unpack[@]}" --image "$tmp/oci:latest" "$check" >&2 \
    || die "unpacking the built image failed"
  local got
  got=$("${run[@]}" "$check" /usr/local/bin/kruise-rs --version 2>&1) \
    || die "kruise-rs does not run in its image root: $got"
  [[ $got == "kruise-rs $version" ]] || die "kruise-rs --version in its image root said: $got"
  local daemon_got
  daemon_got=$("${run[@]}" "$check" /usr/local/bin/kruise-rs-daemon --version 2>&1) \
    || die "kruise-rs-daemon does not run in its image root: $daemon_got"
  [[ $daemon_got == "kruise-rs-daemon $version" ]] \
    || die "kruise-rs-daemon --version in its image root said: $daemon_got"
  rm -rf "$out"
  mv "$tmp/oci" "$out"
  echo "image.sh: built $ref ($got, $(stat -c %s "$tmp/layer.tar") bytes uncompressed)" >&2
}

if [[ ! -f $out/index.json ]]; then
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9 # another run may be building the same image
  [[ -f $out/index.json ]] || build
fi

if [[ -n $push ]]; then
  digest=$(mktemp)
  skopeo copy --dest-tls-verify=false --digestfile "$digest" "$ref" "docker://$push" >&2 \
    || { rm -f "$digest"; die "pushing to $push failed"; }
  echo "image.sh: pushed $push@$(cat "$digest")" >&2
  rm -f "$digest"
fi
echo "$ref"
