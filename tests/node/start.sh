#!/usr/bin/env bash
# Start a throw-away, loopback-only node environment for the node-daemon tests: two docker
# registries (one open, one with htpasswd auth) and a containerd with the CRI plugin that pulls
# from both over plain HTTP. Every listener is on 127.0.0.1 with a free port (never 5000).
#
# Usage: tests/node/start.sh [--owner-pid PID] STATE_DIR
#   Prints KEY=VALUE lines on stdout (also written to STATE_DIR/env):
#     REGISTRY, AUTH_REGISTRY            127.0.0.1:PORT of the open / the htpasswd registry
#     REGISTRY_LOG, AUTH_REGISTRY_LOG    their logs; the access-log lines
#                                        ("HEAD /v2/<repo>/manifests/<tag> HTTP/1.1" 200 ...)
#                                        show what containerd fetched
#     REGISTRY_PID, AUTH_REGISTRY_PID
#     AUTH_USER, AUTH_PASSWORD           the auth registry's generated account
#     CONTAINERD_SOCKET, CONTAINERD_PID, CONTAINERD_CONFIG, CONTAINERD_LOG, CONTAINERD_ROOT
#     CERTS_D                            containerd's registry config_path (a hosts.toml per
#                                        registry); give it to tests/node/containerd.sh for more
#     IMAGES                             OCI layout with the test images v1 v2 v3 (images.sh)
#     SANDBOX_IMAGE                      images.sh's pause pushed to REGISTRY, containerd's CRI
#                                        pause image
#     STATE_DIR
#   Progress and errors go to stderr. With --owner-pid, a detached watchdog stops everything and
#   removes STATE_DIR once PID is gone, so a test binary that crashes or is killed still leaves
#   nothing running.
# Stop explicitly with tests/node/stop.sh STATE_DIR. Started by hand (no --owner-pid), the
# integration tests reuse it with KRUISE_RS_NODE_ENV=STATE_DIR/env.
# Env: KRUISE_RS_NODE_TIMEOUT  seconds to wait for all of it to be ready (default 60)
#      KRUISE_RS_CACHE         passed through to images.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=start.sh
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

# --- internal mode: the watchdog (started below by this very script, detached) -----------------
if [[ ${1:-} == --watchdog ]]; then
  owner=${2:?owner pid}; starter=${3:?starter pid}; state=${4:?state dir}
  while kill -0 "$owner" 2>/dev/null; do sleep 1; done
  # If the owner died while start.sh was still starting things, let start.sh finish or give up
  # first (it notices the owner is gone), so nothing is launched after the cleanup below.
  while kill -0 "$starter" 2>/dev/null; do sleep 0.2; done
  "$here/stop.sh" "$state" || true
  rm -rf "$state"
  exit 0
fi

owner_pid=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --owner-pid) owner_pid=${2:?--owner-pid needs a PID}; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0" >&2; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $# -eq 1 ]] || die "usage: start.sh [--owner-pid PID] STATE_DIR"
if [[ -n $owner_pid ]]; then
  kill -0 "$owner_pid" 2>/dev/null || die "owner pid $owner_pid is not running"
fi
for tool in docker-registry skopeo htpasswd curl python3 openssl setsid; do
  command -v "$tool" >/dev/null || die "$tool is missing (tests/setup.sh installs it)"
done
mkdir -p "$1"
state=$(cd "$1" && pwd)
timeout=${KRUISE_RS_NODE_TIMEOUT:-60}
deadline=$(( $(date +%s) + timeout ))
t0=$(date +%s.%N)

images=$("$here/images.sh")

pids=$state/pids
: >"$pids"
ok=false
# Anything that makes this script fail after processes were started must not leave them running:
# the caller only gets an error, never a handle to clean up with.
cleanup_on_failure() {
  if [[ $ok != true ]]; then
    "$here/stop.sh" "$state" >&2 || true
    # Keep the logs for whoever reads our error, unless nobody is left to read them.
    if [[ -n $owner_pid ]] && ! owner_alive; then rm -rf "$state"; fi
  fi
}
trap cleanup_on_failure EXIT
trap 'exit 130' INT TERM HUP

# --- watchdog ----------------------------------------------------------------------------------
# Started before anything else, detached: own session and stdio on /dev/null.
if [[ -n $owner_pid ]]; then
  setsid "$here/start.sh" --watchdog "$owner_pid" "$$" "$state" </dev/null >/dev/null 2>&1 &
  echo "watchdog $!" >>"$pids"
