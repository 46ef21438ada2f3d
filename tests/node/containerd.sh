#!/usr/bin/env bash
# Start one private containerd (CRI plugin, native snapshotter) for the node tests, everything
# under DIR: config.toml, root/, state/, opt/, containerd.log, the socket and a pid file. No TCP
# listener except the CRI streaming server on 127.0.0.1 (random port). Registries come from
# CERTS_D_DIR/<host:port>/hosts.toml (read at every pull, so hosts added later count too).
#
# Usage: tests/node/containerd.sh [--owner-pid PID] [--sandbox-image REF] DIR CERTS_D_DIR
#   Prints KEY=VALUE lines on stdout: CONTAINERD_SOCKET, CONTAINERD_PID, CONTAINERD_CONFIG,
#   CONTAINERD_LOG, CONTAINERD_ROOT. Progress and errors go to stderr.
#   Running it again on the same DIR after the containerd was stopped or killed starts it again on
#   the same root and state (images pulled before are still there); while it runs, that fails.
#   With --owner-pid, a detached watchdog (one per DIR) stops the containerd once PID is gone.
#   --sandbox-image names the CRI pause image; keep it on a loopback registry (the default is an
#   unreachable loopback reference, so nothing ever reaches out to the internet).
# Stop with tests/node/stop.sh DIR (or SIGTERM to CONTAINERD_PID: a later run starts it again).
# Env: KRUISE_RS_NODE_TIMEOUT  seconds to wait for readiness (default 60)
#      KRUISE_RS_CONTAINERD_BIN  a directory with containerd, containerd-shim-runc-v2 and ctr to
#                                run instead of those on PATH (Debian's 1.6); tests/cluster sets it
#                                to tests/node/build-containerd.sh's 2.x
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=containerd.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

# --- internal mode: the watchdog (started below by this very script, detached) -----------------
if [[ ${1:-} == --watchdog ]]; then
  owner=${2:?owner pid}; starter=${3:?starter pid}; dir=${4:?dir}
  while kill -0 "$owner" 2>/dev/null; do sleep 1; done
  # Let a containerd.sh still starting things finish or give up first (it notices the owner is gone).
  while kill -0 "$starter" 2>/dev/null; do sleep 0.2; done
  "$here/stop.sh" "$dir" || true
  exit 0
fi

owner_pid=""
sandbox_image="127.0.0.1:1/kruise-rs/no-sandbox-image:none"
while [[ $# -gt 0 ]]; do
  case $1 in
    --owner-pid) owner_pid=${2:?--owner-pid needs a PID}; shift 2 ;;
    --sandbox-image) sandbox_image=${2:?--sandbox-image needs an image reference}; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" >&2; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $# -eq 2 ]] || die "usage: containerd.sh [--owner-pid PID] [--sandbox-image REF] DIR CERTS_D_DIR"
if [[ -n $owner_pid ]]; then
  kill -0 "$owner_pid" 2>/dev/null || die "owner pid $owner_pid is not running"
