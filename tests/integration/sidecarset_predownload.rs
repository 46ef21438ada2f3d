//! SidecarSet image pre-download (issue 7), run against the whole manager of the webhook test
//! cluster (`support::webhook`): webhooks, SidecarSet, ImagePullJob and NodeImage controllers.
//! The contract these tests hold the controller to is issue 7's: when a sidecar image changes,
//! ImagePullJobs pull the new image on the nodes of the old pods, in the order the rollout will
//! reach them, and each pod waits for its node's pull before it is upgraded.
//!
//! How the tests set the stage:
//! - Nodes are Node objects of the test's own, labelled `kruise-rs-test: <run>` and Ready, so the
//!   NodeImage controller gives each a NodeImage (creation delay 0 in tests). Pods are bare pods
//!   with `spec.nodeName` set, admitted through the pod webhook, one per node unless said
//!   otherwise.
//! - The test plays kubelet (`support::kubelet`) and the node daemon ([`Daemon`]): the daemon
//!   answers every tag the ImagePullJob controller puts into this test's NodeImages, `Pulling`
//!   until the test finishes the node (`Succeeded` or `Failed`). Answering at once keeps the
//!   NodeImage controller's response timeout from failing the tags behind the tests' backs.
//! - The rollout order is made known: pod number `i` is reported Ready `i + 1` minutes ago, so
//!   Kubernetes' `ActivePods` order (ready more recently first) reaches pod 0 first, then 1, …
//! - The SidecarSets carry [`CONTROLLED_LABEL`], which the jobs copy, so the test ImagePullJob
//!   controller handles the jobs. Each test uses its own namespaces, nodes, image repository and
//!   SidecarSet name, so tests run side by side.
//! - [`JobLog`] watches every ImagePullJob labelled with the SidecarSet's name from the start, so a
//!   test can tell that a job was never created (or never another one).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Node, Pod, ResourceQuota, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::nodeimage::{ImagePullPhase, NodeImage};
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::{
    CONTROLLER_REVISION_HASH, IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS,
    IMAGE_PREDOWNLOAD_PARALLELISM, IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, SIDECARSET_NAME_LABEL,
};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::sidecarset_upgrade::{
    CACHE_TIMEOUT, Counts, ROLLOUT_TIMEOUT, admit_injected, client, condition, counts, counts_of,
    create_sidecarset, describe_set, ensure_manager_namespace, get_set, poll, spec_image,
    update_spec,
};
use crate::support::kubelet;
use crate::support::webhook::{MANAGER_NAMESPACE, webhook_cluster};
use crate::support::{CONTROLLED_LABEL, unique_name};

/// The sidecar most tests use.
const PROXY: &str = "proxy";
/// The label naming the sidecar container a job pulls for.
const CONTAINER_LABEL: &str = "apps.kruise.io/sidecarset-container";
/// The SidecarSet condition about the pre-download.
const PRE_DOWNLOAD: &str = "ImagePreDownload";
const ROLLOUT_HELD: &str = "RolloutHeld";
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";
/// The pull secret of the private-image tests.
const PULL_SECRET: &str = "regcred";
/// The object-count quota that forbids ImagePullJobs in a namespace.
const JOB_COUNT_QUOTA: &str = "count/imagepulljobs.apps.kruise.io";
/// The namespace the ImagePullJob controller copies pull secrets to (the controllers' default).
const DAEMON_CONFIG_NAMESPACE: &str = "kruise-daemon-config";

// --- The stage ----------------------------------------------------------------------------------

/// Whether the test plays kubelet while it waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kubelet {
    /// Containers keep reporting what they reported.
    Off,
    /// Each look, containers whose spec image changed are restarted on it.
    On,
}

fn never_bad(_: &str) -> bool {
    false
}

/// One test's namespaces, nodes' label, image repository and SidecarSet name.
struct Env {
    client: Client,
    /// The value of [`CONTROLLED_LABEL`] on this test's Nodes (and so on their NodeImages), and
    /// the prefix of their names and of the images.
    run: String,
    /// The SidecarSet.
    name: String,
    app: String,
    /// The test's namespaces; pods go to the first one unless said otherwise.
    namespaces: Vec<String>,
}

impl Env {
    async fn new(prefix: &str, namespaces: usize) -> Env {
        let client = client().await;
        ensure_manager_namespace(&client).await;
        let mut names = Vec::new();
        for _ in 0..namespaces {
            names.push(webhook_cluster().namespace(prefix).await);
        }
        Env {
            client,
            run: unique_name(prefix),
            name: unique_name(prefix),
            app: unique_name("app"),
            namespaces: names,
        }
    }

    fn pods(&self, namespace: usize) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespaces[namespace])
    }

    /// The image of sidecar `container` at `tag`, in a repository of this test's own.
    fn image(&self, container: &str, tag: &str) -> String {
        format!("127.0.0.1:5000/{}/{container}:{tag}", self.run)
    }

    fn container(&self, name: &str, tag: &str) -> Value {
        json!({
            "name": name,
            "image": self.image(name, tag),
            "imagePullPolicy": "IfNotPresent",
            "command": ["sleep", "infinity"],
            "podInjectPolicy": "AfterAppContainer",
        })
    }

    /// A SidecarSet with `containers` at tag `1`, selecting this test's pods in its namespaces,
    /// rolling update with the defaults (maxUnavailable 1, partition 0).
    fn set_spec(&self, containers: &[&str]) -> Value {
        let namespace_selector = match self.namespaces.as_slice() {
            [one] => json!({"matchLabels": {NAMESPACE_NAME_LABEL: one}}),
            many => json!({"matchExpressions": [{
                "key": NAMESPACE_NAME_LABEL,
                "operator": "In",
                "values": many,
            }]}),
        };
        let containers: Vec<Value> = containers.iter().map(|c| self.container(c, "1")).collect();
        json!({
            "apiVersion": "apps.kruise.io/v1beta1",
            "kind": "SidecarSet",
            "metadata": {"name": self.name, "labels": {CONTROLLED_LABEL: self.name}},
            "spec": {
                "selector": {"matchLabels": {"app": self.app}},
                "namespaceSelector": namespace_selector,
                "updateStrategy": {"type": "RollingUpdate"},
                "containers": containers,
            }
        })
    }

    /// Sets the images of `changes` (container, tag) in `spec` and writes the containers, with
    /// `strategy` merged into `updateStrategy` in the same write.
    async fn set_images(
        &self,
        spec: &mut Value,
        changes: &[(&str, &str)],
        strategy: Value,
    ) -> SidecarSet {
        for (container, tag) in changes {
            let containers = spec["spec"]["containers"]
                .as_array_mut()
                .expect("containers");
            let entry = containers
                .iter_mut()
                .find(|c| c["name"] == *container)
                .unwrap_or_else(|| panic!("the SidecarSet has no container {container}"));
            entry["image"] = json!(self.image(container, tag));
        }
        let containers = spec["spec"]["containers"].clone();
        update_spec(
            &self.client,
            &self.name,
            json!({"containers": containers, "updateStrategy": strategy}),
        )
        .await
    }

    /// Merges `annotations` into the SidecarSet's (`null` removes one).
    async fn annotate(&self, annotations: Value) {
        let patch = json!({"metadata": {"annotations": annotations}});
        Api::<SidecarSet>::all(self.client.clone())
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("annotating SidecarSet {} with {patch}: {e}", self.name));
    }

    /// Creates `n` Ready Nodes of this test and waits for their NodeImages.
    async fn nodes(&self, n: usize) -> Vec<String> {
        self.nodes_labelled(n, CONTROLLED_LABEL).await
    }

    /// [`Self::nodes`] labelled `label` (this test's run as value) instead of
    /// [`CONTROLLED_LABEL`]: the NodeImage controller selecting `label` must create their
    /// NodeImages.
    async fn nodes_labelled(&self, n: usize, label: &str) -> Vec<String> {
        let api = Api::<Node>::all(self.client.clone());
        let mut names = Vec::new();
        for i in 0..n {
            let name = format!("{}-n{i}", self.run);
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(label.to_owned(), self.run.clone())])),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            };
            api.create(&PostParams::default(), &node)
                .await
                .unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
            let now = Time(Timestamp::now());
            let ready = json!({"status": {"conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "set by the test",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }]}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&ready))
                .await
                .unwrap_or_else(|e| panic!("setting Node {name} Ready: {e}"));
            names.push(name);
        }
        let nodeimages = Api::<NodeImage>::all(self.client.clone());
        for name in &names {
            let nodeimages = &nodeimages;
            poll(
                &format!("the NodeImage controller to create the NodeImage of Node {name}"),
                CACHE_TIMEOUT,
                || async move {
                    match nodeimages.get_opt(name).await {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err("no NodeImage".to_owned()),
                        Err(e) => Err(format!("reading NodeImage {name}: {e}")),
                    }
                },
            )
            .await;
        }
        names
    }

    /// Creates a pod on `node` in namespace number `namespace`, injected with the current
    /// version of `set`, with `labels` besides `app`, starts it and reports it Ready since
    /// `rank + 1` minutes: the rollout reaches lower ranks first.
    async fn start_pod(
        &self,
        namespace: usize,
        set: &SidecarSet,
        node: &str,
        labels: Value,
        rank: usize,
    ) -> String {
        let pods = self.pods(namespace);
        let mut pod_labels = json!({"app": self.app});
        if let Value::Object(extra) = labels {
            pod_labels.as_object_mut().expect("labels").extend(extra);
        }
        let template = json!({
            "metadata": {"name": "web", "labels": pod_labels},
            "spec": {
                "nodeName": node,
                "containers": [{
                    "name": "main",
                    "image": "busybox:1.36",
                    "command": ["sleep", "infinity"],
                }],
            },
        });
        let pod = admit_injected(&pods, &template, &[set]).await;
        let name = pod.name_any();
        kubelet::start(&pods, &name).await;
        let minutes = i64::try_from(rank).expect("a small rank") + 1;
        let since = Timestamp::now() - SignedDuration::from_mins(minutes);
        write_ready(&pods, &name, true, since).await;
        name
    }

    /// Pod `i` on `nodes[i]` in the first namespace, ranked `i`.
    async fn start_pods(&self, set: &SidecarSet, nodes: &[String]) -> Vec<String> {
        let mut names = Vec::new();
        for (i, node) in nodes.iter().enumerate() {
            names.push(self.start_pod(0, set, node, json!({}), i).await);
        }
        names
    }

    /// The pods of every namespace of the test, by namespace and name.
    async fn all_pods(&self) -> Vec<Pod> {
        let mut all = Vec::new();
        for i in 0..self.namespaces.len() {
            let list = self
                .pods(i)
                .list(&ListParams::default())
                .await
                .unwrap_or_else(|e| panic!("listing the pods of {}: {e}", self.namespaces[i]))
                .items;
            // A pod deleted by `admit_injected` (not injected yet) stays, being deleted, with no
            // kubelet to confirm: it is no part of the test.
            all.extend(
                list.into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none()),
            );
        }
        all.sort_by_key(|p| (p.namespace().unwrap_or_default(), p.name_any()));
        all
    }

    /// Waits until the SidecarSet's status describes its current generation and `check`
    /// accepts what is seen; with [`Kubelet::On`] a kubelet pass runs before each look.
    async fn wait(
        &self,
        what: &str,
        kubelet: Kubelet,
        check: impl Fn(&View) -> Result<(), String>,
    ) -> View {
        let check = &check;
        poll(what, ROLLOUT_TIMEOUT, || async move {
            if kubelet == Kubelet::On {
                for i in 0..self.namespaces.len() {
                    kubelet::sync(&self.pods(i), &never_bad).await;
                }
            }
            let view = View {
                set: get_set(&self.client, &self.name).await,
                pods: self.all_pods().await,
                jobs: live_jobs(&self.client, &self.name).await,
            };
            let status = view.set.status.clone().unwrap_or_default();
            if status.observed_generation != view.set.metadata.generation {
                return Err(format!("status not observed yet; {}", view.describe()));
            }
            check(&view).map_err(|e| format!("{e}; {}", view.describe()))?;
            Ok(view)
        })
        .await
    }

    /// With maxUnavailable 1 and kubelet played only here: waits for each of `n` pods of the
    /// first namespace to be upgraded to `image`, one at a time, restarting each before the
    /// next; returns them in the order they were upgraded.
    async fn upgrade_order(&self, n: usize, container: &str, image: &str) -> Vec<String> {
        let pods = self.pods(0);
        let mut order: Vec<String> = Vec::new();
        while order.len() < n {
            let (pods, done) = (&pods, &order);
            let next = poll(
                &format!(
                    "pod number {} of the rollout to get {image}",
                    done.len() + 1
                ),
                ROLLOUT_TIMEOUT,
                || async move {
                    let list = pods
                        .list(&ListParams::default())
                        .await
                        .unwrap_or_else(|e| panic!("listing pods: {e}"))
                        .items;
                    let fresh: Vec<String> = list
                        .iter()
                        .filter(|p| spec_image(p, container) == image)
                        .map(ResourceExt::name_any)
                        .filter(|name| !done.contains(name))
                        .collect();
                    match fresh.as_slice() {
                        [one] => Ok(one.clone()),
                        [] => Err(format!(
                            "no pod besides {done:?} on the new image; pods: {}",
                            describe_pods(&list)
                        )),
                        more => panic!(
                            "maxUnavailable 1 and every earlier pod restarted, yet pods {more:?} \
                             were upgraded together; pods: {}",
                            describe_pods(&list)
                        ),
                    }
                },
            )
            .await;
            kubelet::restart_changed(pods, &next).await;
            order.push(next);
        }
        order
    }
}

