#!/usr/bin/env bash
# Installs what `make test` and `make run` need on a fresh Debian machine that already has Rust
# and Go: missing apt packages, then the Go-built control-plane binaries (cached by version
# under ~/.cache/kruise-rs, so only the first run pays the ~5-20 min build).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

missing=()
for tool in openssl:openssl curl:curl python3:python3 setsid:util-linux; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
for tool in cargo go; do
  command -v "$tool" >/dev/null || { echo "setup: $tool is required (Rust stable, Go >= 1.26)" >&2; exit 1; }
done
"$here/controlplane/build.sh" >/dev/null
