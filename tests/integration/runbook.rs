//! The switch from upstream OpenKruise, played from `deploy/README.md` itself: the test reads the
//! section "Switching from OpenKruise" when it runs, takes its command blocks by the marker before
//! each fence (`<!-- runbook-test: NAME -->`) and runs them with bash (`KUBECONFIG` set, `kubectl`
//! built next to the test's kube-apiserver and `kruise-rs` on `PATH`, the repository's `crds/` and
//! `deploy/` in the working directory), in the runbook's order, against a control plane of its
//! own. After each block the test checks what the block is there to achieve. The page and the
//! test cannot drift apart: a block without a marker, or a marker this test does not know, fails
//! it.
//!
//! The cluster, as upstream 1.9 leaves it (written the way upstream's installer, webhooks and
//! controllers write):
//! - upstream's CRDs of our four kinds (`cutover.rs`'s: ours with upstream's versions, the
//!   SidecarSet conversion webhook, no defaults where upstream's CRDs have none); ImagePullJob and
//!   NodeImage installed at 1.8 first, with one object each stored as `v1alpha1`. SidecarSets
//!   only from 1.9: listing one stored as `v1alpha1` needs upstream's conversion webhook, which
//!   nothing serves here (on a cluster where upstream runs, it does);
//! - upstream's other CRDs, stand-ins with upstream's names, scopes and versions and no schema:
//!   NodePodProbe with one object per Node (upstream 1.9 keeps one per Node); CloneSet,
//!   PodProbeMarker and PodUnavailableBudget empty; Advanced StatefulSet empty and converting
//!   through upstream's webhook;
//! - a SidecarSet, ImagePullJobs, NodeImages, and an ImageListPullJob that is running, with the
//!   two ImagePullJobs upstream's controller made for it (its hash label; the list's template
//!   plus the `imagePullPolicy: IfNotPresent` upstream's ImagePullJob defaulting adds);
//! - upstream's manager: its Lease, held and renewed (`cutover::UpstreamLeader`), its Deployment,
//!   DaemonSet and leading pod as objects (nothing runs them), its webhook configurations,
//!   Service, Secret, RBAC objects and Helm release Secret.
//!
//! Blocks the test does not run, and why:
//! - `step-2-helm`: `helm install` needs helm and a cluster that runs pods; the plain-manifests
//!   block beside it (`step-2-manifests`) installs the same objects and is run.
//! - `step-2-wait`: `kubectl rollout status` waits for pods to run, and this control plane has no
//!   scheduler, controller-manager or kubelet. Stand-in: our manager runs in this process with
//!   the Lease name `step-2-manifests` put into the Deployment's arguments, and the test checks
//!   what the block's last line shows: the Lease still upstream's.
//!
//! Stand-ins in blocks that run:
//! - `step-1-kubectl` runs first, on upstream's CRDs; `step-1-install`, the page's other way to
//!   do step 1, runs after it on the same cluster ("run again, it changes nothing").
//!   `cutover.rs` runs `crds --install` on upstream's CRDs.
//! - `step-4`: when the block scales upstream's Deployment to 0, the test plays the Deployment
//!   controller and the kubelet: upstream's replica stops renewing its Lease, its pod is deleted.
//! - After `step-5`, the test plays the node daemon so that the ImageListPullJob finishes and its
//!   TTL deletes it, as on a cluster whose lists are done: `step-6-crds` then finds the kind
//!   without objects.
//!
//! The Leases here last 4 s, upstream's 15 s: only the test's waits are shorter.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kruise_rs::controllers::ControllerOptions;
use kruise_rs::manager::crds::ensure_installed;
use kruise_rs::manager::leader::DEFAULT_LEASE_NAME;
use kruise_rs::manager::{LeaderElection, ManagerOptions};
use kruise_rs_api::imagelistpulljob::ImageListPullJob;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::CONTROLLER_REVISION_HASH;
use kruise_rs_imagepull::imagelistpulljob::plan::template_hash;
use kruise_rs_sidecar::unsupported;
use kube::api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::cutover::{
    ALPHA, BETA, GROUP, OUR_IDENTITY, TIMEOUT, UPSTREAM_HOLDER, UPSTREAM_LEASE,
    UPSTREAM_LEASE_SECONDS, UPSTREAM_MANAGER, UPSTREAM_NAMESPACE, Upstream, UpstreamLeader,
    create_namespace, create_node, leader_gauge, lease_holder, put_crds, upstream_crds,
};
use crate::sidecarset_upgrade::poll;
use crate::support::{ExtraControlPlane, RunningManager, client_for, start_manager};

const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/README.md");
const SECTION: &str = "## Switching from OpenKruise";
const MARKER: &str = "<!-- runbook-test:";

/// The blocks the test runs.
const RUN: [&str; 12] = [
    "step-0-crds",
    "step-0-kinds",
    "step-0-sidecarsets",
    "step-0-copy",
    "step-1-kubectl",
    "step-1-install",
    "step-2-manifests",
    "step-3",
    "step-4",
    "step-5",
    "step-6-objects",
    "step-6-crds",
];
/// The blocks it does not run (the module documentation says why).
const NOT_RUN: [&str; 2] = ["step-2-helm", "step-2-wait"];

/// The namespace of the jobs and lists.
const JOBS: &str = "runbook-jobs";
const NODES: [&str; 2] = ["node-a", "node-b"];
const LIST: &str = "pull-images";
/// What upstream's FNV-32a hash of the list's template looks like.
const UPSTREAM_HASH: &str = "5c7d9b8f6";
/// The children upstream's ImageListPullJob controller made: name, image.
const CHILDREN: [(&str, &str); 2] = [
    ("pull-images-x7k2p", "127.0.0.1:5000/runbook/app:1"),
    ("pull-images-9q4mz", "127.0.0.1:5000/runbook/tool:1"),
];
const UPSTREAM_POD: &str = "kruise-controller-manager-5d8c7b6f9d-x2x7q";
/// Our four CRDs.
const OURS: [&str; 4] = [
    "imagelistpulljobs.apps.kruise.io",
    "imagepulljobs.apps.kruise.io",
    "nodeimages.apps.kruise.io",
    "sidecarsets.apps.kruise.io",
];