/// Writes the pod's `Ready` and `ContainersReady` conditions: `ready`, transitioned at `since`
/// (the other conditions kept). Guarded by the pod's resourceVersion, retried on conflict.
async fn write_ready(pods: &Api<Pod>, name: &str, ready: bool, since: Timestamp) {
    poll(
        &format!("the Ready condition of pod {name} to be written"),
        CACHE_TIMEOUT,
        || async move {
            let pod = pods
                .get(name)
                .await
                .unwrap_or_else(|e| panic!("reading pod {name}: {e}"));
            let mut conditions = serde_json::to_value(
                pod.status
                    .as_ref()
                    .and_then(|s| s.conditions.clone())
                    .unwrap_or_default(),
            )
            .expect("conditions serialize");
            for c in conditions.as_array_mut().expect("a list") {
                if c["type"] == "Ready" || c["type"] == "ContainersReady" {
                    c["status"] = json!(if ready { "True" } else { "False" });
                    c["lastTransitionTime"] = json!(Time(since));
                }
            }
            let patch = json!({
                "metadata": {"resourceVersion": pod.metadata.resource_version},
                "status": {"conditions": conditions},
            });
            match pods
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Err(format!("a conflict: {s:?}")),
                Err(e) => panic!("writing the Ready condition of pod {name}: {e}"),
            }
        },
    )
    .await;
}

/// What one look at the cluster saw.
struct View {
    set: SidecarSet,
    /// Every pod of the test's namespaces.
    pods: Vec<Pod>,
    /// The SidecarSet's ImagePullJobs that are not being deleted.
    jobs: Vec<ImagePullJob>,
}

impl View {
    fn describe(&self) -> String {
        format!(
            "{}; pods: {}; jobs: {}",
            describe_set(&self.set),
            describe_pods(&self.pods),
            describe_jobs(&self.jobs)
        )
    }

    fn expect_counts(&self, expected: Counts) -> Result<(), String> {
        let seen = counts_of(&self.set);
        (seen == expected)
            .then_some(())
            .ok_or_else(|| format!("counts {expected:?} wanted, found {seen:?}"))
    }

    fn expect_jobs(&self, n: usize) -> Result<(), String> {
        (self.jobs.len() == n)
            .then_some(())
            .ok_or_else(|| format!("{n} job(s) wanted, found {}", self.jobs.len()))
    }

    fn expect_condition(&self, type_: &str, status: &str, reason: &str) -> Result<(), String> {
        expect_condition(&self.set, type_, status, reason)
    }

    /// The names of the pods whose `container` has `image` in its spec.
    fn pods_on(&self, container: &str, image: &str) -> BTreeSet<String> {
        self.pods
            .iter()
            .filter(|p| spec_image(p, container) == image)
            .map(ResourceExt::name_any)
            .collect()
    }

    /// The job pulling for `container` in `namespace`.
    fn job(&self, namespace: &str, container: &str) -> Result<&ImagePullJob, String> {
        self.jobs
            .iter()
            .find(|j| {
                j.namespace().as_deref() == Some(namespace)
                    && j.labels().get(CONTAINER_LABEL).map(String::as_str) == Some(container)
            })
            .ok_or_else(|| format!("no job for container {container} in namespace {namespace}"))
    }
}

fn expect_condition(
    set: &SidecarSet,
    type_: &str,
    status: &str,
    reason: &str,
) -> Result<(), String> {
    match condition(set, type_) {
        Some(c) if c.status == status && c.reason == reason => Ok(()),
        other => Err(format!(
            "condition {type_} {status}/{reason} wanted, found {other:?}"
        )),
    }
}

