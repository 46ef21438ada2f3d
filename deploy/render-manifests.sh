#!/usr/bin/env bash
# Renders the plain manifests (deploy/manifests/) from the Helm chart: `helm template` with the
# chart's default values, one file per template as helm writes them (documents in helm's install
# order), helm's `# Source:` comments replaced by a header naming the template, plus the CRDs as
# byte-for-byte copies of crds/ (01-*.yaml). The output directory is replaced as a whole: every
# file in it is generated. `make manifests` runs this; tests/integration/helm.rs runs it into a
# temporary directory and fails when the committed files differ.
#
# Usage: deploy/render-manifests.sh [OUT_DIR]   (default: deploy/manifests)
# Env:   HELM  the helm binary (default: the one tests/deploy/build-helm.sh builds from its Go
#              module on first use and caches under ~/.cache/kruise-rs)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/deploy/manifests}
helm=${HELM:-$("$root/tests/deploy/build-helm.sh")}
chart=$root/deploy/chart/kruise-rs

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A throwaway helm home: the rendering must not depend on the user's helm configuration.
HELM_CACHE_HOME=$work/home/cache HELM_CONFIG_HOME=$work/home/config HELM_DATA_HOME=$work/home/data \
  "$helm" template kruise-rs "$chart" --namespace kruise-system --output-dir "$work/rendered" >/dev/null

mkdir -p "$work/manifests"
for rendered in "$work/rendered/kruise-rs/templates/"*.yaml; do
  name=$(basename "$rendered")
  {
    echo "# Rendered from deploy/chart/kruise-rs/templates/$name by \`make manifests\` (helm template,"
    echo "# default values); edit the chart, not this file. Apply the whole directory, server-side:"
    echo "#   kubectl apply --server-side -f deploy/manifests/"
    awk -v source="# Source: kruise-rs/templates/$name" '$0 != source' "$rendered"
  } >"$work/manifests/$name"
done
for crd in "$root/crds/"*.yaml; do
  cp "$crd" "$work/manifests/01-$(basename "$crd")"
done

mkdir -p "$out"
rm -f "$out"/*.yaml
cp "$work/manifests/"*.yaml "$out/"
