#!/usr/bin/env bash
# Start a throw-away, loopback-only control plane (etcd + kube-apiserver) for the integration tests,
# the way controller-runtime's envtest does: no kubelet, no controller-manager, admin client cert.
#
# Usage: tests/controlplane/start.sh [--owner-pid PID] STATE_DIR
#   Prints exactly one line on stdout: the kubeconfig path (STATE_DIR/kubeconfig). Progress and
#   errors go to stderr. STATE_DIR gets pki/, etcd/, etcd.log, apiserver.log, pids and bin (a link
#   to the directory holding kube-apiserver, kubectl and etcd).
#   With --owner-pid, a detached watchdog stops everything and removes STATE_DIR once PID is gone,
#   so a test binary that crashes or is killed still leaves nothing running.
# Stop explicitly with tests/controlplane/stop.sh STATE_DIR.
# Env: KUBE_VERSION              Kubernetes minor to run (1.33 ... 1.36, default 1.36), passed
#                                through to build.sh, which builds it when it is not cached yet
#      KRUISE_RS_APISERVER_ARGS  extra kube-apiserver flags, split on whitespace and appended last
#                                (so they override the defaults below), e.g.
#                                "--feature-gates=WatchList=false"
#      KRUISE_RS_APISERVER_ADDRESS  where kube-apiserver listens (default 127.0.0.1; tests/cluster
#                                gives 0.0.0.0 inside its own network namespace, so pods reach it)
#      KRUISE_RS_APISERVER_ADVERTISE  the address in the kubernetes Service's endpoints (default
#                                127.0.0.1); also put in the serving certificate
#      KRUISE_RS_APISERVER_PORT  its port (default: a free one; tests/cluster uses 443, the port
#                                of the kubernetes Service, since no kube-proxy translates it)
#      KRUISE_RS_SERVICE_ACCOUNTS=1  keep the ServiceAccount admission plugin on (tests/cluster,
#                                whose controller-manager creates the accounts pods need)
#      KRUISE_RS_CP_TIMEOUT      seconds to wait for readiness (default 120)
#      KRUISE_RS_CACHE           passed through to build.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=start.sh
# shellcheck source-path=SCRIPTDIR source=../lib/processes.sh
source "$here/../lib/processes.sh"  # die, fail, owner_alive, free_ports, launch, wait_ready, forget_pid

# --- internal mode: the watchdog (started below by this very script, detached) -----------------
if [[ ${1:-} == --watchdog ]]; then
  owner=${2:?owner pid}; starter=${3:?starter pid}; state=${4:?state dir}
  # Owner alive <=> kill -0 succeeds. Poll once a second: cheap, and teardown latency stays small.
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
    -h|--help) sed -n '2,18p' "$0" >&2; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) break ;;
  esac