/// The message of the SidecarSet's condition `type_` ("" without one).
fn condition_message(set: &SidecarSet, type_: &str) -> String {
    condition(set, type_)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

fn describe_pods(pods: &[Pod]) -> String {
    let lines: Vec<String> = pods
        .iter()
        .map(|p| {
            let spec = p.spec.clone().unwrap_or_default();
            let images: Vec<String> = spec
                .containers
                .iter()
                .filter(|c| c.name != "main")
                .map(|c| format!("{}={}", c.name, c.image.clone().unwrap_or_default()))
                .collect();
            format!(
                "{}/{}@{} [{}] ready={}",
                p.namespace().unwrap_or_default(),
                p.name_any(),
                spec.node_name.unwrap_or_default(),
                images.join(", "),
                kubelet::pod_ready(p)
            )
        })
        .collect();
    format!("[{}]", lines.join("; "))
}

fn describe_jobs(jobs: &[ImagePullJob]) -> String {
    let parts: Vec<String> = jobs
        .iter()
        .map(|j| {
            format!(
                "{} {}",
                job_key(j),
                serde_json::to_string(&j.spec).unwrap_or_default()
            )
        })
        .collect();
    format!("[{}]", parts.join("; "))
}

// --- Jobs -----------------------------------------------------------------------------------------

fn job_key(job: &ImagePullJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

/// The ImagePullJobs labelled with SidecarSet `set`'s name, in every namespace, that are not
/// being deleted (a job being deleted is gone as far as the SidecarSet controller goes, whatever
/// finalizer another party holds on it), by namespace and name.
async fn live_jobs(client: &Client, set: &str) -> Vec<ImagePullJob> {
    let params = ListParams::default().labels(&format!("{SIDECARSET_NAME_LABEL}={set}"));
    let mut jobs: Vec<ImagePullJob> = Api::<ImagePullJob>::all(client.clone())
        .list(&params)
        .await
        .unwrap_or_else(|e| panic!("listing the ImagePullJobs of {set}: {e}"))
        .items
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .collect();
    jobs.sort_by_key(job_key);
    jobs
}

/// The job's `selector.names`.
fn job_nodes(job: &ImagePullJob) -> Vec<String> {
    job.spec
        .template
        .selector
        .as_ref()
        .map(|s| s.names.clone())
        .unwrap_or_default()
}

fn latest_revision(set: &SidecarSet) -> String {
    set.status
        .as_ref()
        .and_then(|s| s.latest_revision.clone())
        .unwrap_or_default()
}

/// The hash part of a revision name `<prefix>-<hash>`.
fn revision_hash(revision: &str) -> String {
    revision
        .rsplit_once('-')
        .map(|(_, hash)| hash.to_owned())
        .unwrap_or_default()
}

/// A DNS-1123 label: what a name that is also a label value must be.
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// What a pre-download job must be.
struct Want<'a> {
    namespace: &'a str,
    container: &'a str,
    image: &'a str,
    /// The target nodes; in this order when `ordered`, else in any order.
    nodes: &'a [String],
    ordered: bool,
    parallelism: i64,
    timeout_seconds: i64,
    pull_secrets: &'a [&'a str],
}

impl<'a> Want<'a> {
    /// A job in the manager's namespace for `container`, pulling `image` on `nodes` in this
    /// order, with the default knobs and no pull secrets.
    fn new(container: &'a str, image: &'a str, nodes: &'a [String]) -> Self {
        Want {
            namespace: MANAGER_NAMESPACE,
            container,
            image,
            nodes,
            ordered: true,
            parallelism: 1,
            timeout_seconds: 300,
            pull_secrets: &[],
        }
    }
}

/// Every point of the contract's job description that `job` misses, for SidecarSet `set` at its
/// latest revision, but `completionPolicy.type` ([`check_completion_type`]): one test checks
/// that, so that the others fail only for what they are about.
fn check_job(job: &ImagePullJob, set: &SidecarSet, want: &Want) -> Result<(), String> {
    let mut wrong = Vec::new();
    let latest = latest_revision(set);
    let hash = revision_hash(&latest);
    let name = job.name_any();
    let full = format!("{latest}-{}", want.container);
    if full.len() <= 63 {
        if name != full {
            wrong.push(format!("name {name}, wanted {full}"));
        }
    } else if !is_dns_label(&name) || name == full {
        wrong.push(format!(
            "name {name}: {full} is longer than 63 characters, so a shortened name (at most 63, \
             with a hash suffix) was wanted"
        ));
    }
    if job.namespace().as_deref() != Some(want.namespace) {
        wrong.push(format!(
            "namespace {:?}, wanted {}",
            job.namespace(),
            want.namespace
        ));
    }

    let mut labels = set.labels().clone();
    labels.insert(SIDECARSET_NAME_LABEL.to_owned(), set.name_any());
    labels.insert(CONTROLLER_REVISION_HASH.to_owned(), hash.clone());
    labels.insert(CONTAINER_LABEL.to_owned(), want.container.to_owned());
    if job.labels() != &labels {
        wrong.push(format!("labels {:?}, wanted {labels:?}", job.labels()));
    }
    let owners = job.owner_references();
    let owned = matches!(owners, [o] if o.api_version == "apps.kruise.io/v1beta1"
        && o.kind == "SidecarSet"
        && o.name == set.name_any()
        && Some(&o.uid) == set.metadata.uid.as_ref()
        && o.controller == Some(true));
    if !owned {
        wrong.push(format!(
            "ownerReferences {owners:?}, wanted one controller reference to the SidecarSet"
        ));
    }

    let spec = serde_json::to_value(&job.spec).expect("a job spec serializes");
    if spec["image"] != json!(want.image) {
        wrong.push(format!("image {}, wanted {}", spec["image"], want.image));
    }
    let nodes = job_nodes(job);
    let nodes_ok = if want.ordered {
        nodes == want.nodes
    } else {
        let mut sorted = nodes.clone();
        sorted.sort();
        let mut wanted = want.nodes.to_vec();
        wanted.sort();
        sorted == wanted
    };
    if !nodes_ok {
        let how = if want.ordered {
            "in this order"
        } else {
            "in any order"
        };
        wrong.push(format!(
            "selector.names {nodes:?}, wanted {:?} {how}",
            want.nodes
        ));
    }
    for field in ["matchLabels", "matchExpressions"] {
        if !spec["selector"][field].is_null() {
            wrong.push(format!(
                "selector.{field} {}, wanted none",
                spec["selector"][field]
            ));
        }
    }
    if !spec["podSelector"].is_null() {
        wrong.push(format!("podSelector {}, wanted none", spec["podSelector"]));
    }
    if spec["parallelism"] != json!(want.parallelism) {
        wrong.push(format!(
            "parallelism {}, wanted {}",
            spec["parallelism"], want.parallelism
        ));
    }
    let pull_policy = &spec["pullPolicy"];
    if pull_policy["backoffLimit"] != json!(1)
        || pull_policy["timeoutSeconds"] != json!(want.timeout_seconds)
    {
        wrong.push(format!(
            "pullPolicy {pull_policy}, wanted backoffLimit 1 and timeoutSeconds {}",
            want.timeout_seconds
        ));
    }
    if !spec["completionPolicy"]["ttlSecondsAfterFinished"].is_null() {
        wrong.push(format!(
            "completionPolicy {}, wanted no ttlSecondsAfterFinished (the SidecarSet controller \
             deletes its jobs)",
            spec["completionPolicy"]
        ));
    }
    if spec["imagePullPolicy"] != "IfNotPresent" {
        wrong.push(format!(
            "imagePullPolicy {}, wanted IfNotPresent",
            spec["imagePullPolicy"]
        ));
    }
    let secrets: Vec<String> = job.spec.template.pull_secrets.clone();
    if secrets != want.pull_secrets {
        wrong.push(format!(
            "pullSecrets {secrets:?}, wanted {:?}",
            want.pull_secrets
        ));
    }
    let sandbox_labels = &spec["sandboxConfig"]["labels"];
    let wanted_sandbox =
        json!({SIDECARSET_NAME_LABEL: set.name_any(), CONTROLLER_REVISION_HASH: hash});
    if sandbox_labels != &wanted_sandbox {
        wrong.push(format!(
            "sandboxConfig.labels {sandbox_labels}, wanted {wanted_sandbox}"
        ));
    }

    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "ImagePullJob {}: {}; the job: {}",
            job_key(job),
            wrong.join("; "),
            serde_json::to_string(job).unwrap_or_default()
        ))
    }
}

/// The contract's `completionPolicy.type` of a pre-download job: `Always`.
fn check_completion_type(job: &ImagePullJob) -> Result<(), String> {
    let spec = serde_json::to_value(&job.spec).expect("a job spec serializes");
    let completion = &spec["completionPolicy"];
    (completion["type"] == "Never")
        .then_some(())
        .ok_or_else(|| {
            format!(
                "ImagePullJob {}: completionPolicy {completion}, wanted type Never",
                job_key(job)
            )
        })
}

/// Every ImagePullJob labelled with a SidecarSet's name that ever existed since the log
/// started, as `namespace/name`. Stops watching when dropped.
struct JobLog {
    task: JoinHandle<()>,
    seen: Arc<Mutex<BTreeSet<String>>>,
}

impl JobLog {
    fn spawn(client: &Client, set: &str) -> JobLog {
        let api = Api::<ImagePullJob>::all(client.clone());
        let config = watcher::Config::default().labels(&format!("{SIDECARSET_NAME_LABEL}={set}"));
        let seen: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, config).default_backoff().applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                match item {
                    Ok(job) => {
                        log.lock().expect("job log lock").insert(job_key(&job));
                    }
                    // The watcher retries with a backoff; nothing is lost but time.
                    Err(e) => eprintln!("job log: watching ImagePullJobs: {e}"),
                }
            }
        });
        JobLog { task, seen }
    }

    fn seen(&self) -> BTreeSet<String> {
        self.seen.lock().expect("job log lock").clone()
    }

    /// Waits until the log holds `expected` (the watch may lag behind a list), then checks it
    /// holds nothing else: no other job was ever created.
    async fn expect_exactly(&self, expected: &[String]) {
        let expected: BTreeSet<String> = expected.iter().cloned().collect();
        let wanted = &expected;
        let seen = poll(
            "the job log to show the expected jobs",
            CACHE_TIMEOUT,
            || async move {
                let seen = self.seen();
                if seen.is_superset(wanted) {
                    Ok(seen)
                } else {
                    Err(format!("jobs seen {seen:?}, wanted {wanted:?}"))
                }
            },
        )
        .await;
        assert_eq!(
            seen, expected,
            "the SidecarSet's jobs ever created: exactly {expected:?} wanted"
        );
    }
}

impl Drop for JobLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// --- The node daemon ------------------------------------------------------------------------------

type Verdicts = Arc<Mutex<BTreeMap<String, ImagePullPhase>>>;