// --- The page ------------------------------------------------------------------------------------

/// The command blocks of the section, by marker. Panics on a fence without a marker, a marker
/// not followed by a `sh` fence, or a marker used twice.
fn runbook_blocks() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(README).unwrap_or_else(|e| panic!("reading {README}: {e}"));
    let start = text
        .find(&format!("\n{SECTION}\n"))
        .unwrap_or_else(|| panic!("{README} has no section {SECTION:?}"))
        + 1;
    let rest = &text[start + SECTION.len()..];
    let section = &rest[..rest.find("\n## ").unwrap_or(rest.len())];
    let mut blocks = BTreeMap::new();
    let mut unmarked = Vec::new();
    let mut pending: Option<String> = None;
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(marker) = line.trim().strip_prefix(MARKER) {
            let name = marker
                .strip_suffix("-->")
                .unwrap_or_else(|| panic!("a marker that does not end in `-->`: {line}"))
                .trim();
            pending = Some(name.to_owned());
            continue;
        }
        if let Some(info) = line.strip_prefix("```") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| !l.starts_with("```"))
                .collect();
            let body = body.join("\n") + "\n";
            match pending.take() {
                Some(name) => {
                    assert_eq!(info, "sh", "block {name} is not a `sh` block");
                    assert!(
                        blocks.insert(name.clone(), body).is_none(),
                        "two blocks are marked {name}"
                    );
                }
                None => unmarked.push(body),
            }
            continue;
        }
        if let Some(name) = &pending {
            panic!("the marker {name} is not right before a fence: {line:?} follows it");
        }
    }
    assert!(
        unmarked.is_empty(),
        "blocks of {SECTION:?} without a `{MARKER} NAME -->` marker (mark each, and run it in \
         this test or say here why not): {unmarked:#?}"
    );
    blocks
}

/// Runs the page's blocks with bash, in a working directory of their own.
struct Shell {
    blocks: BTreeMap<String, String>,
    /// Holds `bin/`, `home/` and `work/`; removed on drop.
    root: tempfile::TempDir,
    kubeconfig: PathBuf,
}

/// What one block did.
struct Ran {
    name: String,
    output: Output,
}

impl Ran {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).into_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    /// Everything it printed, for failure messages.
    fn describe(&self) -> String {
        format!(
            "block {} ({}):\n--- stdout\n{}--- stderr\n{}",
            self.name,
            self.output.status,
            self.stdout(),
            self.stderr()
        )
    }

    /// The block ran through: no command reported an error, nor bash. (A block's exit status
    /// is its last command's, which says little for a loop.)
    fn ok(self) -> Self {
        let errors: Vec<String> = self
            .stderr()
            .lines()
            .filter(|l| ["error", "Error", "bash:"].iter().any(|p| l.starts_with(p)))
            .map(str::to_owned)
            .collect();
        assert!(errors.is_empty(), "{}", self.describe());
        self
    }

    fn lines(&self) -> Vec<String> {
        self.stdout().lines().map(str::to_owned).collect()
    }
}

impl Shell {
    fn new(plane: &ExtraControlPlane) -> Self {
        let blocks = runbook_blocks();
        let known: BTreeSet<&str> = RUN.iter().chain(NOT_RUN.iter()).copied().collect();
        let marked: BTreeSet<&str> = blocks.keys().map(String::as_str).collect();
        assert_eq!(
            marked, known,
            "the page's markers and the blocks this test runs or names differ"
        );
        let root = tempfile::Builder::new()
            .prefix("kruise-rs-runbook-")
            .tempdir()
            .expect("a temporary directory");
        let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
        for dir in ["bin", "home", "work"] {
            std::fs::create_dir(root.path().join(dir)).expect("mkdir");
        }
        let link = |target: &Path, link: PathBuf| {
            std::os::unix::fs::symlink(target, &link)
                .unwrap_or_else(|e| panic!("linking {}: {e}", link.display()));
        };
        link(&plane.kubectl_path(), root.path().join("bin/kubectl"));
        link(
            Path::new(env!("CARGO_BIN_EXE_kruise-rs")),
            root.path().join("bin/kruise-rs"),
        );
        for dir in ["crds", "deploy"] {
            link(&repository.join(dir), root.path().join("work").join(dir));
        }
        Shell {
            blocks,
            root,
            kubeconfig: plane.kubeconfig_path().to_owned(),
        }
    }

    fn work(&self) -> PathBuf {
        self.root.path().join("work")
    }

    /// Runs block `name` as a user pasting it into bash would (no `set -e`).
    async fn run(&self, name: &str) -> Ran {
        assert!(RUN.contains(&name), "{name} is not a block this test runs");
        let script = self.blocks[name].clone();
        let path = std::env::join_paths(std::iter::once(self.root.path().join("bin")).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .expect("a PATH");
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(script)
            .current_dir(self.work())
            .env("PATH", path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.root.path().join("home"))
            .stdin(Stdio::null());
        let output = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .expect("join")
            .expect("bash runs");
        Ran {
            name: name.to_owned(),
            output,
        }
    }
}

// --- The cluster upstream left -------------------------------------------------------------------

fn resource(kind: &str, plural: &str, version: &str) -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: version.to_owned(),
        api_version: format!("{GROUP}/{version}"),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}

fn namespaced(client: &Client, kind: &str, plural: &str, version: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), JOBS, &resource(kind, plural, version))
}

