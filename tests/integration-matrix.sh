#!/usr/bin/env bash
# The integration suite (`cargo test --test integration`) against each Kubernetes version of the
# matrix `make test` covers, one run after the other, each with a control plane of its own
# (tests/controlplane/start.sh, through the test harness). Every run goes to the end; the script
# fails when any run failed, after a summary of all of them.
#
# Usage: tests/integration-matrix.sh             run the matrix
#        tests/integration-matrix.sh --runs 2,3  run only these runs of it (numbered from 1: `make
#                                                test` runs them beside the real-node tests,
#                                                tests/cluster/e2e.sh)
#        tests/integration-matrix.sh --versions  print the Kubernetes minors it needs (one a line;
#                                                tests/setup.sh builds them)
# Env:   CARGO_TEST_FLAGS  flags for every `cargo test` (default --locked)
#        KRUISE_RS_TEST_THREADS  tests each run runs at once (default 4)
#
# One run of one version: make test-integration KUBE_VERSION=1.33 [KRUISE_RS_APISERVER_ARGS=...]
set -euo pipefail
cd "$(dirname "$0")/.."

# The extra runs leave out the modules whose tests never depend on the Kubernetes version: they
# run no apiserver at all, or exercise only this repository's files and the node's containerd.
#   helm::        helm lint/template against the chart, no cluster
#   node_infra::  the node harness (registries, containerd, CRI proxy), no apiserver
extra_skip="--skip helm:: --skip node_infra::"
# The fault suite (a control plane of its own, two minutes of faults and kills) runs once, in the
# first run: on two cores it would add about three minutes to each run, against CI's budget.
#   faults::      the manager through a misbehaving proxy, killed, apiserver and etcd restarted
# So does the switch runbook played from deploy/README.md (30 s; cutover:: covers the CRD
# switch on both versions):
#   runbook::

# The WatchList-off run: 1.33 ships the gate off, so its run already takes every watch through
# list-then-watch; on 1.36 only the modules about how watches list and relist run again (the
# detection, the webhook's cache and lists, leader changes and restarts, a rollout and the jobs),
# about 60 s instead of 220 s of CI's budget. Of watch_lists:: only the detection test: the
# others start gate-off control planes of their own, and run 1 runs them.
watch_list_modules="watch_lists::detection_matches_the_suite_control_plane webhook_cache_lag:: leader_election:: manager:: sidecarset_upgrade:: imagepulljob::"

# KUBE_VERSION | KRUISE_RS_APISERVER_ARGS | libtest arguments (filters, --skip)
runs=(
  "1.36||"
  "1.33||$extra_skip --skip faults:: --skip runbook::"
  "1.36|--feature-gates=WatchList=false|$watch_list_modules"
)

if [[ ${1:-} == --versions ]]; then
  for run in "${runs[@]}"; do echo "${run%%|*}"; done | sort -u
  exit 0
fi
usage="usage: integration-matrix.sh [--runs N[,N...] | --versions]"
selected=
if [[ ${1:-} == --runs ]]; then
  [[ ${2:-} =~ ^[1-9](,[1-9])*$ ]] || { echo "$usage" >&2; exit 2; }
  selected=,$2,
  shift 2
fi
[[ $# -eq 0 ]] || { echo "$usage" >&2; exit 2; }
for n in ${selected//,/ }; do
  ((n <= ${#runs[@]})) || { echo "integration-matrix.sh: no run $n (the matrix has ${#runs[@]})" >&2; exit 2; }
done

# The runs are about the local control planes: a KUBECONFIG would point every run at one cluster
# (`make test-integration` still uses it when set).
if [[ -n ${KUBECONFIG:-} ]]; then
  echo "integration-matrix.sh: ignoring KUBECONFIG=$KUBECONFIG, each run starts its own control plane" >&2
  unset KUBECONFIG
fi
read -r -a cargo_flags <<<"${CARGO_TEST_FLAGS:---locked}"
# The tests mostly wait on the apiserver, the manager and the fault schedules, so four at once
# is faster than libtest's one per core (2 cores: the 1.36 run 352 s with 2, 199-241 s with 4;
# 1.33 222 s and 133-174 s). Eight at once kept the CPU busy throughout (CI at c6951f7: 0 %
# idle, the 1.36 run 263 s) and left nothing for the real-node tests `make test` runs them
# beside. Running several at once is also how tests that depend on the others were found
# (docs/testing.md#kubernetes-versions), and how a job completed before its NodeImages reached
# the manager was (decision 0048).
threads=(--test-threads="${KRUISE_RS_TEST_THREADS:-4}")
# Each run's output is kept so that the reasons of failures can be repeated after the summary: a
# CI log is often read from its end, where run 1's failures would otherwise be far above.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
summary=()
failed=0
n=0
for run in "${runs[@]}"; do
  IFS='|' read -r version api_args test_args <<<"$run"
  n=$((n + 1))
  [[ -z $selected || $selected == *,$n,* ]] || { summary+=(""); continue; }
  read -r -a args <<<"$test_args"
  label="KUBE_VERSION=$version${api_args:+ KRUISE_RS_APISERVER_ARGS=$api_args}"
  printf '\n==> integration run %d/%d: %s, cargo test %s --test integration -- %s\n' \
    "$n" "${#runs[@]}" "$label" "${cargo_flags[*]}" "${threads[*]} ${args[*]}" >&2
  start=$(date +%s)
  rc=0
  KUBE_VERSION=$version KRUISE_RS_APISERVER_ARGS=$api_args \
    cargo test "${cargo_flags[@]}" --test integration -- "${threads[@]}" "${args[@]}" 2>&1 \
    | tee "$logs/$n.log" || rc=$?
  secs=$(($(date +%s) - start))
  if ((rc == 0)); then result=passed; else result="FAILED (exit $rc)"; failed=1; fi
  summary+=("$(printf '  %d. %-17s %4d s  %s' "$n" "$result" "$secs" "$label")")
done

# failure_excerpt LOG: libtest's "failures:" section of LOG (each failed test's output and panic),
# at most its first 20 and last 150 lines.
failure_excerpt() {
  awk '/^failures:$/ {on = 1} on {print} /^test result:/ {on = 0}' "$1" \
    | awk -v head=20 -v tail=150 '
        {line[NR] = $0}
        END {
          for (i = 1; i <= NR; i++)
            if (i <= head || i > NR - tail) print line[i]
            else if (i == head + 1) printf "    [... %d lines left out ...]\n", NR - head - tail
        }'
}
n=0
for run in "${runs[@]}"; do
  n=$((n + 1))
  if [[ ${summary[n - 1]} == *FAILED* ]]; then
    printf '\n==> why integration run %d failed (%s):\n' "$n" "${run%%|*}" >&2
    failure_excerpt "$logs/$n.log" >&2
  fi
done

printf '\n==> integration matrix:\n' >&2
for line in "${summary[@]}"; do [[ -z $line ]] || printf '%s\n' "$line" >&2; done
exit "$failed"