/// Plays the node daemon of this test's nodes: every tag in a NodeImage's spec gets a status
/// at its spec version, `Pulling` unless the test finished the node with a verdict
/// ([`Daemon::finish`]), then that verdict. Looks every 100 ms; stopped when dropped.
struct Daemon {
    task: JoinHandle<()>,
    verdicts: Verdicts,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    fn spawn(env: &Env) -> Daemon {
        let api = Api::<NodeImage>::all(env.client.clone());
        let selector = format!("{CONTROLLED_LABEL}={}", env.run);
        let verdicts: Verdicts = Arc::default();
        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let (v, e) = (verdicts.clone(), errors.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tick.tick().await;
                if let Err(err) = answer(&api, &selector, &v).await {
                    e.lock().expect("daemon errors lock").push(err);
                }
            }
        });
        Daemon {
            task,
            verdicts,
            errors,
        }
    }

    /// From now on every tag on `node` reports `phase`.
    fn finish(&self, node: &str, phase: ImagePullPhase) {
        self.verdicts
            .lock()
            .expect("verdicts lock")
            .insert(node.to_owned(), phase);
    }

    fn assert_ok(&self) {
        let errors = self.errors.lock().expect("daemon errors lock").clone();
        assert!(
            errors.is_empty(),
            "the test's node daemon failed: {errors:?}"
        );
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tag_status(tag: &str, version: Option<i64>, phase: ImagePullPhase) -> Value {
    let now = Time(Timestamp::now());
    let mut status = json!({"tag": tag, "phase": phase, "startTime": now});
    if let Some(version) = version {
        status["version"] = json!(version);
    }
    match phase {
        ImagePullPhase::Succeeded => {
            status["completionTime"] = json!(now);
            status["progress"] = json!(100);
        }
        ImagePullPhase::Failed => {
            status["completionTime"] = json!(now);
            status["message"] = json!("failed by the test");
        }
        ImagePullPhase::Pulling | ImagePullPhase::Waiting => {}
    }
    status
}

/// One pass of the daemon over the NodeImages labelled `selector`.
async fn answer(api: &Api<NodeImage>, selector: &str, verdicts: &Verdicts) -> Result<(), String> {
    let list = api
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| format!("listing NodeImages {selector}: {e}"))?;
    for ni in list {
        let node = ni.name_any();
        let phase = verdicts
            .lock()
            .expect("verdicts lock")
            .get(&node)
            .copied()
            .unwrap_or(ImagePullPhase::Pulling);
        let status = ni.status.clone().unwrap_or_default();
        let mut images = serde_json::Map::new();
        for (image, spec) in &ni.spec.images {
            let current = status.image_statuses.get(image);
            let mut changed = false;
            let mut tags = Vec::new();
            for tag in &spec.tags {
                let existing = current.and_then(|s| s.tags.iter().find(|t| t.tag == tag.tag));
                match existing {
                    Some(e) if e.version == tag.version && e.phase == phase => {
                        tags.push(serde_json::to_value(e).expect("a tag status serializes"));
                    }
                    _ => {
                        changed = true;
                        tags.push(tag_status(&tag.tag, tag.version, phase));
                    }
                }
            }
            if changed {
                images.insert(image.to_string(), json!({"tags": tags}));
            }
        }
        if images.is_empty() {
            continue;
        }
        let patch = json!({
            "metadata": {"resourceVersion": ni.resource_version()},
            "status": {"imageStatuses": images},
        });
        match api
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Changed or gone meanwhile: the next pass looks again.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => return Err(format!("writing the status of NodeImage {node}: {e}")),
        }
    }
    Ok(())
}

/// The phase each of `nodes` reports for `image` (`<repository>:<tag>`) in its NodeImage status.
/// Waits until every one of `nodes` reports `image` Pulling.
async fn every_node_pulling(client: &Client, nodes: &[String], image: &str) {
    poll(
        "every node to report the new tag Pulling",
        ROLLOUT_TIMEOUT,
        || async move {
            let phases = reported_phases(client, nodes, image).await;
            phases
                .values()
                .all(|p| *p == Some(ImagePullPhase::Pulling))
                .then_some(())
                .ok_or_else(|| format!("phases {phases:?}"))
        },
    )
    .await;
}

async fn reported_phases(
    client: &Client,
    nodes: &[String],
    image: &str,
) -> BTreeMap<String, Option<ImagePullPhase>> {
    let (repository, tag) = image.rsplit_once(':').expect("an image with a tag");
    let api = Api::<NodeImage>::all(client.clone());
    let mut phases = BTreeMap::new();
    for node in nodes {
        let ni = api
            .get_opt(node)
            .await
            .unwrap_or_else(|e| panic!("reading NodeImage {node}: {e}"));
        let phase = ni.and_then(|ni| {
            ni.status?
                .image_statuses
                .get(repository)?
                .tags
                .iter()
                .find(|t| t.tag == tag)
                .map(|t| t.phase)
        });
        phases.insert(node.clone(), phase);
    }
    phases
}

// --- Events ---------------------------------------------------------------------------------------

/// How many times the event happened (a series counts each occurrence).
fn occurrences(event: &Event) -> i32 {
    event
        .series
        .as_ref()
        .and_then(|s| s.count)
        .or(event.count)
        .unwrap_or(1)
        .max(1)
}

/// Waits until the events of type `type_` and reason `reason` about SidecarSet `set` satisfy
/// `check`; returns them.
async fn wait_events(
    client: &Client,
    set: &str,
    type_: &str,
    reason: &str,
    check: impl Fn(&[Event]) -> Result<(), String>,
) -> Vec<Event> {
    let api = Api::<Event>::all(client.clone());
    let params =
        ListParams::default().fields(&format!("involvedObject.name={set},reason={reason}"));
    let (api, params, check) = (&api, &params, &check);
    poll(
        &format!("{type_} events {reason} about SidecarSet {set}"),
        ROLLOUT_TIMEOUT,
        || async move {
            let events: Vec<Event> = api
                .list(params)
                .await
                .unwrap_or_else(|e| panic!("listing events: {e}"))
                .items
                .into_iter()
                .filter(|e| {
                    e.type_.as_deref() == Some(type_)
                        && e.involved_object.kind.as_deref() == Some("SidecarSet")
                })
                .collect();
            let messages: Vec<String> = events
                .iter()
                .map(|e| format!("{:?} x{}", e.message, occurrences(e)))
                .collect();
            check(&events).map_err(|e| format!("{e}; events: {messages:?}"))?;
            Ok(events)
        },
    )
    .await
}

fn at_least_one(events: &[Event]) -> Result<(), String> {
    (!events.is_empty())
        .then_some(())
        .ok_or_else(|| "no such event".to_owned())
}

// --- The tests ------------------------------------------------------------------------------------