fn cluster_scoped(client: &Client, kind: &str, plural: &str, version: &str) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource(kind, plural, version))
}

async fn create(api: &Api<DynamicObject>, object: Value) -> DynamicObject {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("?")
        .to_owned();
    let object: DynamicObject = serde_json::from_value(object).expect("an object");
    api.create(&Default::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {name}: {e}"))
}

/// A stand-in for one of upstream's other CRDs: its name, scope and versions, any object.
fn other_crd(
    group: &str,
    kind: &str,
    plural: &str,
    namespaced: bool,
    versions: &[&str],
    converting: bool,
) -> CustomResourceDefinition {
    let stored = versions.last().expect("a version");
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| {
            json!({"name": v, "served": true, "storage": v == stored,
                   "schema": {"openAPIV3Schema": {"type": "object",
                       "x-kubernetes-preserve-unknown-fields": true}}})
        })
        .collect();
    let mut crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "names": {"kind": kind, "plural": plural, "listKind": format!("{kind}List"),
                      "singular": kind.to_lowercase()},
            "scope": if namespaced { "Namespaced" } else { "Cluster" },
            "versions": versions,
        },
    });
    if converting {
        crd["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1", "v1beta1"],
            "clientConfig": {"service": {"namespace": "kruise-system",
                "name": "kruise-webhook-service", "path": "/convert", "port": 443}}}});
    }
    serde_json::from_value(crd).expect("a CRD")
}

fn other_crds() -> Vec<CustomResourceDefinition> {
    vec![
        other_crd(
            GROUP,
            "NodePodProbe",
            "nodepodprobes",
            false,
            &[ALPHA],
            false,
        ),
        other_crd(GROUP, "CloneSet", "clonesets", true, &[ALPHA], false),
        other_crd(
            GROUP,
            "PodProbeMarker",
            "podprobemarkers",
            true,
            &[ALPHA],
            false,
        ),
        other_crd(
            "policy.kruise.io",
            "PodUnavailableBudget",
            "podunavailablebudgets",
            true,
            &[ALPHA],
            false,
        ),
        other_crd(
            GROUP,
            "StatefulSet",
            "statefulsets",
            true,
            &[ALPHA, BETA],
            true,
        ),
    ]
}

/// The pull policy upstream's webhooks default on jobs and lists.
fn pull_policy() -> Value {
    json!({"timeoutSeconds": 600, "backoffLimit": 3})
}

/// The list's spec as upstream's webhook stores it: no `imagePullPolicy` (upstream defaults none
/// on a list).
fn list_spec() -> Value {
    json!({
        "images": CHILDREN.iter().map(|(_, image)| *image).collect::<Vec<_>>(),
        "selector": {"names": ["node-a"]},
        "parallelism": 1,
        "completionPolicy": {"type": "Always", "ttlSecondsAfterFinished": 0},
        "pullPolicy": pull_policy(),
    })
}

/// A cold-upgrade SidecarSet as upstream's webhook stores it, with `containers`.
fn sidecarset(name: &str, containers: Value, init_containers: Value) -> Value {
    json!({
        "apiVersion": format!("{GROUP}/{BETA}"),
        "kind": "SidecarSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1, "partition": 0},
            "injectionStrategy": {},
            "containers": containers,
            "initContainers": init_containers,
        },
    })
}

fn sidecar(name: &str, upgrade_strategy: Value) -> Value {
    json!({
        "name": name,
        "image": "127.0.0.1:5000/runbook/sidecar:1",
        "imagePullPolicy": "IfNotPresent",
        "podInjectPolicy": "BeforeAppContainer",
        "upgradeStrategy": upgrade_strategy,
        "shareVolumePolicy": {"type": "disabled"},
        "shareVolumeDevicePolicy": {"type": "disabled"},
    })
}

