# shellcheck shell=bash disable=SC2154,SC2034  # globals are set and read by the sourcing script
# What the two `make run` demos print and wait on (sourced, not run): the played one
# (tests/controlplane/run-local.sh) and the one on real nodes (tests/cluster/demo.sh). The caller
# defines `kubectl` and sets t0 (the step's start, epoch seconds), demo_timeout (seconds a step
# may take) and finished=true; demo_log, when set, is a log whose last lines explain a step that
# did not finish.

say() { printf '\n==> %s\n' "$*" >&2; }

# progress: one look at the example SidecarSet (its counts and the conditions a rollout shows)
# and every ImagePullJob (nodes succeeded of those desired, the nodes it names, done).
progress() {
  local set jobs
  set=$(kubectl get sidecarset log-agent -o json | jq -r '.status as $s |
    "matched \($s.matchedPods // 0) updated \($s.updatedPods // 0) ready \($s.readyPods // 0) updatedReady \($s.updatedReadyPods // 0)"
    + ([$s.conditions[]? | select(.type == "RolloutHeld" or .type == "ImagePreDownload")
        | " | \(.type)=\(.status)\(if .reason then " (\(.reason))" else "" end)"] | join(""))') || true
  jobs=$(kubectl get imagepulljobs -A -o json | jq -r '[.items[] |
    "\(.metadata.name) \(.status.succeeded // 0)/\(.status.desired // 0)"
    + (if .spec.selector.names then " of \(.spec.selector.names | join(","))" else "" end)
    + (if .status.completionTime then " done" else "" end)] | join(", ")') || true
  printf '    [%3ss] log-agent: %s\n           jobs: %s\n' "$(( $(date +%s) - t0 ))" "$set" "${jobs:-none}" >&2
}

# watch_until CONDITION...: progress every second until CONDITION holds, at most demo_timeout
# seconds; a step that does not finish is reported and marks the demo unfinished.
watch_until() {
  local deadline=$(( $(date +%s) + demo_timeout ))
  while true; do
    progress
    if "$@"; then return 0; fi
    (( $(date +%s) < deadline )) || break
    sleep 1
  done
  echo "    (still not finished after ${demo_timeout}s)" >&2
  if [[ -n ${demo_log:-} ]]; then
    echo "    (the last lines of $demo_log:)" >&2
    tail -n 25 "$demo_log" | sed 's/^/      /' >&2
  fi
  finished=false
}

# rollout_done IMAGE: the example SidecarSet's sidecar is IMAGE and its three pods run it, ready.
rollout_done() {
  kubectl get sidecarset log-agent -o json | jq -e --arg img "$1" '
    (.spec.containers[0].image == $img) and (.status.observedGeneration == .metadata.generation)
    and (.status.matchedPods == 3) and (.status.updatedReadyPods == 3)' >/dev/null
}
