# The two commands a newcomer needs are `make run` and `make test`; see README.md.
SHELL := /bin/bash
.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-17s %s\n", $$1, $$2}'

deps: ## Install what the tests and the local control plane need (apt packages, Go-built binaries)
	tests/setup.sh

run: deps ## Start a local control plane, install the CRDs, apply examples/ and run the manager
	tests/controlplane/run-local.sh

test: deps ## Everything CI runs: format, lints, unit tests, the integration suite on each Kubernetes version, the end-to-end suite on a real node
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo clippy --test e2e --locked -- -D warnings  # test = false: not in --all-targets
	RUSTDOCFLAGS='-D warnings' cargo doc --locked --no-deps --workspace --lib  # no broken intra-doc links
	cargo test --locked --workspace --lib --bins
	# The integration runs go beside the real-node tests, which mostly wait (tests/cluster/e2e.sh).
	cargo test --locked --test integration --no-run
	KRUISE_RS_E2E_BESIDE_SUITE='tests/integration-matrix.sh --runs 1' \
	KRUISE_RS_E2E_BESIDE_THREE_NODE='tests/integration-matrix.sh --runs 2,3' \
		tests/cluster/e2e.sh

# `make test-e2e TEST=sidecar`: the end-to-end suite on a real one-node cluster (needs root).
test-e2e: deps ## The end-to-end suite on a real node: kubelet, containerd, the chart installed with helm
	tests/cluster/e2e.sh $(TEST)

# `make test-upstream UPSTREAM_SRC=~/src/kruise`: upstream OpenKruise's own e2e specs for the four
# kinds (tag UPSTREAM_REF, default v1.9.0), built from that checkout, on a real three-node cluster
# (docs/testing.md#upstreams-e2e-suite).
test-upstream: deps ## Upstream OpenKruise's e2e specs (SidecarSet, PullImage, PullImages) against kruise-rs on three real nodes
	UPSTREAM_SRC='$(UPSTREAM_SRC)' tests/upstream/run.sh

# `make test-chaos KRUISE_RS_CHAOS_MINUTES=60`: the hour; KRUISE_RS_CHAOS_SEED=<n> replays an order
# of faults (docs/testing.md#the-chaos-run).
test-chaos: deps ## The chaos run on a real node: pods, rollouts and jobs while the manager, its Lease, containerd, the kubelet and the apiserver fail
	tests/cluster/chaos.sh

# `make test-integration KUBE_VERSION=1.33 KRUISE_RS_APISERVER_ARGS=--feature-gates=WatchList=false
# TEST=sidecarset`: one run of the integration suite (TEST: a cargo test filter).
KUBE_VERSION ?= 1.36
test-integration: deps ## The integration suite on one Kubernetes minor (KUBE_VERSION=1.33 ..., default 1.36)
	KUBE_VERSION=$(KUBE_VERSION) KRUISE_RS_APISERVER_ARGS='$(KRUISE_RS_APISERVER_ARGS)' \
		cargo test --locked --test integration -- $(TEST)

# crds/ is the one source of the CRDs; the chart's crds/ and deploy/manifests/01-* are copies,
# and the rest of deploy/manifests/ is the chart rendered (docs/decisions/0008-*).
crds: ## Regenerate crds/ from the Rust types, then everything made from them (make manifests)
	cargo run --quiet -- crds --out-dir crds
	$(MAKE) --no-print-directory manifests

manifests: ## Copy crds/ into the chart, render deploy/manifests/ from it (helm template, default values)
	rm -f deploy/chart/kruise-rs/crds/*.yaml
	cp crds/*.yaml deploy/chart/kruise-rs/crds/
	deploy/render-manifests.sh

fmt: ## Format the code
	cargo fmt --all

.PHONY: help deps run test test-e2e test-upstream test-chaos test-integration crds manifests fmt