/// What upstream's 1.8 and 1.9 left of our four kinds, and of its other kinds.
async fn upstream_objects(client: &Client) {
    for namespace in ["kruise-system", "kruise-daemon-config", JOBS] {
        create_namespace(client, namespace).await;
    }
    for node in NODES {
        create_node(client, node).await;
    }
    // 1.8: ImagePullJob and NodeImage stored as v1alpha1 (no SidecarSet: see the module docs).
    let at_1_8: Vec<CustomResourceDefinition> = upstream_crds(Upstream::V1_8)
        .into_iter()
        .filter(|c| ["ImagePullJob", "NodeImage"].contains(&c.spec.names.kind.as_str()))
        .collect();
    put_crds(client, at_1_8).await;
    create(
        &namespaced(client, "ImagePullJob", "imagepulljobs", ALPHA),
        json!({
            "apiVersion": format!("{GROUP}/{ALPHA}"), "kind": "ImagePullJob",
            "metadata": {"name": "old-job", "namespace": JOBS},
            "spec": {"image": "127.0.0.1:5000/runbook/old:1", "selector": {"names": ["node-b"]},
                     "parallelism": 1, "completionPolicy": {"type": "Never"},
                     "pullPolicy": pull_policy(), "imagePullPolicy": "IfNotPresent"},
        }),
    )
    .await;
    let nodeimages = cluster_scoped(client, "NodeImage", "nodeimages", ALPHA);
    create(
        &nodeimages,
        json!({"apiVersion": format!("{GROUP}/{ALPHA}"), "kind": "NodeImage",
               "metadata": {"name": "node-a", "labels": {"zone": "a"}}, "spec": {}}),
    )
    .await;

    // 1.9.
    put_crds(client, upstream_crds(Upstream::V1_9)).await;
    put_crds(client, other_crds()).await;
    let nodeimages = cluster_scoped(client, "NodeImage", "nodeimages", BETA);
    create(
        &nodeimages,
        json!({"apiVersion": format!("{GROUP}/{BETA}"), "kind": "NodeImage",
               "metadata": {"name": "node-b", "labels": {"zone": "a"}}, "spec": {}}),
    )
    .await;
    let probes = cluster_scoped(client, "NodePodProbe", "nodepodprobes", ALPHA);
    for node in NODES {
        create(
            &probes,
            json!({"apiVersion": format!("{GROUP}/{ALPHA}"), "kind": "NodePodProbe",
                   "metadata": {"name": node}, "spec": {}}),
        )
        .await;
    }
    create(
        &cluster_scoped(client, "SidecarSet", "sidecarsets", BETA),
        sidecarset(
            "log-agent",
            json!([sidecar("log-agent", json!({"upgradeType": "ColdUpgrade"}))]),
            json!([]),
        ),
    )
    .await;

    // A list upstream runs, and the jobs upstream's controller made for it.
    let lists = namespaced(client, "ImageListPullJob", "imagelistpulljobs", BETA);
    let list = create(
        &lists,
        json!({
            "apiVersion": format!("{GROUP}/{BETA}"), "kind": "ImageListPullJob",
            "metadata": {"name": LIST, "namespace": JOBS,
                         "labels": {CONTROLLER_REVISION_HASH: UPSTREAM_HASH}},
            "spec": list_spec(),
        }),
    )
    .await;
    let started = Time(Timestamp::now());
    let status = json!({"status": {"startTime": started, "desired": 2, "active": 2,
                                   "completed": 0, "succeeded": 0}});
    lists
        .patch_status(LIST, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("the list's status");
    let jobs = namespaced(client, "ImagePullJob", "imagepulljobs", BETA);
    for (name, image) in CHILDREN {
        let mut spec = list_spec();
        let spec_map = spec.as_object_mut().expect("an object");
        spec_map.remove("images");
        spec_map.insert("image".into(), json!(image));
        spec_map.insert("imagePullPolicy".into(), json!("IfNotPresent"));
        create(
            &jobs,
            json!({
                "apiVersion": format!("{GROUP}/{BETA}"), "kind": "ImagePullJob",
                "metadata": {"name": name, "namespace": JOBS,
                    "labels": {CONTROLLER_REVISION_HASH: UPSTREAM_HASH},
                    "ownerReferences": [{"apiVersion": format!("{GROUP}/{BETA}"),
                        "kind": "ImageListPullJob", "name": LIST, "uid": list.uid(),
                        "controller": true, "blockOwnerDeletion": true}]},
                "spec": spec,
            }),
        )
        .await;
        let status = json!({"status": {"startTime": started, "desired": 1, "active": 1,
                                       "succeeded": 0, "failed": 0}});
        jobs.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("a job's status");
    }
}

/// Upstream's manager and daemon as objects (no controller or kubelet runs them), its webhook
/// configurations (calling its Service, which answers nothing), the rest of what its chart
/// installs that the runbook deletes or keeps, and our own Helm release Secret, which stays.
fn upstream_installation(plane: &ExtraControlPlane) {
    let manager_labels = json!({"control-plane": "controller-manager"});
    let container = json!([{"name": "manager", "image": "openkruise/kruise-manager:v1.9.0"}]);
    let webhook = |name: &str, path: &str| {
        json!([{"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": "Fail",
                "clientConfig": {"service": {"namespace": "kruise-system",
                    "name": "kruise-webhook-service", "path": path}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"]}]}])
    };
    let helm_release = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
               "metadata": {"name": format!("sh.helm.release.v1.{name}.v1"),
                   "namespace": "kruise-system",
                   "labels": {"owner": "helm", "name": name, "status": "deployed",
                              "version": "1"}},
               "data": {"release": ""}})
    };
    let in_system = |kind: &str, api_version: &str, name: &str, extra: Value| {
        let mut object = json!({"apiVersion": api_version, "kind": kind,
                                "metadata": {"name": name, "namespace": "kruise-system"}});
        if let (Some(object), Some(extra)) = (object.as_object_mut(), extra.as_object()) {
            object.extend(extra.clone());
        }
        object
    };
    let items = vec![
        in_system(
            "Deployment",
            "apps/v1",
            "kruise-controller-manager",
            json!({"spec": {"replicas": 2, "selector": {"matchLabels": manager_labels},
                "template": {"metadata": {"labels": manager_labels},
                             "spec": {"containers": container}}}}),
        ),
        in_system(
            "DaemonSet",
            "apps/v1",
            "kruise-daemon",
            json!({"spec": {"selector": {"matchLabels": {"control-plane": "daemon"}},
                "template": {"metadata": {"labels": {"control-plane": "daemon"}},
                             "spec": {"containers": container}}}}),
        ),
        // The leading replica's pod; created before the webhook configurations, which would
        // refuse it (their Service answers nothing).
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": UPSTREAM_POD, "namespace": "kruise-system",
                            "labels": manager_labels},
               "spec": {"containers": container}}),
        in_system(
            "Service",
            "v1",
            "kruise-webhook-service",
            json!({"spec": {"selector": manager_labels,
                            "ports": [{"port": 443, "targetPort": 9876}]}}),
        ),
        in_system("Secret", "v1", "kruise-webhook-certs", json!({})),
        in_system("ServiceAccount", "v1", "kruise-manager", json!({})),
        in_system("ServiceAccount", "v1", "kruise-daemon", json!({})),
        in_system(
            "ConfigMap",
            "v1",
            "kruise-configuration",
            json!({"data": {"SidecarSet_PatchPodMetadata_WhiteList": "{\"rules\":[]}"}}),
        ),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "kruise-manager-role"}, "rules": []}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "kruise-daemon-secret-role",
                            "namespace": "kruise-daemon-config"}, "rules": []}),
        helm_release("kruise"),
        helm_release("kruise-rs"),
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "MutatingWebhookConfiguration",
               "metadata": {"name": "kruise-mutating-webhook-configuration"},
               "webhooks": webhook("mpod.kb.io", "/mutate-pod")}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingWebhookConfiguration",
               "metadata": {"name": "kruise-validating-webhook-configuration"},
               "webhooks": webhook("vpod.kb.io", "/validate-pod")}),
    ];
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    let out = plane.kubectl_with_stdin(
        &["create", "--field-manager", UPSTREAM_MANAGER, "-f", "-"],
        &list,
    );
    assert!(
        out.status.success(),
        "creating upstream's installation: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// --- Reading the cluster -------------------------------------------------------------------------

/// The list's spec as the apiserver gives it to upstream's controllers (v1beta1).
async fn list_spec_read(client: &Client) -> Value {
    namespaced(client, "ImageListPullJob", "imagelistpulljobs", BETA)
        .get(LIST)
        .await
        .expect("the list")
        .data["spec"]
        .clone()
}

/// The Lease name the manager Deployment's arguments give (the manager's default without one).
async fn deployment_lease(client: &Client) -> String {
    let deployment = Api::<Deployment>::namespaced(client.clone(), "kruise-system")
        .get("kruise-rs-manager")
        .await
        .expect("our manager's Deployment");
    let args: Vec<String> = deployment
        .spec
        .and_then(|s| s.template.spec)
        .map(|s| s.containers)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|c| c.args.unwrap_or_default())
        .collect();
    args.iter()
        .find_map(|a| a.strip_prefix("--leader-election-id="))
        .unwrap_or(DEFAULT_LEASE_NAME)
        .to_owned()
}