/// An image change creates one job in the manager's namespace, shaped as the contract says,
/// listing the old pods' nodes; a paused rollout still pulls. Once unpaused, the pods are
/// upgraded one by one (maxUnavailable 1) in exactly the order of the job's `selector.names`,
/// and the completed rollout deletes the job.
#[tokio::test]
async fn the_job_lists_the_old_pods_nodes_in_the_order_the_rollout_upgrades_them() {
    let env = Env::new("pd-order", 1).await;
    let nodes = env.nodes(4).await;
    let daemon = Daemon::spawn(&env);
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[PROXY]);
    let set = create_sidecarset(&env.client, &spec).await;
    let pods = env.start_pods(&set, &nodes).await;
    env.wait("the four pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(4, 4, 4, 4))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({"paused": true}))
        .await;
    let view = env
        .wait(
            "one pre-download job while the rollout is paused",
            Kubelet::Off,
            |v| {
                v.expect_counts(counts(4, 0, 4, 0))?;
                v.expect_condition(ROLLOUT_HELD, "True", "Paused")?;
                v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")?;
                v.expect_jobs(1)
            },
        )
        .await;
    let job = view.jobs[0].clone();
    check_job(
        &job,
        &view.set,
        &Want {
            ordered: false,
            ..Want::new(PROXY, &new_image, &nodes)
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        view.pods_on(PROXY, &new_image).is_empty(),
        "paused: no pod may be upgraded; {}",
        view.describe()
    );
    wait_events(
        &env.client,
        &env.name,
        "Normal",
        "CreatedImagePullJob",
        at_least_one,
    )
    .await;

    // The progress is counted over the target nodes; paused, no pod leaves them.
    daemon.finish(&nodes[0], ImagePullPhase::Succeeded);
    env.wait("one node to have pulled", Kubelet::Off, |v| {
        v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")?;
        let message = condition_message(&v.set, PRE_DOWNLOAD);
        let counted = "on 4 node(s): 1 succeeded, 0 failed";
        message
            .contains(counted)
            .then_some(())
            .ok_or_else(|| format!("a message saying {counted:?} wanted: {message:?}"))
    })
    .await;
    // A failed pull is finished too (kubelet pulls when the pod restarts, as without
    // pre-download).
    daemon.finish(&nodes[1], ImagePullPhase::Failed);
    for node in &nodes[2..] {
        daemon.finish(node, ImagePullPhase::Succeeded);
    }
    env.wait("every node to have finished", Kubelet::Off, |v| {
        v.expect_condition(PRE_DOWNLOAD, "True", "Pulled")?;
        let upgraded = v.pods_on(PROXY, &new_image);
        (upgraded.is_empty())
            .then_some(())
            .ok_or_else(|| format!("paused, yet pods {upgraded:?} were upgraded"))
    })
    .await;

    update_spec(
        &env.client,
        &env.name,
        json!({"updateStrategy": {"paused": false}}),
    )
    .await;
    let order = env.upgrade_order(4, PROXY, &new_image).await;
    let node_of = |pod: &String| {
        let i = pods
            .iter()
            .position(|p| p == pod)
            .expect("a pod of the test");
        nodes[i].clone()
    };
    let upgraded_nodes: Vec<String> = order.iter().map(node_of).collect();
    assert_eq!(
        job_nodes(&job),
        upgraded_nodes,
        "the job's selector.names must be the nodes in the order the rollout upgraded their pods"
    );
    assert_eq!(
        order, pods,
        "the rollout reaches the most recently Ready pod first (ActivePods order)"
    );

    env.wait(
        "the rollout complete and its job deleted",
        Kubelet::On,
        |v| {
            v.expect_counts(counts(4, 4, 4, 4))?;
            v.expect_condition(ROLLOUT_HELD, "False", "Updated")?;
            v.expect_condition(PRE_DOWNLOAD, "False", "NothingToPull")?;
            v.expect_jobs(0)
        },
    )
    .await;
    log.expect_exactly(&[job_key(&job)]).await;
    daemon.assert_ok();
    check_completion_type(&job).unwrap_or_else(|e| panic!("{e}"));
}

/// A weight priority changes the rollout order, and the job's node order with it: the order
/// seen without priority, reversed by weights, is the order of the next revision's job. That
/// newer revision gets a job of its own (its name and hash), and the superseded job is deleted.
#[tokio::test]
async fn a_weight_priority_reorders_the_nodes_and_a_newer_revision_replaces_the_job() {
    let env = Env::new("pd-priority", 1).await;
    let nodes = env.nodes(4).await;
    let daemon = Daemon::spawn(&env);
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[PROXY]);
    let set = create_sidecarset(&env.client, &spec).await;
    for (i, node) in nodes.iter().enumerate() {
        env.start_pod(0, &set, node, json!({"rank": format!("r{i}")}), i)
            .await;
    }
    env.wait("the four pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(4, 4, 4, 4))
    })
    .await;

    env.set_images(&mut spec, &[(PROXY, "2")], json!({"paused": true}))
        .await;
    let image2 = env.image(PROXY, "2");
    let first = env
        .wait("the first revision's job", Kubelet::Off, |v| {
            v.expect_jobs(1)?;
            check_job(
                &v.jobs[0],
                &v.set,
                &Want {
                    ordered: false,
                    ..Want::new(PROXY, &image2, &nodes)
                },
            )
        })
        .await;
    let first_job = first.jobs[0].clone();
    let default_order = job_nodes(&first_job);

    // Heavier weights for the nodes reached later: the priority order is the reverse.
    let weights: Vec<Value> = default_order
        .iter()
        .enumerate()
        .map(|(k, node)| {
            let i = nodes
                .iter()
                .position(|n| n == node)
                .expect("a node of the test");
            let weight = i32::try_from(k + 1).expect("small") * 10;
            json!({"weight": weight, "matchSelector": {"matchLabels": {"rank": format!("r{i}")}}})
        })
        .collect();
    let reversed: Vec<String> = default_order.iter().rev().cloned().collect();
    env.set_images(
        &mut spec,
        &[(PROXY, "3")],
        json!({"priorityStrategy": {"weightPriority": weights}}),
    )
    .await;
    let image3 = env.image(PROXY, "3");
    let first_revision = latest_revision(&first.set);
    let second = env
        .wait(
            "the newer revision's job, in priority order, alone",
            Kubelet::Off,
            |v| {
                if latest_revision(&v.set) == first_revision {
                    return Err("latestRevision not moved on yet".to_owned());
                }
                v.expect_jobs(1)?;
                check_job(&v.jobs[0], &v.set, &Want::new(PROXY, &image3, &reversed))
            },
        )
        .await;
    let second_job = &second.jobs[0];
    assert_ne!(second_job.name_any(), first_job.name_any());
    assert_ne!(
        second_job.labels().get(CONTROLLER_REVISION_HASH),
        first_job.labels().get(CONTROLLER_REVISION_HASH)
    );
    assert!(
        second.pods_on(PROXY, &image2).is_empty() && second.pods_on(PROXY, &image3).is_empty(),
        "paused: no pod may be upgraded; {}",
        second.describe()
    );
    log.expect_exactly(&[job_key(&first_job), job_key(second_job)])
        .await;
    daemon.assert_ok();
}

