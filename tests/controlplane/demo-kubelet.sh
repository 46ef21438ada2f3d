#!/usr/bin/env bash
# The `make run` demo's stand-ins for what a real cluster has and the local control plane does
# not: a kubelet for the demo pods and a node daemon for the demo nodes. Each mode loops once a
# second until killed. Needs kubectl and jq.
#
# Usage: tests/controlplane/demo-kubelet.sh kubelet NAMESPACE
#          Plays the kubelet for every pod of NAMESPACE with spec.nodeName set: reports it Running,
#          every container running its spec image (image, a fake stable imageID) and ready, and
#          Ready/ContainersReady True. A container whose spec image changed (the SidecarSet
#          controller's in-place upgrade) is reported running the new image, one restart more.
#        tests/controlplane/demo-kubelet.sh daemon [NODE...]
#          Plays the node daemon for every NodeImage except those of NODE... (where a real daemon
#          runs): a tag the ImagePullJob controller asks for is reported Pulling, then Succeeded
#          on the next pass.
# Env: KUBECTL (default kubectl), KUBECONFIG.
set -uo pipefail
kubectl() { "${KUBECTL:-kubectl}" "$@"; }

# The jq definition of a fake digest reference: <repository>@sha256:<sha256 of the image string>.
image_id() {
  local image=$1 repo=${1%%@*}
  [[ ${repo##*/} == *:* ]] && repo=${repo%:*}
  printf '%s@sha256:%s' "$repo" "$(printf '%s' "$image" | sha256sum | cut -d' ' -f1)"
}

kubelet_pass() {
  local ns=$1 now
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  # One line per pod needing a report: name, then name=image=restarts for each container.
  kubectl -n "$ns" get pods -o json | jq -r '
    .items[] | select(.spec.nodeName != null and .metadata.deletionTimestamp == null)
    | . as $p
    | ([.status.containerStatuses[]? | {key: .name, value: .}] | from_entries) as $st
    | [.spec.containers[] | {name, image, st: $st[.name]}] as $cs
    | select(($p.status.phase != "Running")
             or ([$cs[] | select(.st == null or .st.image != .image or (.st.ready | not))] | length > 0))
    | [$p.metadata.name] + [$cs[] | "\(.name)=\(.image)=\(
        if .st == null then 0 elif .st.image != .image then .st.restartCount + 1 else .st.restartCount end)"]
    | @tsv' |
  while IFS=$'\t' read -r pod containers; do
    local statuses=() c name image restarts
    for c in $containers; do
      IFS='=' read -r name image restarts <<<"$c"
      statuses+=("$(jq -cn --arg n "$name" --arg i "$image" --arg id "$(image_id "$image")" \
        --argjson r "$restarts" --arg t "$now" \
        '{name:$n, image:$i, imageID:$id, containerID:"fake://\($n)/\($r)", ready:true,
          started:true, restartCount:$r, state:{running:{startedAt:$t}}}')")
    done
    local patch
    patch=$(jq -cn --arg t "$now" --argjson cs "$(printf '%s\n' "${statuses[@]}" | jq -cs .)" '
      {status: {phase: "Running", startTime: $t, hostIP: "127.0.0.1", podIP: "127.0.0.1",
        containerStatuses: $cs,
        conditions: [ {type:"PodScheduled", status:"True", lastTransitionTime:$t},
                      {type:"Initialized", status:"True", lastTransitionTime:$t},
                      {type:"ContainersReady", status:"True", lastTransitionTime:$t},
                      {type:"Ready", status:"True", lastTransitionTime:$t} ]}}')
    # Strategic merge: conditions merge by type, so the controller's own conditions stay.
    kubectl -n "$ns" patch pod "$pod" --subresource=status --type=strategic -p "$patch" >/dev/null 2>&1 || true
  done
}

daemon_pass() {
  local skip now node patch
  skip=$(printf '%s\n' "$@" | jq -R . | jq -cs .)
  now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  kubectl get nodeimages -o json | jq -r --argjson skip "$skip" --arg t "$now" '
    .items[] | select(.metadata.name as $n | $skip | index($n) | not)
    | . as $ni
    | [ (.spec.images // {}) | to_entries[] | .key as $img
        | ([.value.tags[]? | . as $tag
            | ([$ni.status.imageStatuses[$img].tags[]? | select(.tag == $tag.tag)] | first) as $s
            | if $s != null and $s.version == ($tag.version // 0) and $s.phase == "Succeeded" then $s
              elif $s != null and $s.version == ($tag.version // 0) and $s.phase == "Pulling" then
                {tag: $tag.tag, version: ($tag.version // 0), phase: "Succeeded",
                 progress: 100, completionTime: $t}
              else {tag: $tag.tag, version: ($tag.version // 0), phase: "Pulling", progress: 0}
              end]) as $tags
        | select($tags != ($ni.status.imageStatuses[$img].tags // []))
        | {key: $img, value: {tags: $tags}} ] as $changed
    | select($changed | length > 0)
    | [.metadata.name, ({metadata: {resourceVersion: .metadata.resourceVersion},
                          status: {imageStatuses: ($changed | from_entries)}} | tojson)]
    | @tsv' 2>/dev/null |
  while IFS=$'\t' read -r node patch; do
    kubectl patch nodeimage "$node" --subresource=status --type=merge -p "$patch" >/dev/null 2>&1 || true
  done
}

mode=${1:?usage: demo-kubelet.sh kubelet NAMESPACE | daemon [NODE...]}
shift
case $mode in
  kubelet) ns=${1:?namespace}; while true; do kubelet_pass "$ns"; sleep 1; done ;;
  daemon) while true; do daemon_pass "$@"; sleep 1; done ;;
  *) echo "demo-kubelet.sh: unknown mode $mode" >&2; exit 2 ;;
esac