async fn exists(api: &Api<DynamicObject>, name: &str) -> bool {
    api.get_opt(name).await.expect("GET").is_some()
}

/// The `*.kruise.io` CRDs there are.
async fn kruise_crds(client: &Client) -> BTreeSet<String> {
    Api::<CustomResourceDefinition>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("list CRDs")
        .items
        .into_iter()
        .map(|c| c.name_any())
        .filter(|n| n.ends_with(".kruise.io"))
        .collect()
}

/// `kubectl auth can-i VERB RESOURCE` in `kruise-system` as our manager's ServiceAccount.
async fn manager_can(plane: &ExtraControlPlane, verb: &str, resource: &str) -> bool {
    let mut cmd = plane.kubectl();
    cmd.args([
        "auth",
        "can-i",
        verb,
        resource,
        "-n",
        "kruise-system",
        "--as=system:serviceaccount:kruise-system:kruise-rs-manager",
    ]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("kubectl runs");
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

/// Our manager as step 2 runs it, on the Lease named `lease`.
fn manager_options(kubeconfig: &Path, lease: &str) -> ManagerOptions {
    ManagerOptions {
        // Every object: upstream's carry no test label.
        controllers: ControllerOptions {
            nodeimage_creation_delay: Duration::ZERO,
            ..ControllerOptions::default()
        },
        leader_election: Some(LeaderElection {
            lease_name: lease.to_owned(),
            identity: OUR_IDENTITY.to_owned(),
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_secs(1),
            ..LeaderElection::new(UPSTREAM_NAMESPACE)
        }),
        ..crate::support::manager_options(kubeconfig)
    }
}

/// Plays the node daemon on `node`: once `image` is asked for there, reports it pulled.
async fn report_pulled(client: &Client, node: &str, image: &str) {
    let (repository, tag) = image.rsplit_once(':').expect("a tag");
    let nodeimages = cluster_scoped(client, "NodeImage", "nodeimages", BETA);
    let nodeimages = &nodeimages;
    let version = poll(
        &format!("{image} to be asked for on {node}"),
        TIMEOUT,
        || async move {
            let nodeimage = nodeimages.get(node).await.map_err(|e| e.to_string())?;
            nodeimage.data["spec"]["images"][repository]["tags"]
                .as_array()
                .and_then(|tags| tags.iter().find(|t| t["tag"] == tag))
                .map(|t| t["version"].as_i64().unwrap_or(0))
                .ok_or_else(|| format!("spec {}", nodeimage.data["spec"]))
        },
    )
    .await;
    let status = json!({"status": {"imageStatuses": {repository: {"tags": [{
        "tag": tag, "phase": "Succeeded", "version": version,
        "completionTime": Time(Timestamp::now())}]}}}});
    nodeimages
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("NodeImage status");
}

// --- The test ------------------------------------------------------------------------------------

#[tokio::test]
async fn the_switch_runbook_plays_as_written_on_a_cluster_upstream_left() {
    let began = Instant::now();
    let plane = tokio::task::spawn_blocking(ExtraControlPlane::start)
        .await
        .expect("join");
    let shell = Shell::new(&plane);
    let client = client_for(plane.kubeconfig_path()).await;
    upstream_objects(&client).await;
    upstream_installation(&plane);
    let mut upstream = UpstreamLeader::start(&client).await;

    step_0(&shell, &client).await;
    let before = step_1(&shell, &client).await;
    let manager = step_2(&shell, &plane, &client, &mut upstream).await;
    step_3(&shell, &client).await;
    step_4(&shell, &client, upstream, manager.probe_addr).await;
    our_controllers_pick_up_where_upstream_left(&client).await;
    step_5(&shell, &client, &before).await;
    the_list_finishes(&client).await;
    step_6_objects(&shell, &client).await;
    step_6_crds(&shell, &client).await;
    assert!(!manager.task.is_finished(), "our manager still runs");

    manager.stop.send(()).expect("the manager still runs");
    let stopped = tokio::time::timeout(Duration::from_secs(15), manager.task)
        .await
        .expect("the manager stops")
        .expect("join");
    assert!(stopped.is_ok(), "{stopped:?}");
    eprintln!("the runbook played in {:?}", began.elapsed());
}

/// Step 0 on the cluster as upstream left it: the CRD table; the kinds check, silent here and
/// naming a kind with objects once there is one; the SidecarSet check, listing exactly what the
/// pod webhook's detector finds; the copies.
async fn step_0(shell: &Shell, client: &Client) {
    let sidecarsets = cluster_scoped(client, "SidecarSet", "sidecarsets", BETA);
    let ran = shell.run("step-0-crds").await.ok();
    let rows = ran.lines();
    for crd in OURS {
        let row = rows
            .iter()
            .find(|r| r.starts_with(crd))
            .unwrap_or_else(|| panic!("no row for {crd}: {}", ran.describe()));
        let conversion = if crd.starts_with("sidecarsets") {
            "Webhook"
        } else {
            "None"
        };
        assert!(row.contains(conversion), "{crd}: {row}");
    }

    // Step 0: nothing on this cluster needs upstream (NodePodProbes, one per Node, do not)...
    let ran = shell.run("step-0-kinds").await.ok();
    assert_eq!(ran.lines(), Vec::<String>::new(), "{}", ran.describe());
    // ... but a CloneSet does, and stops the switch.
    let clonesets = namespaced(client, "CloneSet", "clonesets", ALPHA);
    create(
        &clonesets,
        json!({"apiVersion": format!("{GROUP}/{ALPHA}"), "kind": "CloneSet",
               "metadata": {"name": "web", "namespace": JOBS}, "spec": {"replicas": 1}}),
    )
    .await;
    let ran = shell.run("step-0-kinds").await.ok();
    assert_eq!(
        ran.lines(),
        ["clonesets.apps.kruise.io: 1 objects"],
        "{}",
        ran.describe()
    );
    clonesets
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete the CloneSet");

    // Step 0: the SidecarSets kruise-rs leaves out of new pods: none here; then exactly those
    // its webhook's detector finds, among SidecarSets using HotUpgrade and resourcesPolicy.
    let ran = shell.run("step-0-sidecarsets").await.ok();
    assert_eq!(ran.lines(), Vec::<String>::new(), "{}", ran.describe());
    let hot = |empty: Option<&str>| match empty {
        Some(image) => json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": image}),
        None => json!({"upgradeType": "HotUpgrade"}),
    };
    let native = |name: &str, strategy: Value| {
        let mut c = sidecar(name, strategy);
        c["restartPolicy"] = json!("Always");
        c
    };
    let resources_policy = {
        let mut c = sidecar("sized", json!({"upgradeType": "ColdUpgrade"}));
        c["resourcesPolicy"] = json!({"targetContainersMode": "sum",
            "targetContainersNameRegex": ".*",
            "resourcesExpr": {"limits": {"cpu": "cpu*50%"}}});
        c
    };
    for set in [
        sidecarset(
            "hot-with-empty-image",
            json!([sidecar(
                "envoy",
                hot(Some("127.0.0.1:5000/runbook/empty:1"))
            )]),
            json!([native(
                "init-envoy",
                hot(Some("127.0.0.1:5000/runbook/empty:1"))
            )]),
        ),
        sidecarset(
            "hot-without-empty-image",
            json!([
                sidecar("envoy", hot(None)),
                sidecar("blank", hot(Some(""))),
                sidecar("cold", json!({"upgradeType": "ColdUpgrade"})),
            ]),
            json!([
                native("init-envoy", hot(None)),
                // Not a native sidecar: upstream ignores its upgrade strategy, and so does ours.
                sidecar("init-plain", hot(None)),
            ]),
        ),
        sidecarset("resources-policy", json!([resources_policy]), json!([])),
    ] {
        create(&sidecarsets, set).await;
    }
    let ran = shell.run("step-0-sidecarsets").await.ok();
    // `SET: [init ]container NAME: ...`; a line of another shape is kept whole, to fail below.
    let listed: Vec<(String, String)> = ran
        .lines()
        .iter()
        .map(|line| {
            line.split_once(": ")
                .and_then(|(set, rest)| {
                    let rest = rest.strip_prefix("init ").unwrap_or(rest);
                    let (container, _) = rest.strip_prefix("container ")?.split_once(':')?;
                    Some((set.to_owned(), container.to_owned()))
                })
                .unwrap_or_else(|| ("(not a sidecar line)".to_owned(), line.clone()))
        })
        .collect();
    let typed: Api<SidecarSet> = Api::all(client.clone());
    let mut detected: Vec<(String, String)> = typed
        .list(&ListParams::default())
        .await
        .expect("list SidecarSets")
        .items
        .iter()
        .flat_map(|set| {
            unsupported::detect(&set.spec)
                .into_iter()
                .flat_map(|found| found.containers)
                .map(|c| (set.name_any(), c))
                .collect::<Vec<_>>()
        })
        .collect();
    detected.sort();
    let mut listed_sorted = listed.clone();
    listed_sorted.sort();
    assert_eq!(listed_sorted, detected, "{}", ran.describe());
    assert_eq!(detected.len(), 3, "{detected:?}");

    // Step 0: the copies.
    shell.run("step-0-copy").await.ok();
    let copy: Value = serde_yaml::from_str(
        &std::fs::read_to_string(shell.work().join("kruise-objects.yaml")).expect("the copy"),
    )
    .expect("YAML");
    let copied: BTreeSet<&str> = copy["items"]
        .as_array()
        .expect("a List")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    for name in [
        "log-agent",
        "old-job",
        LIST,
        CHILDREN[0].0,
        "node-a",
        "node-b",
    ] {
        assert!(copied.contains(name), "{name} not in the copy: {copied:?}");
    }
    let revisions: Value = serde_yaml::from_str(
        &std::fs::read_to_string(shell.work().join("kruise-revisions.yaml"))
            .expect("the revisions' copy"),
    )
    .expect("YAML");
    assert_eq!(revisions["kind"], "List", "{revisions}");
}

/// Step 1, with kubectl, then with `kruise-rs crds --install`: our CRDs, and the running list
/// reads as before, so upstream's hash of its template does not change. Returns its spec.
async fn step_1(shell: &Shell, client: &Client) -> Value {
    let before = list_spec_read(client).await;
    assert_eq!(before, list_spec(), "stored as upstream's webhook left it");
    let ran = shell.run("step-1-kubectl").await.ok();
    let typed: Api<SidecarSet> = Api::all(client.clone());
    // The block reads the first SidecarSet listed by name, in both versions.
    let first = typed
        .list(&ListParams::default())
        .await
        .expect("list SidecarSets")
        .items
        .iter()
        .map(ResourceExt::name_any)
        .min()
        .expect("SidecarSets");
    assert_eq!(
        ran.lines()
            .iter()
            .filter(|l| l.starts_with(&format!("{first} ")))
            .count(),
        2,
        "SidecarSet {first} read by name in both versions: {}",
        ran.describe()
    );
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in OURS {
        let conversion = crds
            .get(crd)
            .await
            .expect("a CRD")
            .spec
            .conversion
            .expect("conversion");
        assert_eq!(
            (conversion.strategy.as_str(), conversion.webhook.is_none()),
            ("None", true),
            "{crd}"
        );
    }
    let after = list_spec_read(client).await;
    assert_eq!(
        serde_json::to_string(&after).expect("JSON"),
        serde_json::to_string(&before).expect("JSON"),
        "the running ImageListPullJob's template reads differently under our CRD, so upstream \
         would hash it anew and replace every ImagePullJob of the list"
    );
    // Step 1 again, with `kruise-rs crds --install`.
    let ran = shell.run("step-1-install").await.ok();
    let lines = ran.lines();
    assert_eq!(lines.len(), 4, "{}", ran.describe());
    assert!(
        lines.iter().all(|l| l.contains("Established")),
        "{}",
        ran.describe()
    );
    assert_eq!(list_spec_read(client).await, before);
    before
}

/// Step 2 with the plain manifests: our manager's objects, on upstream's Lease; then our manager
/// (in-process, on the Lease the Deployment names) follows while upstream leads.
async fn step_2(
    shell: &Shell,
    plane: &ExtraControlPlane,
    client: &Client,
    upstream: &mut UpstreamLeader,
) -> RunningManager {
    shell.run("step-2-manifests").await.ok();
    let lease = deployment_lease(client).await;
    assert_eq!(
        lease, UPSTREAM_LEASE,
        "the Deployment's --leader-election-id"
    );
    assert!(
        manager_can(plane, "update", "leases/kruise-manager").await,
        "our manager's Role grants upstream's Lease"
    );
    let manager = start_manager(
        manager_options(plane.kubeconfig_path(), &lease),
        TIMEOUT,
        "beside upstream's",
    )
    .await;
    // Our replica follows while upstream's leads: a Node it would give a NodeImage at once
    // gets none, and the Lease stays upstream's (step-2-wait's last line).
    create_node(client, "node-new").await;
    upstream
        .renewed(2 * UPSTREAM_LEASE_SECONDS.unsigned_abs() + 1)
        .await;
    assert_eq!(
        leader_gauge(manager.probe_addr).await,
        "kruise_rs_manager_leader 0"
    );
    assert_eq!(lease_holder(client).await.as_deref(), Some(UPSTREAM_HOLDER));
    let nodeimages = cluster_scoped(client, "NodeImage", "nodeimages", BETA);
    assert!(
        !exists(&nodeimages, "node-new").await,
        "our controllers ran while upstream's replica led"
    );
    manager
}

/// Step 3: upstream's webhook configurations go, ours stay.
async fn step_3(shell: &Shell, client: &Client) {
    shell.run("step-3").await.ok();
    let webhooks = |kind: &str, plural: &str| {
        Api::<DynamicObject>::all_with(
            client.clone(),
            &ApiResource {
                group: "admissionregistration.k8s.io".into(),
                version: "v1".into(),
                api_version: "admissionregistration.k8s.io/v1".into(),
                kind: kind.into(),
                plural: plural.into(),
            },
        )
    };
    for (kind, plural, what) in [
        (
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
            "mutating",
        ),
        (
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
            "validating",
        ),
    ] {
        let api = webhooks(kind, plural);
        assert!(!exists(&api, &format!("kruise-{what}-webhook-configuration")).await);
        assert!(exists(&api, &format!("kruise-rs-{what}-webhook-configuration")).await);
    }
}

/// Step 4: upstream stops (the test plays its Deployment controller and kubelet); our replica,
/// serving probes at `probe`, takes the Lease.
async fn step_4(shell: &Shell, client: &Client, upstream: UpstreamLeader, probe: SocketAddr) {
    let stand_in = {
        let client = client.clone();
        tokio::spawn(async move {
            let deployments = Api::<Deployment>::namespaced(client.clone(), "kruise-system");
            let deployments = &deployments;
            poll(
                "the block to scale upstream's Deployment to 0",
                TIMEOUT,
                || async move {
                    let d = deployments
                        .get("kruise-controller-manager")
                        .await
                        .map_err(|e| e.to_string())?;
                    let replicas = d.spec.and_then(|s| s.replicas);
                    (replicas == Some(0))
                        .then_some(())
                        .ok_or_else(|| format!("replicas {replicas:?}"))
                },
            )
            .await;
            upstream.stop().await;
            Api::<Pod>::namespaced(client, "kruise-system")
                .delete(UPSTREAM_POD, &DeleteParams::default())
                .await
                .expect("delete upstream's pod");
        })
    };
    let ran = shell.run("step-4").await.ok();
    stand_in.await.expect("the stand-in for upstream's pods");
    assert_eq!(
        ran.lines().last().map(String::as_str),
        Some(format!("leader: {OUR_IDENTITY}").as_str()),
        "{}",
        ran.describe()
    );
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), "kruise-system");
    assert!(
        daemonsets
            .get_opt("kruise-daemon")
            .await
            .expect("GET")
            .is_none()
    );
    assert_eq!(leader_gauge(probe).await, "kruise_rs_manager_leader 1");
}