/// The rollout waits for the pull: with every node pulling, no pod is upgraded (RolloutHeld
/// WaitingForPreDownload) although maxUnavailable would allow one. A node that reports the new
/// tag Succeeded lets its pod go, even when it is not the first one in the rollout order; a
/// Failed pull does too, and so does a node that has no NodeImage any more. Then the job goes.
#[tokio::test]
async fn each_pod_waits_until_its_node_has_pulled_the_new_image() {
    let env = Env::new("pd-wait", 1).await;
    let nodes = env.nodes(3).await;
    let daemon = Daemon::spawn(&env);
    let mut spec = env.set_spec(&[PROXY]);
    spec["metadata"]["annotations"] = json!({IMAGE_PREDOWNLOAD_PARALLELISM: "3"});
    let set = create_sidecarset(&env.client, &spec).await;
    let pods = env.start_pods(&set, &nodes).await;
    env.wait("the three pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(3, 3, 3, 3))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    let view = env
        .wait("the job, and the rollout held for it", Kubelet::On, |v| {
            v.expect_jobs(1)?;
            v.expect_counts(counts(3, 0, 3, 0))?;
            v.expect_condition(ROLLOUT_HELD, "True", "WaitingForPreDownload")?;
            v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")
        })
        .await;
    check_job(
        &view.jobs[0],
        &view.set,
        &Want {
            parallelism: 3,
            ..Want::new(PROXY, &new_image, &nodes)
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Every node pulls (parallelism 3) and says so: still nothing is upgraded.
    every_node_pulling(&env.client, &nodes, &new_image).await;
    env.wait("the rollout still held", Kubelet::On, |v| {
        v.expect_counts(counts(3, 0, 3, 0))?;
        v.expect_condition(ROLLOUT_HELD, "True", "WaitingForPreDownload")?;
        v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")?;
        let message = condition_message(&v.set, PRE_DOWNLOAD);
        let counted = "on 3 node(s): 0 succeeded, 0 failed";
        message
            .contains(counted)
            .then_some(())
            .ok_or_else(|| format!("a message saying {counted:?} wanted: {message:?}"))
    })
    .await;

    // The second node in rollout order finishes first: its pod goes, the first one waits.
    daemon.finish(&nodes[1], ImagePullPhase::Succeeded);
    let view = env
        .wait(
            "the pod of the node that pulled upgraded",
            Kubelet::On,
            |v| {
                v.expect_counts(counts(3, 1, 3, 1))?;
                v.expect_condition(ROLLOUT_HELD, "True", "WaitingForPreDownload")?;
                v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")
            },
        )
        .await;
    assert_eq!(
        view.pods_on(PROXY, &new_image),
        BTreeSet::from([pods[1].clone()]),
        "only the pod whose node pulled may be upgraded; {}",
        view.describe()
    );

    // A failed pull lets the pod go too (kubelet pulls then, as without pre-download).
    daemon.finish(&nodes[0], ImagePullPhase::Failed);
    let view = env
        .wait(
            "the pod of the node whose pull failed upgraded",
            Kubelet::On,
            |v| {
                v.expect_counts(counts(3, 2, 3, 2))?;
                v.expect_condition(ROLLOUT_HELD, "True", "WaitingForPreDownload")
            },
        )
        .await;
    assert_eq!(
        view.pods_on(PROXY, &new_image),
        BTreeSet::from([pods[0].clone(), pods[1].clone()]),
        "{}",
        view.describe()
    );

    // The last node goes away, and its NodeImage with it: nothing to wait for.
    Api::<Node>::all(env.client.clone())
        .delete(&nodes[2], &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting Node {}: {e}", nodes[2]));
    env.wait(
        "the last pod upgraded once its node has no NodeImage, and the job deleted",
        Kubelet::On,
        |v| {
            v.expect_counts(counts(3, 3, 3, 3))?;
            v.expect_condition(ROLLOUT_HELD, "False", "Updated")?;
            v.expect_jobs(0)
        },
    )
    .await;
    daemon.assert_ok();
}

/// A pod waits for its node's pull no longer than the per-pull timeout after the job's entry
/// reached the node, whatever the daemon says meanwhile: here every node reports `Pulling`
/// for good (as one whose pull slots other tenants' slow jobs hold reports `Waiting`), and the
/// rollout goes on after the 2 s the SidecarSet allows, the kubelet pulling as without
/// pre-download. Before the bound, the pods waited for the tags' own deadline: 30 minutes and
/// more for pre-download's `Never` jobs.
#[tokio::test]
async fn a_pod_stops_waiting_for_its_nodes_pull_after_the_pull_timeout() {
    let env = Env::new("pd-bound", 1).await;
    let nodes = env.nodes(2).await;
    let daemon = Daemon::spawn(&env);
    let mut spec = env.set_spec(&[PROXY]);
    spec["metadata"]["annotations"] = json!({
        IMAGE_PREDOWNLOAD_PARALLELISM: "2",
        IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS: "2",
    });
    let set = create_sidecarset(&env.client, &spec).await;
    env.start_pods(&set, &nodes).await;
    env.wait("the two pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(2, 2, 2, 2))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    every_node_pulling(&env.client, &nodes, &new_image).await;
    env.wait(
        "both pods upgraded though no node finished pulling",
        Kubelet::On,
        |v| {
            v.expect_counts(counts(2, 2, 2, 2))?;
            let upgraded = v.pods_on(PROXY, &new_image);
            (upgraded.len() == 2)
                .then_some(())
                .ok_or_else(|| format!("pods on the new image: {upgraded:?}"))
        },
    )
    .await;
    let phases = reported_phases(&env.client, &nodes, &new_image).await;
    assert!(
        phases.values().all(|p| *p == Some(ImagePullPhase::Pulling)),
        "the nodes never finished: {phases:?}"
    );
    daemon.assert_ok();
}

/// The parallelism and timeout annotations become the job's `parallelism` and
/// `pullPolicy.timeoutSeconds`, and changing them patches the existing job (same object). A
/// name past 63 characters is shortened (names stay distinct per container). Only changed
/// containers get a job; a newer revision changing both sidecars gets one job per container.
#[tokio::test]
async fn the_annotations_shape_the_job_and_changing_them_patches_it() {
    // Two sidecars whose names only differ at the end, on a SidecarSet with a long name.
    const MAIN: &str = "a-sidecar-container-whose-name-is-long-enough-main";
    const LOGS: &str = "a-sidecar-container-whose-name-is-long-enough-logs";
    let mut env = Env::new("pd-knobs", 1).await;
    env.name = unique_name("pd-knobs-a-sidecarset-name-long-enough-to-need-shortening");
    let nodes = env.nodes(2).await;
    let daemon = Daemon::spawn(&env);
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[MAIN, LOGS]);
    spec["metadata"]["annotations"] = json!({
        IMAGE_PREDOWNLOAD_PARALLELISM: "2",
        IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS: "45",
    });
    let set = create_sidecarset(&env.client, &spec).await;
    env.start_pods(&set, &nodes).await;
    env.wait("the two pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(2, 2, 2, 2))
    })
    .await;

    let main2 = env.image(MAIN, "2");
    env.set_images(&mut spec, &[(MAIN, "2")], json!({})).await;
    let view = env
        .wait(
            "one job, for the changed container only",
            Kubelet::Off,
            |v| {
                v.expect_jobs(1)?;
                check_job(
                    v.job(MANAGER_NAMESPACE, MAIN)?,
                    &v.set,
                    &Want {
                        parallelism: 2,
                        timeout_seconds: 45,
                        ..Want::new(MAIN, &main2, &nodes)
                    },
                )
            },
        )
        .await;
    let job = view.jobs[0].clone();

    env.annotate(json!({
        IMAGE_PREDOWNLOAD_PARALLELISM: "1",
        IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS: "90",
    }))
    .await;
    let view = env
        .wait(
            "the job patched with the new annotations",
            Kubelet::Off,
            |v| {
                v.expect_jobs(1)?;
                check_job(
                    v.job(MANAGER_NAMESPACE, MAIN)?,
                    &v.set,
                    &Want {
                        timeout_seconds: 90,
                        ..Want::new(MAIN, &main2, &nodes)
                    },
                )
            },
        )
        .await;
    assert_eq!(
        view.jobs[0].metadata.uid, job.metadata.uid,
        "the same job, patched, not a new one"
    );

    let (main3, logs2) = (env.image(MAIN, "3"), env.image(LOGS, "2"));
    env.set_images(&mut spec, &[(MAIN, "3"), (LOGS, "2")], json!({}))
        .await;
    let revision = latest_revision(&view.set);
    let view = env
        .wait(
            "one job per changed container for the newer revision",
            Kubelet::Off,
            |v| {
                if latest_revision(&v.set) == revision {
                    return Err("latestRevision not moved on yet".to_owned());
                }
                v.expect_jobs(2)?;
                for (container, image) in [(MAIN, &main3), (LOGS, &logs2)] {
                    check_job(
                        v.job(MANAGER_NAMESPACE, container)?,
                        &v.set,
                        &Want {
                            timeout_seconds: 90,
                            ..Want::new(container, image, &nodes)
                        },
                    )?;
                }
                Ok(())
            },
        )
        .await;
    assert_ne!(
        view.jobs[0].name_any(),
        view.jobs[1].name_any(),
        "shortened names must stay distinct"
    );
    let mut expected: Vec<String> = view.jobs.iter().map(job_key).collect();
    expected.push(job_key(&job));
    log.expect_exactly(&expected).await;
    daemon.assert_ok();
}

/// Bad annotation values give a Warning event each, naming the annotation, the value and the
/// default used, and the defaults apply: parallelism 1, timeout 300 s, and no min-ready gate.
#[tokio::test]
async fn bad_annotations_warn_and_fall_back_to_the_defaults() {
    let env = Env::new("pd-bad", 1).await;
    let nodes = env.nodes(2).await;
    let daemon = Daemon::spawn(&env);
    let mut spec = env.set_spec(&[PROXY]);
    let bad = [
        (IMAGE_PREDOWNLOAD_PARALLELISM, "50%", "1"),
        (IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS, "0", "300"),
        (IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS, "-1", "0"),
    ];
    let annotations: serde_json::Map<String, Value> = bad
        .iter()
        .map(|(key, value, _)| ((*key).to_owned(), json!(value)))
        .collect();
    spec["metadata"]["annotations"] = Value::Object(annotations);
    let set = create_sidecarset(&env.client, &spec).await;
    env.start_pods(&set, &nodes).await;
    env.wait("the two pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(2, 2, 2, 2))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    env.wait("a job with the default knobs", Kubelet::Off, |v| {
        v.expect_jobs(1)?;
        check_job(&v.jobs[0], &v.set, &Want::new(PROXY, &new_image, &nodes))
    })
    .await;
    let bad = &bad;
    wait_events(
        &env.client,
        &env.name,
        "Warning",
        "InvalidPreDownloadAnnotation",
        |events| {
            let messages: Vec<String> = events
                .iter()
                .map(|e| e.message.clone().unwrap_or_default())
                .collect();
            let missing: Vec<&str> = bad
                .iter()
                .filter(|(key, value, default)| {
                    !messages
                        .iter()
                        .any(|m| m.contains(key) && m.contains(value) && m.contains(default))
                })
                .map(|(key, _, _)| *key)
                .collect();
            missing.is_empty().then_some(()).ok_or_else(|| {
                format!("no event naming annotation, value and default for {missing:?}")
            })
        },
    )
    .await;
    daemon.assert_ok();
}

/// `min-updated-ready-pods` 20% of 4 pods rounds up to 1: no job, and a rollout not held by the
/// pre-download, until one pod is updated and ready (the canary); then a job for the other
/// pods' nodes, which stays when the canary stops being ready.
#[tokio::test]
async fn no_job_until_enough_updated_pods_are_ready() {
    let env = Env::new("pd-minready", 1).await;
    let nodes = env.nodes(4).await;
    let daemon = Daemon::spawn(&env);
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[PROXY]);
    spec["metadata"]["annotations"] = json!({IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS: "20%"});
    let set = create_sidecarset(&env.client, &spec).await;
    let pods = env.start_pods(&set, &nodes).await;
    env.wait("the four pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(4, 4, 4, 4))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    let view = env
        .wait(
            "the canary upgraded without a job (the gate is closed)",
            Kubelet::Off,
            |v| {
                v.expect_counts(counts(4, 1, 3, 0))?;
                v.expect_condition(PRE_DOWNLOAD, "False", "WaitingForUpdatedReadyPods")?;
                v.expect_condition(ROLLOUT_HELD, "True", "MaxUnavailableReached")?;
                v.expect_jobs(0)
            },
        )
        .await;
    let message = condition_message(&view.set, PRE_DOWNLOAD);
    assert!(
        message.contains('1') && message.contains('0'),
        "the message must say 1 pod is needed and 0 are there: {message:?}"
    );
    assert_eq!(
        view.pods_on(PROXY, &new_image),
        BTreeSet::from([pods[0].clone()]),
        "the first pod of the rollout is the canary; {}",
        view.describe()
    );
    assert!(
        log.seen().is_empty(),
        "no job while the gate is closed: {:?}",
        log.seen()
    );

    kubelet::restart_changed(&env.pods(0), &pods[0]).await;
    let view = env
        .wait(
            "a job for the remaining pods' nodes once the canary is ready",
            Kubelet::Off,
            |v| {
                v.expect_counts(counts(4, 1, 4, 1))?;
                v.expect_jobs(1)?;
                v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")?;
                v.expect_condition(ROLLOUT_HELD, "True", "WaitingForPreDownload")?;
                check_job(
                    &v.jobs[0],
                    &v.set,
                    &Want::new(PROXY, &new_image, &nodes[1..]),
                )
            },
        )
        .await;
    let job = view.jobs[0].clone();
    assert_eq!(
        view.pods_on(PROXY, &new_image).len(),
        1,
        "the others wait for their nodes; {}",
        view.describe()
    );

    // The canary stops being ready: the count drops below the gate, the job stays. A knob
    // change then proves a later reconcile kept (and patched) it.
    write_ready(&env.pods(0), &pods[0], false, Timestamp::now()).await;
    env.wait("the canary counted not ready", Kubelet::Off, |v| {
        v.expect_counts(counts(4, 1, 3, 0))?;
        v.expect_jobs(1)
    })
    .await;
    env.annotate(json!({IMAGE_PREDOWNLOAD_PARALLELISM: "2"}))
        .await;
    env.wait(
        "the job kept and patched although the gate would be closed now",
        Kubelet::Off,
        |v| {
            v.expect_counts(counts(4, 1, 3, 0))?;
            v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")?;
            v.expect_jobs(1)?;
            let parallelism =
                serde_json::to_value(&v.jobs[0].spec.template.parallelism).unwrap_or_default();
            (parallelism == json!(2))
                .then_some(())
                .ok_or_else(|| format!("parallelism 2 wanted, found {parallelism}"))
        },
    )
    .await;
    log.expect_exactly(&[job_key(&job)]).await;
    daemon.assert_ok();
}

/// `type: NotUpdate` skips the pre-download (and deletes a job made before), and so does a
/// rollout that upgrades every pod in one batch (maxUnavailable 100%), even paused: condition
/// and Normal event `ImagePreDownloadSkipped` each time, no new job, and the one batch then
/// upgrades every pod without waiting.
#[tokio::test]
async fn not_update_and_one_batch_strategies_skip_the_pre_download() {
    let env = Env::new("pd-skip", 1).await;
    let nodes = env.nodes(3).await;
    let daemon = Daemon::spawn(&env);
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[PROXY]);
    let set = create_sidecarset(&env.client, &spec).await;
    env.start_pods(&set, &nodes).await;
    env.wait("the three pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(3, 3, 3, 3))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({"paused": true}))
        .await;
    let view = env
        .wait("a job while paused", Kubelet::Off, |v| v.expect_jobs(1))
        .await;
    let job = view.jobs[0].clone();

    update_spec(
        &env.client,
        &env.name,
        json!({"updateStrategy": {"type": "NotUpdate", "paused": false}}),
    )
    .await;
    env.wait(
        "NotUpdate: the pre-download skipped and its job deleted",
        Kubelet::On,
        |v| {
            v.expect_counts(counts(3, 0, 3, 0))?;
            v.expect_condition(PRE_DOWNLOAD, "False", "NotUpdateStrategy")?;
            v.expect_condition(ROLLOUT_HELD, "True", "NotUpdateStrategy")?;
            v.expect_jobs(0)
        },
    )
    .await;
    wait_events(
        &env.client,
        &env.name,
        "Normal",
        "ImagePreDownloadSkipped",
        at_least_one,
    )
    .await;

    update_spec(
        &env.client,
        &env.name,
        json!({"updateStrategy": {"type": "RollingUpdate", "maxUnavailable": "100%", "paused": true}}),
    )
    .await;
    env.wait(
        "one batch: the pre-download skipped, even paused",
        Kubelet::On,
        |v| {
            v.expect_counts(counts(3, 0, 3, 0))?;
            v.expect_condition(PRE_DOWNLOAD, "False", "OneBatch")?;
            v.expect_jobs(0)
        },
    )
    .await;
    wait_events(
        &env.client,
        &env.name,
        "Normal",
        "ImagePreDownloadSkipped",
        |events| {
            let n: i32 = events.iter().map(occurrences).sum();
            (n >= 2)
                .then_some(())
                .ok_or_else(|| format!("a second skip wanted, {n} seen"))
        },
    )
    .await;

    update_spec(
        &env.client,
        &env.name,
        json!({"updateStrategy": {"paused": false}}),
    )
    .await;
    let view = env
        .wait(
            "every pod upgraded in one batch, no job",
            Kubelet::On,
            |v| {
                v.expect_counts(counts(3, 3, 3, 3))?;
                v.expect_condition(ROLLOUT_HELD, "False", "Updated")?;
                v.expect_jobs(0)
            },
        )
        .await;
    assert_eq!(view.pods_on(PROXY, &new_image).len(), 3);
    log.expect_exactly(&[job_key(&job)]).await;
    daemon.assert_ok();
}

/// A manager run with `--sidecarset-predownload=false` rolls out as upstream does: no job ever,
/// and no pod waits, although every node has a NodeImage (and no daemon, so with pre-download on
/// the pods would wait for the pulls until the response timeout). The SidecarSet and the Nodes
/// are left to a second set of controllers of this test's own, confined to a label the webhook
/// cluster's controllers do not select.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_pre_download_off_no_job_is_created_and_nothing_waits() {
    const OFF_LABEL: &str = "kruise-rs-test-predownload-off";
    let env = Env::new("pd-off", 1).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controllers = tokio::spawn(kruise_rs::controllers::run(
        env.client.clone(),
        kruise_rs::controllers::ControllerOptions {
            namespace: MANAGER_NAMESPACE.to_owned(),
            label_selector: Some(OFF_LABEL.to_owned()),
            nodeimage_creation_delay: Duration::ZERO,
            sidecarset_predownload: false,
            ..kruise_rs::controllers::ControllerOptions::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let nodes = env.nodes_labelled(3, OFF_LABEL).await;
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[PROXY]);
    spec["metadata"]["labels"] = json!({OFF_LABEL: env.name});
    let set = create_sidecarset(&env.client, &spec).await;
    env.start_pods(&set, &nodes).await;
    env.wait("the three pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(3, 3, 3, 3))?;
        v.expect_condition(PRE_DOWNLOAD, "False", "Disabled")
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    let view = env
        .wait(
            "every pod upgraded one at a time without a pull",
            Kubelet::On,
            |v| {
                v.expect_counts(counts(3, 3, 3, 3))?;
                v.expect_condition(ROLLOUT_HELD, "False", "Updated")?;
                v.expect_condition(PRE_DOWNLOAD, "False", "Disabled")?;
                v.expect_jobs(0)
            },
        )
        .await;
    assert_eq!(
        view.pods_on(PROXY, &new_image).len(),
        3,
        "{}",
        view.describe()
    );
    let message = condition_message(&view.set, PRE_DOWNLOAD);
    assert!(
        message.contains("--sidecarset-predownload=false"),
        "{message}"
    );
    // Every node has a NodeImage (a pod would wait for it with pre-download on), and none was
    // ever asked for the new image.
    let (repository, _) = new_image.rsplit_once(':').expect("a tag");
    let nodeimages = Api::<NodeImage>::all(env.client.clone());
    for node in &nodes {
        let nodeimage = nodeimages
            .get(node)
            .await
            .unwrap_or_else(|e| panic!("reading NodeImage {node}: {e}"));
        assert!(
            !nodeimage.spec.images.contains_key(repository),
            "NodeImage {node} was asked for {repository}: {:?}",
            nodeimage.spec.images
        );
    }
    log.expect_exactly(&[]).await;

    stop.send(()).expect("the controllers still run");
    tokio::time::timeout(Duration::from_secs(30), controllers)
        .await
        .expect("the controllers stop")
        .expect("join");
}

/// A partition keeps the last pods of the rollout order out of the job; lowering it appends
/// their nodes, keeping the first ones where they were.
#[tokio::test]
async fn lowering_the_partition_appends_nodes_to_the_job() {
    let env = Env::new("pd-partition", 1).await;
    let nodes = env.nodes(4).await;
    let daemon = Daemon::spawn(&env);
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[PROXY]);
    let set = create_sidecarset(&env.client, &spec).await;
    env.start_pods(&set, &nodes).await;
    env.wait("the four pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(4, 4, 4, 4))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({"partition": 2}))
        .await;
    let view = env
        .wait(
            "a job for the two pods the partition lets go",
            Kubelet::Off,
            |v| {
                v.expect_jobs(1)?;
                check_job(
                    &v.jobs[0],
                    &v.set,
                    &Want::new(PROXY, &new_image, &nodes[..2]),
                )
            },
        )
        .await;
    let job = view.jobs[0].clone();

    update_spec(
        &env.client,
        &env.name,
        json!({"updateStrategy": {"partition": 0}}),
    )
    .await;
    let view = env
        .wait(
            "the job extended to every node once the partition is 0",
            Kubelet::Off,
            |v| {
                v.expect_jobs(1)?;
                check_job(&v.jobs[0], &v.set, &Want::new(PROXY, &new_image, &nodes))
            },
        )
        .await;
    assert_eq!(view.jobs[0].metadata.uid, job.metadata.uid, "the same job");
    log.expect_exactly(&[job_key(&job)]).await;
    daemon.assert_ok();
}

/// Creates the pull secret of the private-image tests in `namespace`.
async fn create_pull_secret(client: &Client, namespace: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": PULL_SECRET},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": r#"{"auths":{"127.0.0.1:5000":{"auth":"dXNlcjpwYXNz"}}}"#},
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("creating Secret {PULL_SECRET} in {namespace}: {e}"));
}

/// The namespace the ImagePullJob controller copies pull secrets into, unless it exists.
async fn ensure_daemon_config_namespace(client: &Client) {
    crate::harness::objects::create_namespace(client, DAEMON_CONFIG_NAMESPACE, &[])
        .await
        .unwrap_or_else(|e| panic!("creating namespace {DAEMON_CONFIG_NAMESPACE}: {e}"));
}

/// With `imagePullSecrets`, the jobs live in the pods' namespaces, one per namespace with
/// target pods, carrying the secrets; a node shared by both namespaces is pulled by the job of
/// the namespace whose pod the rollout reaches first.
#[tokio::test]
async fn private_images_get_one_job_per_pod_namespace_with_the_pull_secrets() {
    let env = Env::new("pd-private", 2).await;
    ensure_daemon_config_namespace(&env.client).await;
    for namespace in &env.namespaces {
        create_pull_secret(&env.client, namespace).await;
    }
    let nodes = env.nodes(3).await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let daemon = Daemon::spawn(&env);
    let mut spec = env.set_spec(&[PROXY]);
    spec["spec"]["imagePullSecrets"] = json!([{"name": PULL_SECRET}]);
    let set = create_sidecarset(&env.client, &spec).await;
    // Rollout order: (ns0, a), (ns1, b), (ns0, b), (ns1, c).
    env.start_pod(0, &set, a, json!({}), 0).await;
    env.start_pod(1, &set, b, json!({}), 1).await;
    env.start_pod(0, &set, b, json!({}), 2).await;
    env.start_pod(1, &set, c, json!({}), 3).await;
    env.wait("the four pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(4, 4, 4, 4))
    })
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    let (ns0, ns1) = (&env.namespaces[0], &env.namespaces[1]);
    let (first, second) = ([a.clone()], [b.clone(), c.clone()]);
    let view = env
        .wait(
            "one job per pod namespace, with the pull secrets",
            Kubelet::Off,
            |v| {
                v.expect_jobs(2)?;
                for (namespace, nodes) in [(ns0, &first[..]), (ns1, &second[..])] {
                    check_job(
                        v.job(namespace, PROXY)?,
                        &v.set,
                        &Want {
                            namespace,
                            pull_secrets: &[PULL_SECRET],
                            ..Want::new(PROXY, &new_image, nodes)
                        },
                    )?;
                }
                Ok(())
            },
        )
        .await;
    assert!(
        view.pods_on(PROXY, &new_image).is_empty(),
        "every node is still pulling: no pod may be upgraded; {}",
        view.describe()
    );
    daemon.assert_ok();
}

/// A job the apiserver refuses to create (an object-count quota of 0 for ImagePullJobs in the
/// pods' namespace) gives a Warning event `FailedCreateImagePullJob`; once the quota is gone,
/// the retried create makes the job.
#[tokio::test]
async fn a_refused_job_create_is_retried_until_it_succeeds() {
    let env = Env::new("pd-retry", 1).await;
    ensure_daemon_config_namespace(&env.client).await;
    let namespace = env.namespaces[0].clone();
    create_pull_secret(&env.client, &namespace).await;
    let nodes = env.nodes(2).await;
    let daemon = Daemon::spawn(&env);
    let mut spec = env.set_spec(&[PROXY]);
    spec["spec"]["imagePullSecrets"] = json!([{"name": PULL_SECRET}]);
    let set = create_sidecarset(&env.client, &spec).await;
    env.start_pods(&set, &nodes).await;
    env.wait("the two pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(2, 2, 2, 2))
    })
    .await;

    // No controller-manager computes quota usage here: the test writes it.
    let quotas = Api::<ResourceQuota>::namespaced(env.client.clone(), &namespace);
    let quota: ResourceQuota = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-imagepulljobs"},
        "spec": {"hard": {JOB_COUNT_QUOTA: "0"}},
    }))
    .expect("a ResourceQuota");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .unwrap_or_else(|e| panic!("creating the quota: {e}"));
    let usage = json!({"status": {"hard": {JOB_COUNT_QUOTA: "0"}, "used": {JOB_COUNT_QUOTA: "0"}}});
    quotas
        .patch_status(
            "no-imagepulljobs",
            &PatchParams::default(),
            &Patch::Merge(&usage),
        )
        .await
        .unwrap_or_else(|e| panic!("writing the quota's usage: {e}"));
    // The quota is in force once the apiserver refuses a job of ours (one no controller
    // handles: it lacks the controlled label).
    let probe: ImagePullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "ImagePullJob",
        "metadata": {"name": "quota-probe"},
        "spec": {
            "image": env.image("probe", "1"),
            "selector": {"names": [format!("{}-nowhere", env.run)]},
            "completionPolicy": {"type": "Never"},
        },
    }))
    .expect("an ImagePullJob");
    let jobs = Api::<ImagePullJob>::namespaced(env.client.clone(), &namespace);
    let (jobs_ref, probe_ref) = (&jobs, &probe);
    poll(
        "the quota to refuse ImagePullJobs",
        CACHE_TIMEOUT,
        || async move {
            match jobs_ref.create(&PostParams::default(), probe_ref).await {
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
                Ok(_) => {
                    let _ = jobs_ref
                        .delete("quota-probe", &DeleteParams::default())
                        .await;
                    Err("the probe job was created".to_owned())
                }
                Err(e) => Err(format!("creating the probe job: {e}")),
            }
        },
    )
    .await;

    let new_image = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    wait_events(
        &env.client,
        &env.name,
        "Warning",
        "FailedCreateImagePullJob",
        at_least_one,
    )
    .await;
    let view = env
        .wait("no job while the quota refuses it", Kubelet::Off, |v| {
            v.expect_jobs(0)
        })
        .await;
    assert!(
        view.pods_on(PROXY, &new_image).is_empty(),
        "{}",
        view.describe()
    );

    quotas
        .delete("no-imagepulljobs", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the quota: {e}"));
    env.wait(
        "the job created once the quota is gone",
        Kubelet::Off,
        |v| {
            v.expect_jobs(1)?;
            check_job(
                &v.jobs[0],
                &v.set,
                &Want {
                    namespace: &namespace,
                    pull_secrets: &[PULL_SECRET],
                    ..Want::new(PROXY, &new_image, &nodes)
                },
            )
        },
    )
    .await;
    daemon.assert_ok();
}