fi
# Absolute paths, so that a restart from the saved command line (tests/cluster/node.sh) runs the
# same binaries, and the shim is the one of this containerd, not the first on PATH.
bin_of() {
  if [[ -n ${KRUISE_RS_CONTAINERD_BIN:-} ]]; then
    [[ -x $KRUISE_RS_CONTAINERD_BIN/$1 ]] || die "$KRUISE_RS_CONTAINERD_BIN/$1 is missing (KRUISE_RS_CONTAINERD_BIN)"
    echo "$KRUISE_RS_CONTAINERD_BIN/$1"
  else
    command -v "$1" || die "$1 is missing (tests/setup.sh installs it)"
  fi
}
containerd_bin=$(bin_of containerd)
shim_bin=$(bin_of containerd-shim-runc-v2)
ctr_bin=$(bin_of ctr)
command -v runc >/dev/null || die "runc is missing (tests/setup.sh installs it)"
mkdir -p "$1" "$2"
dir=$(cd "$1" && pwd)
certs_d=$(cd "$2" && pwd)
socket=$dir/containerd.sock
# sun_path holds 108 bytes; containerd also makes "$socket.ttrpc".
(( ${#socket} < 100 )) || die "socket path $socket is too long for a unix socket (keep DIR short)"
timeout=${KRUISE_RS_NODE_TIMEOUT:-60}
deadline=$(( $(date +%s) + timeout ))
t0=$(date +%s.%N)

pids=$dir/pids
touch "$pids"
if running=$(recorded_pid containerd); then
  die "a containerd already runs on $dir (pid $running)"
fi
while read -r stale; do forget_pid "$stale"; done < <(awk '$1 == "containerd" { print $2 }' "$pids")

config=$dir/config.toml
log=$dir/containerd.log
# Same file on every run; the paths make it private to DIR.
cat >"$config" <<TOML
version = 2
root = "$dir/root"
state = "$dir/state"
# keep everything off the network: no TCP listeners except CRI streaming on loopback
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$socket"

[ttrpc]
  address = ""

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$dir/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$sandbox_image"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    disable_apparmor = true
    # no CAP_SYS_RESOURCE in some sandboxes: negative oom_score_adj (-998 for pods) is refused
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "native"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        runtime_path = "$shim_bin"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$dir/cni"
    [plugins."io.containerd.grpc.v1.cri".registry]
      config_path = "$certs_d"
TOML
# containerd 2's CRI pulls through its transfer service, which unpacks only for the snapshotters
# named here (its default is overlayfs, which the CRI plugin does not use here).
if [[ $("$containerd_bin" --version) == *" v2."* ]]; then
  cat >>"$config" <<TOML
  [plugins."io.containerd.transfer.v1.local"]
    [[plugins."io.containerd.transfer.v1.local".unpack_config]]
      platform = "linux/$(uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')"
      snapshotter = "native"
TOML
fi

ok=false
cleanup_on_failure() {
  if [[ $ok != true ]]; then "$here/stop.sh" "$dir" >&2 || true; fi
}
trap cleanup_on_failure EXIT
trap 'exit 130' INT TERM HUP

# One watchdog per DIR, started before the server (see tests/controlplane/start.sh).
if [[ -n $owner_pid ]] && ! recorded_pid watchdog >/dev/null; then
  setsid "$here/containerd.sh" --watchdog "$owner_pid" "$$" "$dir" </dev/null >/dev/null 2>&1 &
  echo "watchdog $!" >>"$pids"
fi

# A containerd that was killed leaves its sockets behind; the new one would replace them anyway,
# but then "the socket exists" would say nothing about readiness.
rm -f "$socket" "$socket.ttrpc"
echo "---- $script: starting containerd $(date -u +%FT%TZ) ----" >>"$log"
launch containerd "$log" "$containerd_bin" --config "$config"
pid=$launched_pid
wait_ready containerd "$pid" "$log" timeout 5 "$ctr_bin" --address "$socket" version || fail "containerd did not start" "$log"
plugins=$(timeout 10 "$ctr_bin" --address "$socket" plugins ls) || fail "ctr plugins ls failed" "$log"
if ! awk '$1 == "io.containerd.grpc.v1" && $2 == "cri" && $NF == "ok" { found = 1 } END { exit !found }' <<<"$plugins"; then
  echo "$plugins" >&2
  fail "containerd's CRI plugin did not load" "$log"
fi

ok=true
echo "$script: containerd $("$containerd_bin" --version | awk '{print $3}') ready on $socket (pid $pid) in $(elapsed_since "$t0")s" >&2
cat <<OUT
CONTAINERD_SOCKET=$socket
CONTAINERD_PID=$pid
CONTAINERD_CONFIG=$config
CONTAINERD_LOG=$log
CONTAINERD_ROOT=$dir/root
OUT