/// The Node created meanwhile gets its NodeImage, and upstream's jobs of the running list are
/// kept (relabelled with our hash, not replaced).
async fn our_controllers_pick_up_where_upstream_left(client: &Client) {
    let nodeimages = cluster_scoped(client, "NodeImage", "nodeimages", BETA);
    let nodeimages_ref = &nodeimages;
    poll(
        "a NodeImage for the Node created meanwhile",
        TIMEOUT,
        || async move {
            nodeimages_ref
                .get("node-new")
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
    let lists: Api<ImageListPullJob> = Api::namespaced(client.clone(), JOBS);
    let list = lists.get(LIST).await.expect("the list");
    let ours = template_hash(&list.spec.template);
    let jobs = namespaced(client, "ImagePullJob", "imagepulljobs", BETA);
    let (jobs_ref, ours_ref) = (&jobs, &ours);
    let upstream_children: BTreeSet<&str> = CHILDREN.iter().map(|(name, _)| *name).collect();
    let upstream_children = &upstream_children;
    poll(
        "upstream's jobs of the list to be kept and relabelled",
        TIMEOUT,
        || async move {
            let children: BTreeMap<String, Option<String>> = jobs_ref
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .into_iter()
                .filter(|j| j.owner_references().iter().any(|o| o.name == LIST))
                .map(|j| {
                    let hash = j.labels().get(CONTROLLER_REVISION_HASH).cloned();
                    (j.name_any(), hash)
                })
                .collect();
            let names: BTreeSet<&str> = children.keys().map(String::as_str).collect();
            let relabelled = children.values().all(|h| h.as_ref() == Some(ours_ref));
            (names == *upstream_children && relabelled)
                .then_some(())
                .ok_or_else(|| format!("children {children:?}"))
        },
    )
    .await;
}

/// Step 5: every object rewritten, then `v1beta1` alone stored; the list still reads as
/// `before`. The page says to run the loop again when a replace failed: a conflict with our
/// manager's writes.
async fn step_5(shell: &Shell, client: &Client, before: &Value) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut ran = shell.run("step-5").await;
    for _ in 0..2 {
        if !ran.stderr().contains("the object has been modified") {
            break;
        }
        eprintln!(
            "step-5 met a conflict; running it again, as the page says:\n{}",
            ran.describe()
        );
        ran = shell.run("step-5").await;
    }
    let ran = ran.ok();
    for crd in OURS {
        let stored = crds
            .get(crd)
            .await
            .expect("a CRD")
            .status
            .and_then(|s| s.stored_versions)
            .unwrap_or_default();
        assert_eq!(stored, [BETA], "{crd}: {}", ran.describe());
    }
    assert_eq!(&list_spec_read(client).await, before);
}

/// The list's pulls finish (the test plays the daemon); its TTL deletes it.
async fn the_list_finishes(client: &Client) {
    let lists: Api<ImageListPullJob> = Api::namespaced(client.clone(), JOBS);
    for (_, image) in CHILDREN {
        report_pulled(client, "node-a", image).await;
    }
    let lists_ref = &lists;
    poll(
        "the finished list to be deleted by its TTL",
        TIMEOUT,
        || async move {
            match lists_ref.get_opt(LIST).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(list) => Err(format!("status {:?}", list.status)),
            }
        },
    )
    .await;
}