/// A hot-upgrade sidecar (issue 18): its new image is pre-downloaded under the sidecar's own
/// name (`proxy`, not a twin's), the empty image never is, and each pod waits for its node's
/// pull before its idle twin gets the image. A later image change needs a pull on every node
/// again: the working twin runs the previous image, the idle one the empty image.
#[tokio::test]
async fn a_hot_sidecar_image_is_pulled_before_its_idle_twin_is_upgraded() {
    let env = Env::new("pd-hot", 1).await;
    let nodes = env.nodes(2).await;
    let daemon = Daemon::spawn(&env);
    let log = JobLog::spawn(&env.client, &env.name);
    let mut spec = env.set_spec(&[PROXY]);
    spec["spec"]["containers"][0]["upgradeStrategy"] =
        json!({"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "busybox:1.36"});
    let set = create_sidecarset(&env.client, &spec).await;
    let pods = env.start_pods(&set, &nodes).await;
    env.wait("the two pods counted", Kubelet::Off, |v| {
        v.expect_counts(counts(2, 2, 2, 2))
    })
    .await;
    let idle = format!("{PROXY}-2");

    let image2 = env.image(PROXY, "2");
    env.set_images(&mut spec, &[(PROXY, "2")], json!({})).await;
    let view = env
        .wait("the job, and the rollout held for it", Kubelet::On, |v| {
            v.expect_jobs(1)?;
            v.expect_counts(counts(2, 0, 2, 0))?;
            v.expect_condition(ROLLOUT_HELD, "True", "WaitingForPreDownload")?;
            v.expect_condition(PRE_DOWNLOAD, "True", "Pulling")
        })
        .await;
    check_job(&view.jobs[0], &view.set, &Want::new(PROXY, &image2, &nodes))
        .unwrap_or_else(|e| panic!("{e}"));
    let first_job = view.jobs[0].clone();

    // The first node pulled: its pod's idle twin takes the image, the twins swap, the other
    // pod waits for its node.
    daemon.finish(&nodes[0], ImagePullPhase::Succeeded);
    let view = env
        .wait("the first pod upgraded and flipped", Kubelet::On, |v| {
            v.expect_counts(counts(2, 1, 2, 1))?;
            v.expect_condition(ROLLOUT_HELD, "True", "WaitingForPreDownload")
        })
        .await;
    assert_eq!(
        view.pods_on(&idle, &image2),
        BTreeSet::from([pods[0].clone()]),
        "{}",
        view.describe()
    );
    daemon.finish(&nodes[1], ImagePullPhase::Succeeded);
    env.wait("both pods upgraded, the job deleted", Kubelet::On, |v| {
        v.expect_counts(counts(2, 2, 2, 2))?;
        v.expect_condition(ROLLOUT_HELD, "False", "Updated")?;
        v.expect_jobs(0)?;
        let upgraded = v.pods_on(&idle, &image2);
        (upgraded.len() == 2)
            .then_some(())
            .ok_or_else(|| format!("pods with {idle} on {image2}: {upgraded:?}"))
    })
    .await;

    // The next image: neither twin runs it on either node.
    let image3 = env.image(PROXY, "3");
    env.set_images(&mut spec, &[(PROXY, "3")], json!({"paused": true}))
        .await;
    let view = env
        .wait("the next revision's job on both nodes", Kubelet::Off, |v| {
            v.expect_jobs(1)?;
            v.expect_condition(ROLLOUT_HELD, "True", "Paused")?;
            check_job(
                &v.jobs[0],
                &v.set,
                &Want {
                    ordered: false,
                    ..Want::new(PROXY, &image3, &nodes)
                },
            )
        })
        .await;
    log.expect_exactly(&[job_key(&first_job), job_key(&view.jobs[0])])
        .await;
    daemon.assert_ok();
}