fi

# --- registries --------------------------------------------------------------------------------
# registry_answers URL: /v2/ answers 200 (open) or 401 (auth). --noproxy: loopback only, always.
registry_answers() {
  local code
  code=$(curl -s --noproxy '*' -o /dev/null -w '%{http_code}' --max-time 2 "$1") || return 1
  [[ $code == 200 || $code == 401 ]]
}

# start_registry NAME DIR [AUTH_YAML]: sets registry_addr and registry_pid.
start_registry() {
  local name=$1 dir=$2 auth=${3:-} port attempt rc log=$2/registry.log
  mkdir -p "$dir/data"
  for attempt in 1 2 3; do
    port=$(free_ports 1)
    cat >"$dir/config.yml" <<YAML
version: 0.1
log:
  level: info
  formatter: text
  accesslog:
    disabled: false
  fields:
    service: $name
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:$port
  secret: $(openssl rand -hex 16)
  headers:
    X-Content-Type-Options: [nosniff]
health:
  storagedriver:
    enabled: false
$auth
YAML
    launch "$name" "$log" docker-registry serve "$dir/config.yml"
    registry_pid=$launched_pid
    rc=0
    wait_ready "$name" "$registry_pid" "$log" registry_answers "http://127.0.0.1:$port/v2/" || rc=$?
    if [[ $rc -eq 0 ]]; then
      registry_addr=127.0.0.1:$port
      return 0
    fi
    forget_pid "$registry_pid"
    (( attempt < 3 )) || fail "$name could not bind a port after 3 attempts" "$log"
    echo "start.sh: $name port taken, retrying with another port" >&2
  done
}

start_registry registry "$state/registry"
registry=$registry_addr registry_pid_open=$registry_pid

auth_user=kruise-test
auth_password=$(openssl rand -hex 12)
mkdir -p "$state/auth-registry"
htpasswd -Bbn "$auth_user" "$auth_password" >"$state/auth-registry/htpasswd" 2>/dev/null \
  || die "htpasswd failed"
start_registry auth-registry "$state/auth-registry" "auth:
  htpasswd:
    realm: kruise-rs-test
    path: $state/auth-registry/htpasswd"
auth_registry=$registry_addr registry_pid_auth=$registry_pid

# containerd's registry config: plain HTTP to both, never any other host.
certs_d=$state/certs.d
for host in "$registry" "$auth_registry"; do
  mkdir -p "$certs_d/$host"
  cat >"$certs_d/$host/hosts.toml" <<TOML
server = "http://$host"

[host."http://$host"]
  capabilities = ["pull", "resolve", "push"]
  skip_verify = true
TOML
done

# A pause image for RunPodSandbox, so even that would never look for registry.k8s.io.
sandbox_image=$registry/kruise-rs/pause:v1
skopeo copy -q --dest-tls-verify=false "oci:$images:pause" "docker://$sandbox_image" >&2 \
  || fail "pushing $sandbox_image with skopeo failed" "$state/registry/registry.log"

# --- containerd --------------------------------------------------------------------------------
ctrd_out=$(KRUISE_RS_NODE_TIMEOUT=$(( deadline - $(date +%s) > 1 ? deadline - $(date +%s) : 1 )) \
  "$here/containerd.sh" --sandbox-image "$sandbox_image" "$state/ctrd" "$certs_d") \
  || die "starting containerd failed (see above)"
owner_alive || die "owner process $owner_pid is gone; giving up"

ok=true
{
  echo "STATE_DIR=$state"
  echo "REGISTRY=$registry"
  echo "REGISTRY_LOG=$state/registry/registry.log"
  echo "REGISTRY_PID=$registry_pid_open"
  echo "AUTH_REGISTRY=$auth_registry"
  echo "AUTH_REGISTRY_LOG=$state/auth-registry/registry.log"
  echo "AUTH_REGISTRY_PID=$registry_pid_auth"
  echo "AUTH_USER=$auth_user"
  echo "AUTH_PASSWORD=$auth_password"
  echo "$ctrd_out"
  echo "CERTS_D=$certs_d"
  echo "IMAGES=$images"
  echo "SANDBOX_IMAGE=$sandbox_image"
} >"$state/env"
echo "start.sh: node environment ready (registries $registry, $auth_registry; containerd" \
  "$state/ctrd/containerd.sock) in $(elapsed_since "$t0")s" >&2
cat "$state/env"