/// Step 6: upstream's own objects go; what kruise-rs uses stays.
async fn step_6_objects(shell: &Shell, client: &Client) {
    shell.run("step-6-objects").await.ok();
    let gone = [
        (
            "apps/v1",
            "Deployment",
            "deployments",
            "kruise-controller-manager",
        ),
        ("v1", "Service", "services", "kruise-webhook-service"),
        ("v1", "Secret", "secrets", "kruise-webhook-certs"),
        ("v1", "ServiceAccount", "serviceaccounts", "kruise-manager"),
        ("v1", "Secret", "secrets", "sh.helm.release.v1.kruise.v1"),
    ];
    let kept = [
        ("v1", "Secret", "secrets", "sh.helm.release.v1.kruise-rs.v1"),
        ("v1", "ConfigMap", "configmaps", "kruise-configuration"),
        (
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            "kruise-rs-manager",
        ),
        ("apps/v1", "Deployment", "deployments", "kruise-rs-manager"),
    ];
    let in_system = |api_version: &str, kind: &str, plural: &str| {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Api::<DynamicObject>::namespaced_with(
            client.clone(),
            "kruise-system",
            &ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: api_version.into(),
                kind: kind.into(),
                plural: plural.into(),
            },
        )
    };
    for (api_version, kind, plural, name) in gone {
        let api = in_system(api_version, kind, plural);
        assert!(!exists(&api, name).await, "{kind} {name} is left");
    }
    for (api_version, kind, plural, name) in kept {
        let api = in_system(api_version, kind, plural);
        assert!(exists(&api, name).await, "{kind} {name} was deleted");
    }
}

/// Step 6: the empty CRDs go; ours (the ImageListPullJob one has no object left) and the
/// NodePodProbe one (one object per Node) stay.
async fn step_6_crds(shell: &Shell, client: &Client) {
    shell.run("step-6-crds").await.ok();
    let mut want: BTreeSet<String> = OURS.iter().map(|c| (*c).to_owned()).collect();
    want.insert("nodepodprobes.apps.kruise.io".to_owned());
    assert_eq!(kruise_crds(client).await, want);
    ensure_installed(client)
        .await
        .expect("the manager's start-up check still passes");
}
