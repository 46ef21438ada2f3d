#!/usr/bin/env bash
# Run a command inside the network namespace of a cluster started by tests/cluster/start.sh, with
# KUBECONFIG set to its admin kubeconfig: the apiserver, the registry and the pods' addresses are
# only reachable from there. E.g. tests/cluster/exec.sh STATE_DIR kubectl get pods -A
#
# Usage: tests/cluster/exec.sh STATE_DIR CMD [ARG...]
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: exec.sh STATE_DIR CMD [ARG...]" >&2; exit 1; }
env_file=$1/env
[[ -f $env_file ]] || { echo "exec.sh: $env_file is missing: is a cluster running there (tests/cluster/start.sh)?" >&2; exit 1; }
shift
netns=$(sed -n 's/^NETNS=//p' "$env_file")
kubeconfig=$(sed -n 's/^KUBECONFIG=//p' "$env_file")
bin=$(readlink -f "$(dirname "$kubeconfig")/bin")
PATH=$bin:$PATH KUBECONFIG=$kubeconfig exec nsenter --net="$netns" "$@"