done
[[ $# -eq 1 ]] || die "usage: start.sh [--owner-pid PID] STATE_DIR"
if [[ -n $owner_pid ]]; then
  kill -0 "$owner_pid" 2>/dev/null || die "owner pid $owner_pid is not running"
fi
mkdir -p "$1"
state=$(cd "$1" && pwd)
timeout=${KRUISE_RS_CP_TIMEOUT:-120}
read -r -a extra_api_args <<<"${KRUISE_RS_APISERVER_ARGS:-}"
api_address=${KRUISE_RS_APISERVER_ADDRESS:-127.0.0.1}
api_advertise=${KRUISE_RS_APISERVER_ADVERTISE:-127.0.0.1}
api_fixed_port=${KRUISE_RS_APISERVER_PORT:-}
advertise_san=""
disabled_admission=ServiceAccount
[[ ${KRUISE_RS_SERVICE_ACCOUNTS:-} == 1 ]] && disabled_admission=""
[[ $api_advertise == 127.0.0.1 ]] || advertise_san=",IP:$api_advertise"
t0=$(date +%s.%N)

# build.sh prints the binary directory on stdout (instant when cached); its progress goes to stderr.
bin=$("$here/build.sh")
for b in etcd kube-apiserver kubectl; do [[ -x $bin/$b ]] || die "$bin/$b is missing"; done
ln -sfn "$bin" "$state/bin"

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
# Make INT/TERM/HUP run the EXIT trap too (a caller's Ctrl-C or kill while we wait).
trap 'exit 130' INT TERM HUP

# --- watchdog ----------------------------------------------------------------------------------
# Started before anything else, so even a SIGKILL to the caller's whole process group (this script
# included) in the middle of startup leaves nothing behind. Detached: own session (group signals
# do not reach it) and stdio on /dev/null (it must not hold the caller's pipes open).
if [[ -n $owner_pid ]]; then
  setsid "$here/start.sh" --watchdog "$owner_pid" "$$" "$state" </dev/null >/dev/null 2>&1 &
  echo "watchdog $!" >>"$pids"
fi

# --- PKI ---------------------------------------------------------------------------------------
# ECDSA P-256 keys are small and fast to generate; only the ServiceAccount signing key is RSA.
pki=$state/pki
mkdir -p "$pki"
days=30
ec_key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }
# sign NAME SUBJECT EXTENSIONS: NAME.key/NAME.crt signed by the cluster CA
sign() {
  ec_key "$pki/$1.key"
  openssl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr" 2>/dev/null
  printf '%b' "$3" >"$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -CAserial "$pki/ca.srl" -days "$days" -sha256 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
  rm -f "$pki/$1.csr" "$pki/$1.ext"
}
{
  ec_key "$pki/ca.key"
  openssl req -x509 -new -key "$pki/ca.key" -sha256 -days "$days" -subj "/CN=kruise-rs-test-ca" \
    -out "$pki/ca.crt"
  # Serving cert: loopback plus the in-cluster names and the first IP of --service-cluster-ip-range,
  # so the same cert is valid for anything that reaches the apiserver through the kubernetes Service.
  sign apiserver "/CN=kube-apiserver" \
    "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.0.0.1$advertise_san\n"
  # O=system:masters makes the admin cluster-admin without any RBAC objects.
  sign admin "/CN=admin/O=system:masters" \
    'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n'
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key" 2>/dev/null
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
} >&2 || die "generating the PKI with openssl failed"
chmod 600 "$pki"/*.key

deadline=$(( $(date +%s) + timeout ))

# --- etcd --------------------------------------------------------------------------------------
etcd_log=$state/etcd.log
for attempt in 1 2 3; do
  ports=$(free_ports 2)
  read -r etcd_port peer_port <<<"$ports"
  rm -rf "$state/etcd"
  : >"$etcd_log"  # launch appends; wait_ready reads this attempt's errors only
  launch etcd "$etcd_log" "$bin/etcd" --name=test --data-dir="$state/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="test=http://127.0.0.1:$peer_port" \
    --quota-backend-bytes=$((2 * 1024 * 1024 * 1024)) --log-level=warn \
    --unsafe-no-fsync=true
  etcd_pid=$launched_pid
  rc=0
  wait_ready etcd "$etcd_pid" "$etcd_log" curl -fsS --max-time 2 "http://127.0.0.1:$etcd_port/health" || rc=$?
  [[ $rc -eq 0 ]] && break
  forget_pid "$etcd_pid"
  (( attempt < 3 )) || fail "etcd could not bind its ports after 3 attempts" "$etcd_log"
  echo "start.sh: etcd port taken, retrying with other ports" >&2
done

# --- kube-apiserver ----------------------------------------------------------------------------
api_log=$state/apiserver.log
for attempt in 1 2 3; do
  api_port=${api_fixed_port:-$(free_ports 1)}
  # Loopback only by default: bind and advertise 127.0.0.1 (the latter also avoids needing a
  # default route).
  # ServiceAccount admission is off because no controller-manager creates the default SA
  # (unless KRUISE_RS_SERVICE_ACCOUNTS=1).
  # Priority-and-fairness and profiling are off: less startup work and nothing tests need.
  # On SIGTERM (a restart by the fault tests or the chaos run) it closes its watches within 5 s:
  # by default it leaves them open, and its HTTP server's shutdown waits for them for up to a
  # minute (seen on the real node: ~107 watches of the kubelet, the controllers and kruise-rs
  # held it until the restart's KILL at 20 s; with this, 3 s from TERM to answering again).
  : >"$api_log"
  launch kube-apiserver "$api_log" "$bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --bind-address="$api_address" \
    --advertise-address="$api_advertise" \
    --secure-port="$api_port" \
    --cert-dir="$state/apiserver-certs" \
    --tls-cert-file="$pki/apiserver.crt" \
    --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --service-account-issuer="https://127.0.0.1:$api_port" \
    --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --authorization-mode=RBAC \
    --disable-admission-plugins="$disabled_admission" \
    --enable-admission-plugins=OwnerReferencesPermissionEnforcement \
    --allow-privileged=true \
    --enable-priority-and-fairness=false \
    --profiling=false \
    --shutdown-watch-termination-grace-period=5s \
    --v=1 \
    "${extra_api_args[@]}"
  api_pid=$launched_pid
  rc=0
  # /readyz with the admin cert: does not depend on anonymous auth being allowed.
  wait_ready kube-apiserver "$api_pid" "$api_log" curl -fsS --max-time 5 --cacert "$pki/ca.crt" \
    --cert "$pki/admin.crt" --key "$pki/admin.key" "https://127.0.0.1:$api_port/readyz" || rc=$?
  [[ $rc -eq 0 ]] && break
  forget_pid "$api_pid"
  (( attempt < 3 )) || fail "kube-apiserver could not bind its port after 3 attempts" "$api_log"
  echo "start.sh: apiserver port taken, retrying with another port" >&2
done

# --- kubeconfig --------------------------------------------------------------------------------
# Embedded data, so the file alone is enough (kube-rs, kubectl, copies elsewhere).
b64() { base64 -w0 <"$1"; }
kubeconfig=$state/kubeconfig
umask 077
cat >"$kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: kruise-rs-test
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(b64 "$pki/ca.crt")
users:
- name: admin
  user:
    client-certificate-data: $(b64 "$pki/admin.crt")
    client-key-data: $(b64 "$pki/admin.key")
contexts:
- name: kruise-rs-test
  context: {cluster: kruise-rs-test, user: admin, namespace: default}
current-context: kruise-rs-test
KC

# What is running, from the servers themselves: /version (the stamped release, e.g. v1.33.13).
api_version=$(curl -fsS --max-time 5 --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
  "https://127.0.0.1:$api_port/version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["gitVersion"])') ||
  fail "reading the apiserver's /version failed" "$api_log"
etcd_version=$(curl -fsS --max-time 5 "http://127.0.0.1:$etcd_port/version" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["etcdserver"])') || fail "reading etcd's /version failed" "$etcd_log"

ok=true
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "start.sh: control plane ready on https://127.0.0.1:$api_port (etcd 127.0.0.1:$etcd_port) in ${elapsed}s:" \
  "kube-apiserver $api_version, etcd $etcd_version${KRUISE_RS_APISERVER_ARGS:+, extra apiserver flags: $KRUISE_RS_APISERVER_ARGS}" >&2
echo "$kubeconfig"
