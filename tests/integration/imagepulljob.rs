//! The ImagePullJob controller against a real apiserver. The tests make fake NodeImages (no
//! kubelet, no daemon) and play the node daemon by writing NodeImage status.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, Secret};
use k8s_openapi::api::events::v1::Event;
use kruise_rs_api::imagepulljob::{
    CompletionPolicy, CompletionPolicyType, ImagePullJob, ImagePullJobNodeSelector,
    ImagePullJobSpec, ImagePullJobTemplate,
};
use kruise_rs_api::nodeimage::{ImageTagSpec, NodeImage};
use kruise_rs_api::well_known::FAKE_NODEIMAGE;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::{self, TestCluster, wait_for};

const TIMEOUT: Duration = Duration::from_secs(30);

struct Env {
    client: Client,
    ns: String,
    /// A label value unique to the test; its nodes carry `kruise-rs-test: <run>`.
    run: String,
    _ns_guard: support::TestNamespace,
}

async fn env(prefix: &str) -> Env {
    let cluster: &TestCluster = support::cluster().await;
    cluster.start_controllers();
    let ns = cluster.namespace(prefix).await;
    Env {
        client: cluster.client().await,
        ns: ns.name().to_owned(),
        run: support::unique_name(prefix),
        _ns_guard: ns,
    }
}

impl Env {
    fn nodeimages(&self) -> Api<NodeImage> {
        Api::all(self.client.clone())
    }

    fn jobs(&self) -> Api<ImagePullJob> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Makes `n` NodeImages for this test (fake: no Node behind them) and returns their names.
    async fn nodes(&self, n: usize) -> Vec<String> {
        let mut names = Vec::new();
        for i in 0..n {
            names.push(self.node(&format!("{}-n{i}", self.run)).await);
        }
        names
    }

    async fn node(&self, name: &str) -> String {
        let mut ni = NodeImage::new(name, Default::default());
        ni.metadata.labels = Some(BTreeMap::from([
            (FAKE_NODEIMAGE.to_owned(), "true".to_owned()),
            ("kruise-rs-test".to_owned(), self.run.clone()),
        ]));
        self.nodeimages()
            .create(&PostParams::default(), &ni)
            .await
            .expect("create NodeImage");
        name.to_owned()
    }

    fn selector(&self) -> Option<ImagePullJobNodeSelector> {
        Some(ImagePullJobNodeSelector {
            match_labels: Some(BTreeMap::from([(
                "kruise-rs-test".to_owned(),
                self.run.clone(),
            )])),
            ..Default::default()
        })
    }

    /// Creates a job the test controllers manage (it carries their label).
    async fn job(&self, name: &str, spec: ImagePullJobSpec) -> ImagePullJob {
        let mut job = ImagePullJob::new(name, spec);
        self.label(&mut job.metadata);
        self.jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create job")
    }

    fn label(&self, meta: &mut ObjectMeta) {
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(support::CONTROLLED_LABEL.to_owned(), self.run.clone());
    }

    async fn wait_job(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&ImagePullJob) -> bool,
    ) -> ImagePullJob {
        let jobs = self.jobs();
        wait_for(what, TIMEOUT, || {
            let jobs = jobs.clone();
            let done = &done;
            async move { jobs.get(name).await.ok().filter(|j| done(j)) }
        })
        .await
    }

    /// The tag entry for `image`/`tag` on `node`, once it exists.
    async fn wait_entry(&self, node: &str, image: &str, tag: &str) -> ImageTagSpec {
        let api = self.nodeimages();
        wait_for(&format!("{image}:{tag} on {node}"), TIMEOUT, || {
            let api = api.clone();
            async move { tag_entry(&api.get(node).await.ok()?, image, tag) }
        })
        .await
    }

    /// Plays the node daemon: reports `phase` for the current version of `image`/`tag`.
    async fn report(&self, node: &str, image: &str, tag: &str, phase: &str) {
        let entry = self.wait_entry(node, image, tag).await;
        // Finished now: an old completion time would let the tag's TTL collect it at once.
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let status = json!({"status": {"imageStatuses": {image: {"tags": [{
            "tag": tag, "phase": phase, "version": entry.version.unwrap_or(0),
            "completionTime": now
        }]}}}});
        self.nodeimages()
            .patch_status(node, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .expect("write NodeImage status");
    }
}

fn tag_entry(ni: &NodeImage, image: &str, tag: &str) -> Option<ImageTagSpec> {
    ni.spec
        .images
        .get(image)?
        .tags
        .iter()
        .find(|t| t.tag == tag)
        .cloned()
}

fn spec(
    image: &str,
    selector: Option<ImagePullJobNodeSelector>,
    parallelism: i32,
) -> ImagePullJobSpec {
    ImagePullJobSpec {
        image: image.into(),
        template: ImagePullJobTemplate {
            selector,
            parallelism: Some(
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(parallelism),
            ),
            ..Default::default()
        },
    }
}

fn completed(j: &ImagePullJob) -> bool {
    j.status
        .as_ref()
        .is_some_and(|s| s.completion_time.is_some())
}

#[tokio::test]
async fn an_always_job_completes_when_every_node_reports_success() {
    let env = env("ipj-always").await;
    let nodes = env.nodes(3).await;
    env.job("pull", spec("nginx:1.25", env.selector(), 3)).await;
    for node in &nodes {
        let entry = env.wait_entry(node, "nginx", "1.25").await;
        assert_eq!(entry.owner_references.len(), 1);
        assert!(entry.created_at.is_some() && entry.pull_policy.is_some());
        env.report(node, "nginx", "1.25", "Succeeded").await;
    }
    let job = env.wait_job("pull", "the job to complete", completed).await;
    let status = job.status.expect("status");
    assert_eq!(
        (
            status.desired,
            status.succeeded,
            status.failed,
            status.active
        ),
        (3, 3, 0, 0)
    );
    assert_eq!(status.message.as_deref(), Some("job has completed"));
    assert!(status.start_time.is_some());
}

/// Watches the test's NodeImages and records, on every change, how many nodes are pulling the
/// job's image (entry written, no final report), and the order in which nodes started.
struct PullingWatch {
    max_pulling: Arc<Mutex<usize>>,
    started: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PullingWatch {
    fn start(env: &Env, image: &'static str, tag: &'static str) -> Self {
        let max_pulling = Arc::new(Mutex::new(0));
        let started = Arc::new(Mutex::new(Vec::new()));
        let (max, order) = (max_pulling.clone(), started.clone());
        let config = watcher::Config::default().labels(&format!("kruise-rs-test={}", env.run));
        let stream = watcher(env.nodeimages(), config).applied_objects();
        let task = tokio::spawn(async move {
            let mut pulling: HashMap<String, bool> = HashMap::new();
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(ni)) = stream.next().await {
                let node = ni.name_any();
                if let Some(entry) = tag_entry(&ni, image, tag) {
                    let finished = ni
                        .status
                        .as_ref()
                        .and_then(|s| s.image_statuses.get(image))
                        .and_then(|i| i.tags.iter().find(|t| t.tag == tag))
                        .is_some_and(|t| t.version == entry.version && t.completion_time.is_some());
                    if !pulling.contains_key(&node) {
                        order.lock().unwrap().push(node.clone());
                    }
                    pulling.insert(node, !finished);
                }
                let now = pulling.values().filter(|p| **p).count();
                let mut max = max.lock().unwrap();
                *max = (*max).max(now);
            }
        });
        Self {
            max_pulling,
            started,
            task,
        }
    }
}

#[tokio::test]
async fn parallelism_two_over_six_nodes_never_has_more_than_two_pulling() {
    let env = env("ipj-par").await;
    let nodes = env.nodes(6).await;
    let watch = PullingWatch::start(&env, "nginx", "par");
    env.job("pull", spec("nginx:par", env.selector(), 2)).await;
    let mut answered = HashSet::new();
    while answered.len() < nodes.len() {
        // Answer whichever node has been started, one at a time.
        let api = env.nodeimages();
        let next = wait_for("a started node", TIMEOUT, || {
            let (api, answered, nodes) = (api.clone(), &answered, &nodes);
            async move {
                for node in nodes.iter().filter(|n| !answered.contains(*n)) {
                    if tag_entry(&api.get(node).await.ok()?, "nginx", "par").is_some() {
                        return Some(node.clone());
                    }
                }
                None
            }
        })
        .await;
        env.report(&next, "nginx", "par", "Succeeded").await;
        answered.insert(next);
    }
    env.wait_job("pull", "the job to complete", completed).await;
    watch.task.abort();
    let max = *watch.max_pulling.lock().unwrap();
    assert!(max <= 2, "{max} nodes were pulling at once");
    assert_eq!(max, 2, "parallelism 2 should be used");
    let mut sorted = nodes.clone();
    sorted.sort();
    // The writes of one reconcile are under way together (decision 0042), so nodes it starts
    // may show in either order: with at most two pulling, a node starts at most one place
    // before its turn by name, and every node does start.
    let started = watch.started.lock().unwrap().clone();
    let mut seen = started.clone();
    seen.sort();
    assert_eq!(seen, sorted, "every node started once");
    for (position, node) in started.iter().enumerate() {
        let turn = sorted.iter().position(|n| n == node).unwrap_or_default();
        assert!(
            turn <= position + 1,
            "label-selected nodes start in name order, give or take one: {started:?}"
        );
    }
}

#[tokio::test]
async fn a_failing_node_lands_in_failed_nodes() {
    let env = env("ipj-fail").await;
    let nodes = env.nodes(2).await;
    env.job("pull", spec("nginx:f", env.selector(), 2)).await;
    env.report(&nodes[0], "nginx", "f", "Succeeded").await;
    env.report(&nodes[1], "nginx", "f", "Failed").await;
    let job = env.wait_job("pull", "the job to complete", completed).await;
    let status = job.status.expect("status");
    assert_eq!((status.succeeded, status.failed), (1, 1));
    assert_eq!(status.failed_nodes, [nodes[1].clone()]);
}

#[tokio::test]
async fn the_active_deadline_ends_a_job_whose_nodes_do_not_answer() {
    let env = env("ipj-deadline").await;
    env.nodes(2).await;
    let mut s = spec("nginx:d", env.selector(), 2);
    s.template.completion_policy = CompletionPolicy {
        active_deadline_seconds: Some(2),
        ..Default::default()
    };
    env.job("pull", s).await;
    let job = env
        .wait_job("pull", "the deadline to end the job", completed)
        .await;
    let status = job.status.expect("status");
    assert_eq!(
        status.message.as_deref(),
        Some("job exceeds activeDeadlineSeconds")
    );
    assert_eq!((status.failed, status.succeeded, status.active), (2, 0, 0));
}

#[tokio::test]
async fn ttl_deletes_a_finished_job_and_its_tags_are_collected() {
    let env = env("ipj-ttl").await;
    let nodes = env.nodes(1).await;
    let mut s = spec("nginx:ttl", env.selector(), 1);
    s.template.completion_policy = CompletionPolicy {
        ttl_seconds_after_finished: Some(1),
        ..Default::default()
    };
    env.job("pull", s).await;
    env.report(&nodes[0], "nginx", "ttl", "Succeeded").await;
    let jobs = env.jobs();
    wait_for("the finished job to be deleted", TIMEOUT, || {
        let jobs = jobs.clone();
        async move {
            matches!(jobs.get("pull").await, Err(kube::Error::Api(s)) if s.code == 404)
                .then_some(())
        }
    })
    .await;
    let api = env.nodeimages();
    let node = nodes[0].clone();
    wait_for("the deleted job's tag to be collected", TIMEOUT, || {
        let (api, node) = (api.clone(), node.clone());
        async move {
            api.get(&node)
                .await
                .ok()
                .filter(|ni| !ni.spec.images.contains_key("nginx"))
                .map(|_| ())
        }
    })
    .await;
}

/// The manager may see a job before the NodeImages created just before it (two watches,
/// decision 0048). Played here in the order the manager may see them: the job's first look finds
/// no node, then its node comes. The job must still be running then, and pull on it.
#[tokio::test]
async fn a_job_whose_first_look_finds_no_node_pulls_on_a_node_that_comes_right_after() {
    let env = env("ipj-late").await;
    let job = env.job("pull", spec("nginx:late", env.selector(), 1)).await;
    let looked = env
        .wait_job("pull", "the first look to find no node", |j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.start_time.is_some() && s.desired == 0)
        })
        .await;
    assert!(
        !completed(&looked),
        "completed on its first look with no node: {:?}",
        looked.status
    );
    let node = env.node(&format!("{}-n0", env.run)).await;
    env.report(&node, "nginx", "late", "Succeeded").await;
    let done = env
        .wait_job("pull", "the job to complete on the late node", completed)
        .await;
    let status = done.status.expect("a status");
    assert_eq!((status.desired, status.succeeded), (1, 1), "{status:?}");
    assert_eq!(done.metadata.uid, job.metadata.uid);
}

/// With no node for the whole grace, an `Always` job completes with none (as upstream's does, 5 s
/// later).
#[tokio::test]
async fn a_job_that_finds_no_node_completes_with_none_after_the_grace() {
    let env = env("ipj-none").await;
    env.job("pull", spec("nginx:none", env.selector(), 1)).await;
    let done = env
        .wait_job("pull", "the job with no node to complete", completed)
        .await;
    let status = done.status.expect("a status");
    assert_eq!((status.desired, status.succeeded), (0, 0), "{status:?}");
    let started = status.start_time.expect("a start time").0;
    let finished = status.completion_time.expect("a completion time").0;
    assert!(
        finished.duration_since(started) >= k8s_openapi::jiff::SignedDuration::from_secs(5),
        "completed {} after its first look",
        finished.duration_since(started)
    );
}

#[tokio::test]
async fn a_never_job_picks_up_a_node_added_later() {
    let env = env("ipj-never").await;
    let nodes = env.nodes(1).await;
    let mut s = spec("nginx:nv", env.selector(), 5);
    s.template.completion_policy = CompletionPolicy {
        type_: Some(CompletionPolicyType::Never),
        ..Default::default()
    };
    env.job("pull", s).await;
    env.report(&nodes[0], "nginx", "nv", "Succeeded").await;
    env.wait_job("pull", "one node done", |j| {
        j.status.as_ref().is_some_and(|s| s.succeeded == 1)
    })
    .await;
    let late = env.node(&format!("{}-late", env.run)).await;
    let entry = env.wait_entry(&late, "nginx", "nv").await;
    assert_eq!(
        entry.pull_policy.and_then(|p| p.active_deadline_seconds),
        Some(1800)
    );
    let job = env
        .wait_job("pull", "desired to include the new node", |j| {
            j.status.as_ref().is_some_and(|s| s.desired == 2)
        })
        .await;
    assert!(!completed(&job), "a Never job never completes");
}

#[tokio::test]
async fn jobs_sharing_a_node_and_an_image_lose_nothing() {
    let env = env("ipj-share").await;
    let nodes = env.nodes(3).await;
    let sandbox = kruise_rs_api::common::SandboxConfig {
        labels: BTreeMap::from([("app".to_owned(), "foo".to_owned())]),
        annotations: BTreeMap::from([(
            "io.kubernetes.image.metrics.tags".to_owned(),
            "app=foo".to_owned(),
        )]),
    };
    // Four jobs at once, on the same nodes: two tags of one image, one tag asked twice.
    let mut with_sandbox = spec("nginx:a", env.selector(), 10);
    with_sandbox.template.sandbox_config = Some(sandbox.clone());
    let (a, b, c, d) = tokio::join!(
        env.job("a", with_sandbox),
        env.job("b", spec("nginx:b", env.selector(), 10)),
        env.job("c", spec("docker.io/library/nginx:a", env.selector(), 10)),
        env.job("d", spec("redis:7", env.selector(), 10)),
    );
    let uid = |j: &ImagePullJob| j.metadata.uid.clone().unwrap();
    for node in &nodes {
        let api = env.nodeimages();
        let ni = wait_for(&format!("all four jobs on {node}"), TIMEOUT, || {
            let api = api.clone();
            let want = [uid(&a), uid(&b), uid(&c), uid(&d)];
            async move {
                let ni = api.get(node).await.ok()?;
                let owners: HashSet<String> = ni
                    .spec
                    .images
                    .values()
                    .flat_map(|i| &i.tags)
                    .flat_map(|t| &t.owner_references)
                    .filter_map(|o| o.uid.clone())
                    .collect();
                want.iter().all(|u| owners.contains(u)).then_some(ni)
            }
        })
        .await;
        let nginx = &ni.spec.images["nginx"];
        let tags: Vec<&str> = nginx.tags.iter().map(|t| t.tag.as_str()).collect();
        assert_eq!(tags, ["a", "b"]);
        assert_eq!(
            nginx.tags[0].owner_references.len(),
            2,
            "jobs a and c share nginx:a"
        );
        assert_eq!(
            nginx.sandbox_config.as_ref(),
            Some(&sandbox),
            "job b's missing sandboxConfig wipes nothing"
        );
        assert!(ni.spec.images.contains_key("redis"));
    }
}

#[tokio::test]
async fn a_pod_selector_job_follows_the_pods_nodes_in_order() {
    let env = env("ipj-pods").await;
    let nodes = env.nodes(3).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    // Created in this order, so oldest first (the name breaks same-second ties): n2, n0, n1.
    for (i, node) in [&nodes[2], &nodes[0], &nodes[1]].into_iter().enumerate() {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(format!("web-{i}")),
                labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.clone()),
                containers: vec![Container {
                    name: "web".into(),
                    image: Some("nginx".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create pod");
    }
    let watch = PullingWatch::start(&env, "nginx", "pods");
    let mut s = spec("nginx:pods", None, 1);
    s.template.pod_selector = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(BTreeMap::from([("app".to_owned(), "web".to_owned())])),
            ..Default::default()
        },
    );
    env.job("pull", s).await;
    for node in [&nodes[2], &nodes[0], &nodes[1]] {
        env.report(node, "nginx", "pods", "Succeeded").await;
    }
    env.wait_job("pull", "the job to complete", completed).await;
    watch.task.abort();
    assert_eq!(
        *watch.started.lock().unwrap(),
        [nodes[2].clone(), nodes[0].clone(), nodes[1].clone()]
    );
}

#[tokio::test]
async fn the_seed_job_puts_its_sandbox_config_on_every_target_nodeimage() {
    let env = env("ipj-seed").await;
    let nodes = env.nodes(2).await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/seed-003-imagepulljob.yaml");
    let mut seed: ImagePullJob =
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("seed")).expect("parses");
    // The seed targets every node in the cluster; keep it to this test's nodes.
    seed.spec.template.selector = env.selector();
    seed.metadata.namespace = None;
    env.label(&mut seed.metadata);
    env.jobs()
        .create(&PostParams::default(), &seed)
        .await
        .expect("create seed job");
    for node in &nodes {
        env.wait_entry(node, "nginx", "latest").await;
        let ni = env.nodeimages().get(node).await.expect("nodeimage");
        let sandbox = ni.spec.images["nginx"]
            .sandbox_config
            .clone()
            .expect("sandboxConfig on the NodeImage");
        assert_eq!(sandbox.labels["app"], "foo");
        assert_eq!(
            sandbox.annotations["io.kubernetes.image.metrics.tags"],
            "app=foo"
        );
    }
}

#[tokio::test]
async fn digest_and_registry_with_port_images_get_upstreams_keys() {
    let env = env("ipj-refs").await;
    let nodes = env.nodes(1).await;
    let digest = format!("sha256:{}", "ab".repeat(32));
    env.job(
        "by-digest",
        spec(
            &format!("127.0.0.1:5000/team/app@{digest}"),
            env.selector(),
            1,
        ),
    )
    .await;
    env.job(
        "by-tag",
        spec("127.0.0.1:5000/team/app:1", env.selector(), 1),
    )
    .await;
    env.wait_entry(&nodes[0], "127.0.0.1:5000/team/app", &digest)
        .await;
    env.wait_entry(&nodes[0], "127.0.0.1:5000/team/app", "1")
        .await;
}

#[tokio::test]
async fn an_invalid_image_is_reported_on_the_job() {
    let env = env("ipj-bad").await;
    env.nodes(1).await;
    env.job("bad", spec("Not A/Valid::Image", env.selector(), 1))
        .await;
    let job = env
        .wait_job("bad", "a message about the image", |j| {
            j.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.starts_with("spec.image"))
        })
        .await;
    assert!(!completed(&job));
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for("a Warning event InvalidImage", TIMEOUT, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("InvalidImage") && e.type_.as_deref() == Some("Warning")
            })
        }
    })
    .await;
}

async fn registry_secret(env: &Env, name: &str) {
    typed_secret(env, name, "kubernetes.io/dockerconfigjson").await;
}

/// A Secret `name` of type `type_` in the test's namespace, holding a registry credential.
async fn typed_secret(env: &Env, name: &str, type_: &str) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        type_: Some(type_.into()),
        string_data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_owned(),
            r#"{"auths":{"127.0.0.1:5000":{"auth":"dXNlcjpwYXNz"}}}"#.to_owned(),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
}

/// Creates the daemons' namespace if no test's job has made the controller create it yet (it
/// is shared by every test and left in place, as the controller leaves it).
async fn ensure_daemon_namespace(env: &Env) {
    let name = support::test_controller_options().daemon_config_namespace;
    crate::harness::objects::create_namespace(&env.client, &name, &[])
        .await
        .unwrap_or_else(|e| panic!("create the daemons' namespace: {e}"));
}

fn daemon_secrets(env: &Env) -> Api<Secret> {
    let daemon_ns = support::test_controller_options().daemon_config_namespace;
    Api::namespaced(env.client.clone(), &daemon_ns)
}

/// The Warning event `reason` on the test's job whose note contains every one of `words`.
async fn wait_warning(env: &Env, reason: &str, words: &[&str]) -> Event {
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    wait_for(
        &format!("a Warning event {reason} naming {words:?}"),
        TIMEOUT,
        || {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await.ok()?;
                list.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.type_.as_deref() == Some("Warning")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| words.iter().all(|w| n.contains(w)))
                })
            }
        },
    )
    .await
}

/// A registry Secret named `name` for `kruise-daemon-config`, with `annotations`: a copy as
/// someone else (or an earlier version) left it.
fn daemon_copy(name: &str, annotations: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        string_data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_owned(),
            r#"{"auths":{}}"#.to_owned(),
        )])),
        ..Default::default()
    }
}

/// Deletes job `name` and waits until it is gone.
async fn delete_job_and_wait(env: &Env, name: &str) {
    env.jobs()
        .delete(name, &Default::default())
        .await
        .expect("delete job");
    let jobs = env.jobs();
    wait_for("the job to be gone", TIMEOUT, || {
        let jobs = jobs.clone();
        async move {
            jobs.get_opt(name)
                .await
                .ok()
                .filter(Option::is_none)
                .map(|_| ())
        }
    })
    .await;
}

/// The daemon-namespace copy of the test's Secret `reg`, once the controller made it.
async fn wait_secret_copy(env: &Env) -> (Api<Secret>, String, Secret) {
    let daemon_ns = support::test_controller_options().daemon_config_namespace;
    let copies: Api<Secret> = Api::namespaced(env.client.clone(), &daemon_ns);
    let copy = kruise_rs_imagepull::imagepulljob::secrets::copy_name(&env.ns, "reg");
    let secret = wait_for("the secret copy", TIMEOUT, || {
        let (copies, copy) = (copies.clone(), copy.clone());
        async move { copies.get_opt(&copy).await.ok().flatten() }
    })
    .await;
    (copies, copy, secret)
}

#[tokio::test]
async fn pull_secrets_are_copied_for_the_daemons_and_released_when_the_job_finishes() {
    let env = env("ipj-secret").await;
    let nodes = env.nodes(1).await;
    registry_secret(&env, "reg").await;
    let mut s = spec("127.0.0.1:5000/private/app:1", env.selector(), 1);
    s.template.pull_secrets = vec!["reg".into()];
    env.job("pull", s).await;

    let daemon_ns = support::test_controller_options().daemon_config_namespace;
    let (copies, copy, secret) = wait_secret_copy(&env).await;
    // The copy's name: the source name, '-', the first 16 hex of SHA-256("<namespace>/reg").
    let digest = ring::digest::digest(&ring::digest::SHA256, format!("{}/reg", env.ns).as_bytes());
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(copy, format!("reg-{hex}"));
    assert_eq!(
        secret.type_.as_deref(),
        Some("kubernetes.io/dockerconfigjson")
    );
    let annotations = secret.annotations();
    assert_eq!(
        annotations["imagepulljobs.kruise.io/source-key"],
        format!("{}/reg", env.ns)
    );
    assert_eq!(
        annotations["imagepulljobs.kruise.io/references"],
        format!("{}/pull", env.ns)
    );
    assert!(
        secret
            .data
            .is_some_and(|d| d.contains_key(".dockerconfigjson"))
    );

    env.wait_entry(&nodes[0], "127.0.0.1:5000/private/app", "1")
        .await;
    let ni = env.nodeimages().get(&nodes[0]).await.expect("nodeimage");
    let refs = &ni.spec.images["127.0.0.1:5000/private/app"].pull_secrets;
    assert_eq!(refs.len(), 1);
    assert_eq!(
        (refs[0].namespace.as_deref(), refs[0].name.as_deref()),
        (Some(daemon_ns.as_str()), Some(copy.as_str()))
    );
    let job = env.jobs().get("pull").await.expect("job");
    assert!(
        job.finalizers().is_empty(),
        "no finalizer: deleting the job never waits for the manager (decision 0030)"
    );

    env.report(&nodes[0], "127.0.0.1:5000/private/app", "1", "Succeeded")
        .await;
    env.wait_job("pull", "the job to complete", completed).await;
    wait_for("the unused copy to be deleted", TIMEOUT, || {
        let (copies, copy) = (copies.clone(), copy.clone());
        async move {
            copies
                .get_opt(&copy)
                .await
                .ok()
                .filter(Option::is_none)
                .map(|_| ())
        }
    })
    .await;
}

#[tokio::test]
async fn deleting_a_running_job_releases_its_secret_copies() {
    let env = env("ipj-secdel").await;
    env.nodes(1).await;
    registry_secret(&env, "reg").await;
    let mut s = spec("127.0.0.1:5000/private/app:2", env.selector(), 1);
    s.template.pull_secrets = vec!["reg".into()];
    env.job("pull", s).await;
    let (copies, copy, _) = wait_secret_copy(&env).await;
    delete_job_and_wait(&env, "pull").await;
    wait_for("the deleted job's copy to be released", TIMEOUT, || {
        let (copies, copy) = (copies.clone(), copy.clone());
        async move { copies.get_opt(&copy).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// A running job's copy follows its source Secret: a rotated credential reaches the daemons'
/// copy within the source recheck (5 s), though nothing else happens to the job (upstream's spec
/// "never completion pull job with updated pull secrets" gives it 10 s).
#[tokio::test]
async fn a_running_jobs_copy_follows_its_rotated_source_secret() {
    let env = env("ipj-secrot").await;
    let nodes = env.nodes(1).await;
    registry_secret(&env, "reg").await;
    let mut s = spec("127.0.0.1:5000/private/app:3", env.selector(), 1);
    s.template.pull_secrets = vec!["reg".into()];
    // The played node never reports: the job keeps running.
    env.job("pull", s).await;
    let (copies, copy, _) = wait_secret_copy(&env).await;
    // Settled: its entry written and its status saying so, so no write of its own is left to
    // wake it (a rotation racing one would be picked up by chance).
    env.wait_entry(&nodes[0], "127.0.0.1:5000/private/app", "3")
        .await;
    env.wait_job("pull", "the job to report its active node", |j| {
        j.status.as_ref().is_some_and(|s| s.active == 1)
    })
    .await;
    let rotated = r#"{"auths":{"127.0.0.1:5000":{"auth":"cm90YXRlZDpwYXNz"}}}"#;
    Api::<Secret>::namespaced(env.client.clone(), &env.ns)
        .patch(
            "reg",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {".dockerconfigjson": rotated}})),
        )
        .await
        .expect("rotate the source Secret");
    let started = std::time::Instant::now();
    wait_for(
        "the copy to carry the rotated credential",
        Duration::from_secs(15),
        || {
            let (copies, copy) = (copies.clone(), copy.clone());
            async move {
                let data = copies.get(&copy).await.ok()?.data?;
                (data.get(".dockerconfigjson")?.0 == rotated.as_bytes()).then_some(())
            }
        },
    )
    .await;
    eprintln!("the copy followed the source in {:.1?}", started.elapsed());
}

/// Every Secret in the daemons' namespace that says it is a copy of `source`.
async fn copies_of(env: &Env, source: &str) -> Vec<Secret> {
    let list = daemon_secrets(env)
        .list(&Default::default())
        .await
        .expect("list the daemons' secrets");
    list.items
        .into_iter()
        .filter(|s| {
            s.annotations()
                .get("imagepulljobs.kruise.io/source-key")
                .is_some_and(|k| k == source)
        })
        .collect()
}

#[tokio::test]
async fn a_secret_that_is_no_pull_secret_is_reported_and_not_copied() {
    let env = env("ipj-secopq").await;
    env.nodes(1).await;
    typed_secret(&env, "opaque", "Opaque").await;
    let mut s = spec("127.0.0.1:5000/private/app:3", env.selector(), 1);
    s.template.pull_secrets = vec!["opaque".into()];
    env.job("pull", s).await;

    let source = format!("{}/opaque", env.ns);
    wait_warning(&env, "PullSecretWrongType", &[&source, "Opaque"]).await;
    env.wait_job("pull", "the status message to name the Secret", |j| {
        j.status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .is_some_and(|m| m.contains(&source) && m.contains("Opaque"))
    })
    .await;
    // The event is published after the job's secrets were handled: no copy now means none.
    assert!(copies_of(&env, &source).await.is_empty());
    let copy = kruise_rs_imagepull::imagepulljob::secrets::copy_name(&env.ns, "opaque");
    assert!(
        daemon_secrets(&env)
            .get_opt(&copy)
            .await
            .expect("read")
            .is_none()
    );
}

#[tokio::test]
async fn a_foreign_secret_at_the_copy_name_is_left_alone_and_reported() {
    let env = env("ipj-seccol").await;
    env.nodes(1).await;
    registry_secret(&env, "reg").await;
    let copy = kruise_rs_imagepull::imagepulljob::secrets::copy_name(&env.ns, "reg");
    // It lists no job: one listing only jobs that are gone would be swept (decision 0030).
    let squatter = daemon_copy(
        &copy,
        &[("imagepulljobs.kruise.io/source-key", "elsewhere/reg")],
    );
    ensure_daemon_namespace(&env).await;
    let squatter = daemon_secrets(&env)
        .create(&PostParams::default(), &squatter)
        .await
        .expect("create the squatting Secret");
    let mut s = spec("127.0.0.1:5000/private/app:4", env.selector(), 1);
    s.template.pull_secrets = vec!["reg".into()];
    env.job("pull", s).await;

    let source = format!("{}/reg", env.ns);
    wait_warning(
        &env,
        "PullSecretCopyConflict",
        &[&source, &copy, "elsewhere/reg"],
    )
    .await;
    env.wait_job("pull", "the status message to report the conflict", |j| {
        j.status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .is_some_and(|m| m.contains(&copy) && m.contains("elsewhere/reg"))
    })
    .await;
    let after = daemon_secrets(&env).get(&copy).await.expect("still there");
    assert_eq!(
        after.resource_version(),
        squatter.resource_version(),
        "neither reused nor overwritten"
    );

    // Deleting the job releases nothing of the squatter's.
    delete_job_and_wait(&env, "pull").await;
    let after = daemon_secrets(&env).get(&copy).await.expect("still there");
    assert_eq!(after.resource_version(), squatter.resource_version());
    daemon_secrets(&env)
        .delete(&copy, &Default::default())
        .await
        .expect("clean up");
}

#[tokio::test]
async fn copies_named_the_old_way_go_with_the_last_job_that_references_them() {
    let env = env("ipj-secold").await;
    env.nodes(1).await;
    registry_secret(&env, "reg").await;
    let source = format!("{}/reg", env.ns);
    // As an earlier version left them: `reg-` and a 32-bit DefaultHasher suffix (unique here,
    // the namespace is shared by every test), one used by this test's job only, one also by a
    // job that is not deleted.
    let old_copy = |name: &str, references: &str| {
        daemon_copy(
            name,
            &[
                ("imagepulljobs.kruise.io/source-key", &source),
                ("imagepulljobs.kruise.io/references", references),
                ("imagepulljobs.kruise.io/mode", "batch"),
            ],
        )
    };
    let only_ours = support::unique_name("reg");
    let shared = support::unique_name("reg");
    // A job that stays (unlabelled: the test controllers leave it alone); one that did not
    // exist would be swept from the shared copy.
    env.jobs()
        .create(
            &PostParams::default(),
            &ImagePullJob::new("staying", spec("nginx:staying", None, 0)),
        )
        .await
        .expect("create the staying job");
    ensure_daemon_namespace(&env).await;
    for (name, refs) in [
        (&only_ours, format!("{}/pull", env.ns)),
        (&shared, format!("{0}/pull,{0}/staying", env.ns)),
    ] {
        daemon_secrets(&env)
            .create(&PostParams::default(), &old_copy(name, &refs))
            .await
            .expect("create an old-named copy");
    }
    let mut s = spec("127.0.0.1:5000/private/app:5", env.selector(), 1);
    s.template.pull_secrets = vec!["reg".into()];
    env.job("pull", s).await;
    let (copies, copy, _) = wait_secret_copy(&env).await;

    delete_job_and_wait(&env, "pull").await;
    for gone in [&copy, &only_ours] {
        wait_for(&format!("{gone} to go with its last job"), TIMEOUT, || {
            let copies = copies.clone();
            async move { copies.get_opt(gone).await.ok()?.is_none().then_some(()) }
        })
        .await;
    }
    // The sweep settles the copies one by one: the shared one may come after the others.
    let staying = format!("{}/staying", env.ns);
    wait_for(
        &format!("{shared} to keep only the job that stays"),
        TIMEOUT,
        || {
            let (copies, shared, staying) = (copies.clone(), shared.clone(), staying.clone());
            async move {
                let kept = copies.get_opt(&shared).await.ok()??;
                (kept.annotations().get("imagepulljobs.kruise.io/references") == Some(&staying))
                    .then_some(())
            }
        },
    )
    .await;
    copies
        .delete(&shared, &Default::default())
        .await
        .expect("clean up");
}

#[tokio::test]
async fn parallelism_zero_pauses_and_raising_it_on_a_running_job_takes_effect() {
    let env = env("ipj-pause").await;
    let nodes = env.nodes(2).await;
    env.job("pull", spec("nginx:pause", env.selector(), 0))
        .await;
    // The controller has looked at the job (it counts its nodes) and started none of them.
    env.wait_job("pull", "the paused job to count its nodes", |j| {
        j.status.as_ref().is_some_and(|s| s.desired == 2)
    })
    .await;
    for node in &nodes {
        let ni = env.nodeimages().get(node).await.expect("nodeimage");
        assert!(
            tag_entry(&ni, "nginx", "pause").is_none(),
            "{node} started while paused"
        );
    }
    let raise = json!({"spec": {"parallelism": 2}});
    env.jobs()
        .patch("pull", &PatchParams::default(), &Patch::Merge(&raise))
        .await
        .expect("raise parallelism");
    for node in &nodes {
        env.wait_entry(node, "nginx", "pause").await;
    }
}

#[tokio::test]
async fn a_node_that_recovers_leaves_failed_nodes() {
    let env = env("ipj-recover").await;
    let nodes = env.nodes(1).await;
    let mut s = spec("nginx:rec", env.selector(), 1);
    s.template.completion_policy = CompletionPolicy {
        type_: Some(CompletionPolicyType::Never),
        ..Default::default()
    };
    env.job("pull", s).await;
    env.report(&nodes[0], "nginx", "rec", "Failed").await;
    env.wait_job("pull", "the failure to show", |j| {
        j.status
            .as_ref()
            .is_some_and(|s| s.failed_nodes == [nodes[0].clone()])
    })
    .await;
    env.report(&nodes[0], "nginx", "rec", "Succeeded").await;
    let job = env
        .wait_job("pull", "the recovery to show", |j| {
            j.status.as_ref().is_some_and(|s| s.succeeded == 1)
        })
        .await;
    let status = job.status.expect("status");
    assert_eq!(status.failed, 0);
    assert!(status.failed_nodes.is_empty(), "{:?}", status.failed_nodes);
}

fn sandbox_labels(pairs: &[(&str, &str)]) -> kruise_rs_api::common::SandboxConfig {
    kruise_rs_api::common::SandboxConfig {
        labels: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    }
}

/// #2221: an edit reaches the nodes a job already wrote, not only those it starts next.
#[tokio::test]
async fn an_edit_reaches_the_node_already_pulling() {
    let env = env("ipj-edit").await;
    let nodes = env.nodes(2).await;
    let mut s = spec("nginx:edit", None, 1);
    s.template.selector = Some(ImagePullJobNodeSelector {
        names: nodes.clone(),
        ..Default::default()
    });
    env.job("pull", s).await;
    let first = env.wait_entry(&nodes[0], "nginx", "edit").await;
    let timeout = |t: &ImageTagSpec| t.pull_policy.as_ref().and_then(|p| p.timeout_seconds);
    assert_eq!((timeout(&first), first.version), (Some(600), Some(0)));

    // The first node is pulling (no report yet): the longer timeout restarts its pull.
    let edit = json!({"spec": {
        "pullPolicy": {"timeoutSeconds": 1200},
        "sandboxConfig": {"labels": {"app": "edited"}}
    }});
    env.jobs()
        .patch("pull", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit the job");
    let api = env.nodeimages();
    let node = nodes[0].clone();
    let edited = wait_for("the edit on the first node", TIMEOUT, || {
        let (api, node) = (api.clone(), node.clone());
        async move {
            let ni = api.get(&node).await.ok()?;
            let tag = tag_entry(&ni, "nginx", "edit")?;
            (timeout(&tag) == Some(1200)).then_some((ni, tag))
        }
    })
    .await;
    let (ni, tag) = edited;
    assert_eq!(
        tag.version,
        Some(1),
        "a pull in flight restarts to get more time"
    );
    assert_eq!(tag.created_at, first.created_at, "the same request");
    assert_eq!(
        tag.sandbox_config.clone(),
        Some(sandbox_labels(&[("app", "edited")]))
    );
    assert_eq!(
        ni.spec.images["nginx"].sandbox_config.clone(),
        Some(sandbox_labels(&[("app", "edited")]))
    );
    let second = env.nodeimages().get(&nodes[1]).await.expect("second node");
    assert!(
        tag_entry(&second, "nginx", "edit").is_none(),
        "parallelism 1 still holds"
    );

    // Done on the first node: the second starts with the edited values.
    env.report(&nodes[0], "nginx", "edit", "Succeeded").await;
    let next = env.wait_entry(&nodes[1], "nginx", "edit").await;
    assert_eq!((timeout(&next), next.version), (Some(1200), Some(0)));

    // A finished round keeps its verdict: shrinking the timeout rewrites it, no new round.
    let shrink = json!({"spec": {"pullPolicy": {"timeoutSeconds": 30}}});
    env.jobs()
        .patch("pull", &PatchParams::default(), &Patch::Merge(&shrink))
        .await
        .expect("edit the job again");
    let node = nodes[0].clone();
    let done = wait_for("the shorter timeout on the first node", TIMEOUT, || {
        let (api, node) = (api.clone(), node.clone());
        async move {
            let tag = tag_entry(&api.get(&node).await.ok()?, "nginx", "edit")?;
            (timeout(&tag) == Some(30)).then_some(tag)
        }
    })
    .await;
    assert_eq!(done.version, Some(1), "no new round for a finished pull");
}

/// What only a deleted job asked for goes with it; what another owner asks stays.
#[tokio::test]
async fn deleting_one_of_two_jobs_takes_its_sandbox_labels_and_patience_with_it() {
    let env = env("ipj-leave").await;
    let nodes = env.nodes(1).await;
    let mut a = spec("nginx:shared", env.selector(), 1);
    a.template.sandbox_config = Some(sandbox_labels(&[("app", "a"), ("both", "x")]));
    a.template.pull_policy = Some(kruise_rs_api::imagepulljob::PullPolicy {
        timeout_seconds: Some(3000),
        backoff_limit: None,
    });
    let mut b = spec("nginx:shared", env.selector(), 1);
    b.template.sandbox_config = Some(sandbox_labels(&[("team", "b"), ("both", "x")]));
    let mut other_tag = spec("nginx:other", env.selector(), 1);
    other_tag.template.sandbox_config = Some(sandbox_labels(&[("tag", "other")]));
    let job_a = env.job("a", a).await;
    env.wait_entry(&nodes[0], "nginx", "shared").await;
    let job_b = env.job("b", b).await;
    env.job("c", other_tag).await;
    let api = env.nodeimages();
    let node = nodes[0].clone();
    let uid = |j: &ImagePullJob| j.metadata.uid.clone().unwrap();
    let (ua, ub) = (uid(&job_a), uid(&job_b));
    let owners = |t: &ImageTagSpec| -> Vec<String> {
        t.owner_references
            .iter()
            .filter_map(|o| o.uid.clone())
            .collect()
    };
    let ni = wait_for(
        "both jobs on the shared tag, and tag other",
        TIMEOUT,
        || {
            let (api, node) = (api.clone(), node.clone());
            let want = vec![ua.clone(), ub.clone()];
            async move {
                let ni = api.get(&node).await.ok()?;
                let shared = tag_entry(&ni, "nginx", "shared")?;
                tag_entry(&ni, "nginx", "other")?;
                (owners(&shared) == want).then_some(ni)
            }
        },
    )
    .await;
    let shared = tag_entry(&ni, "nginx", "shared").unwrap();
    assert_eq!(
        shared.sandbox_config.clone(),
        Some(sandbox_labels(&[
            ("app", "a"),
            ("both", "x"),
            ("team", "b")
        ]))
    );
    assert_eq!(
        shared.pull_policy.as_ref().unwrap().timeout_seconds,
        Some(3000)
    );
    assert_eq!(
        tag_entry(&ni, "nginx", "other")
            .unwrap()
            .sandbox_config
            .clone(),
        Some(sandbox_labels(&[("tag", "other")])),
        "each tag its own"
    );

    delete_job_and_wait(&env, "a").await;
    let node = nodes[0].clone();
    let ni = wait_for("job a's owner reference collected", TIMEOUT, || {
        let (api, node) = (api.clone(), node.clone());
        let want = vec![ub.clone()];
        async move {
            let ni = api.get(&node).await.ok()?;
            (owners(&tag_entry(&ni, "nginx", "shared")?) == want).then_some(ni)
        }
    })
    .await;
    let shared = tag_entry(&ni, "nginx", "shared").unwrap();
    assert_eq!(
        shared.sandbox_config.clone(),
        Some(sandbox_labels(&[("both", "x"), ("team", "b")])),
        "app=a went with job a; both=x stays, job b sets it too"
    );
    assert_eq!(
        shared.pull_policy.as_ref().unwrap().timeout_seconds,
        Some(600),
        "job a's patience went with it"
    );
    assert_eq!(
        ni.spec.images["nginx"].sandbox_config.clone(),
        Some(sandbox_labels(&[
            ("both", "x"),
            ("tag", "other"),
            ("team", "b")
        ])),
        "the image's metadata is its tags' merge"
    );
}

/// A NodeImage already at its schema's 256 images refuses a new one with a 422 that names the
/// limit: the job says so (a Warning event and its status message), instead of taking the
/// refusal for a lost race and asking again (a 422 is also how a failed `test` op comes back).
#[tokio::test]
async fn a_full_nodeimage_is_reported_not_retried_as_a_conflict() {
    let env = env("ipj-full").await;
    let node = env.node(&format!("{}-full", env.run)).await;
    let images: serde_json::Map<String, serde_json::Value> = (0..256)
        .map(|i| (format!("filler/img{i}"), json!({"tags": [{"tag": "v1"}]})))
        .collect();
    env.nodeimages()
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"images": images}})),
        )
        .await
        .expect("fill the NodeImage");
    env.job(
        "one-too-many",
        spec("registry.local/app:v1", env.selector(), 1),
    )
    .await;
    let event = wait_warning(
        &env,
        "NodeImageRefused",
        &[&node, "registry.local/app", "must have at most 256 items"],
    )
    .await;
    let job = env
        .wait_job("one-too-many", "the refusal in the job's status", |j| {
            j.status
                .as_ref()
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.contains("must have at most 256 items"))
        })
        .await;
    let status = job.status.unwrap_or_default();
    assert_eq!((status.succeeded, status.failed), (0, 0), "{status:?}");
    assert!(status.completion_time.is_none(), "{status:?}");
    let ni = env.nodeimages().get(&node).await.expect("NodeImage");
    assert_eq!(ni.spec.images.len(), 256, "{:?}", event.note);

    // Room again: the NodeImage's change wakes the job (it owns nothing there) and it writes.
    env.nodeimages()
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"images": {"filler/img0": null}}})),
        )
        .await
        .expect("free one image");
    wait_for("the job's entry once there is room", TIMEOUT, || async {
        let ni = env.nodeimages().get(&node).await.ok()?;
        ni.spec
            .images
            .contains_key("registry.local/app")
            .then_some(())
    })
    .await;
}

/// The label the manager of [`copies_of_vanished_jobs_are_swept_and_no_job_waits_for_the_manager`]
/// is confined to (the shared test controllers ignore its jobs).
const SWEEP_LABEL: &str = "kruise-rs-test-sweep";

/// No job waits for the manager to be deleted (issue 42: `helm uninstall` left jobs only the
/// manager could release): a copy whose jobs all vanished while no manager ran goes when one
/// starts, one that still serves a job (even one out of the manager's scope) only loses the
/// vanished reference, a job gets no finalizer (and loses the one earlier versions set), and
/// deleting a job releases its copy.
#[tokio::test]
async fn copies_of_vanished_jobs_are_swept_and_no_job_waits_for_the_manager() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let jobs_ns = cluster.namespace("sweep-jobs").await;
    let daemon_ns_guard = cluster.namespace("sweep-daemon").await;
    let daemon_ns = daemon_ns_guard.name().to_owned();
    let env = Env {
        client: client.clone(),
        ns: jobs_ns.name().to_owned(),
        run: support::unique_name("sweep"),
        _ns_guard: jobs_ns,
    };
    let copies: Api<Secret> = Api::namespaced(client.clone(), &daemon_ns);
    let key = |job: &str| format!("{}/{job}", env.ns);
    // Out of the manager's scope (no SWEEP_LABEL), but there: its reference stays.
    env.jobs()
        .create(
            &PostParams::default(),
            &ImagePullJob::new("present", spec("nginx:present", None, 0)),
        )
        .await
        .expect("create the job out of scope");
    let left_behind = |name: &str, refs: String| {
        let mut copy = daemon_copy(
            name,
            &[
                ("imagepulljobs.kruise.io/source-key", &key(name)),
                ("imagepulljobs.kruise.io/references", &refs),
                ("imagepulljobs.kruise.io/mode", "batch"),
            ],
        );
        copy.metadata.namespace = Some(daemon_ns.clone());
        copy
    };
    for copy in [
        left_behind("orphan", key("vanished")),
        left_behind("shared", format!("{},{}", key("vanished"), key("present"))),
    ] {
        copies
            .create(&PostParams::default(), &copy)
            .await
            .expect("create a copy left behind");
    }

    // The NodeImage the job below selects, in the manager's scope (its label selector confines
    // NodeImages too) and there before the manager lists: a job that matches no NodeImage
    // completes (after decision 0048's grace) and releases its copy. (Made without the label, it was never seen: the
    // job completed at once and the test passed only when it looked before the release.)
    let value = support::unique_name("sweep");
    let node = env.nodes(1).await.remove(0);
    env.nodeimages()
        .patch(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {SWEEP_LABEL: value}}})),
        )
        .await
        .expect("label the NodeImage into the manager's scope");
    let opts = kruise_rs::manager::ManagerOptions {
        controllers: kruise_rs::controllers::ControllerOptions {
            label_selector: Some(format!("{SWEEP_LABEL}={value}")),
            daemon_config_namespace: daemon_ns.clone(),
            ..support::test_controller_options()
        },
        ..support::manager_options(cluster.kubeconfig_path())
    };
    let manager = support::start_manager(opts, TIMEOUT, "sweep").await;

    wait_for("the orphaned copy to be deleted", TIMEOUT, || {
        let copies = copies.clone();
        async move { copies.get_opt("orphan").await.ok()?.is_none().then_some(()) }
    })
    .await;
    let present = key("present");
    wait_for("the vanished job's reference to go", TIMEOUT, || {
        let (copies, present) = (copies.clone(), present.clone());
        async move {
            let copy = copies.get_opt("shared").await.ok()??;
            (copy.annotations()["imagepulljobs.kruise.io/references"] == present).then_some(())
        }
    })
    .await;

    // A job in scope, with the finalizer earlier versions put on jobs with pull secrets. It
    // selects a NodeImage of its own (made before the manager starts, above), which never
    // reports: the job stays active and holds its copy.
    registry_secret(&env, "reg").await;
    let mut job = ImagePullJob::new("pull", {
        let mut s = spec("127.0.0.1:5000/private/app:sweep", env.selector(), 0);
        s.template.pull_secrets = vec!["reg".into()];
        s
    });
    job.metadata.labels = Some(BTreeMap::from([(SWEEP_LABEL.to_owned(), value.clone())]));
    job.metadata.finalizers = Some(vec!["apps.kruise.io/deletion-protection".to_owned()]);
    env.jobs()
        .create(&PostParams::default(), &job)
        .await
        .expect("create the job");
    let copy = kruise_rs_imagepull::imagepulljob::secrets::copy_name(&env.ns, "reg");
    let pull = key("pull");
    wait_for(
        "the job's copy, and no finalizer on the job",
        TIMEOUT,
        || {
            let (copies, copy, pull, jobs) =
                (copies.clone(), copy.clone(), pull.clone(), env.jobs());
            async move {
                let copy = copies.get_opt(&copy).await.ok()??;
                let job = jobs.get("pull").await.ok()?;
                (copy.annotations()["imagepulljobs.kruise.io/references"] == pull
                    && job.finalizers().is_empty())
                .then_some(())
            }
        },
    )
    .await;

    // Still active and holding its copy, so that the release below is the deletion's doing.
    let active = env.jobs().get("pull").await.expect("read the job");
    assert!(
        active
            .status
            .as_ref()
            .is_none_or(|s| s.completion_time.is_none()),
        "the job completed before it was deleted: {:?}",
        active.status
    );
    assert!(
        copies
            .get_opt(&copy)
            .await
            .expect("read the copy")
            .is_some(),
        "the job's copy went before the job"
    );
    env.jobs()
        .delete("pull", &Default::default())
        .await
        .expect("delete the job");
    assert!(
        env.jobs().get_opt("pull").await.expect("read").is_none(),
        "the job goes at once: nothing holds it"
    );
    wait_for("the deleted job's copy to be released", TIMEOUT, || {
        let (copies, copy) = (copies.clone(), copy.clone());
        async move { copies.get_opt(&copy).await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert_eq!(
        copies
            .get("shared")
            .await
            .expect("still serving a job")
            .annotations()["imagepulljobs.kruise.io/references"],
        present
    );

    let _ = manager.stop.send(());
    manager
        .task
        .await
        .expect("the manager task")
        .expect("the manager stops cleanly");
}

/// Five jobs over four nodes each, pulling five images of one registry host at parallelism 4
/// (20 pulls at once without a budget), under `kruise-rs.io/max-pulls-per-registry: 3`: at no
/// time more than three entries of that host are written and unfinished, across all jobs; the
/// budget is used; every job completes; a job held back says why.
#[tokio::test]
async fn five_jobs_never_pull_more_from_one_registry_than_its_budget() {
    let env = env("ipj-budget").await;
    let nodes = env.nodes(4).await;
    let host = format!("{}.budget.test:5000", env.run);
    let images: Vec<String> = (0..5).map(|i| format!("{host}/app-{i}")).collect();
    // Watch every test NodeImage: unfinished entries of the host's images, at most at once.
    let max_in_flight = Arc::new(Mutex::new(0usize));
    let config = watcher::Config::default().labels(&format!("kruise-rs-test={}", env.run));
    let stream = watcher(env.nodeimages(), config).applied_objects();
    let (max, watched) = (max_in_flight.clone(), images.clone());
    let watch = tokio::spawn(async move {
        let mut per_node: HashMap<String, usize> = HashMap::new();
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(ni)) = stream.next().await {
            let unfinished = watched
                .iter()
                .filter_map(|image| {
                    let entry = tag_entry(&ni, image, "v1")?;
                    let finished = ni
                        .status
                        .as_ref()
                        .and_then(|s| s.image_statuses.get(image))
                        .and_then(|i| i.tags.iter().find(|t| t.tag == "v1"))
                        .is_some_and(|t| t.version == entry.version && t.completion_time.is_some());
                    (!finished).then_some(())
                })
                .count();
            per_node.insert(ni.name_any(), unfinished);
            let now: usize = per_node.values().sum();
            let mut max = max.lock().unwrap();
            *max = (*max).max(now);
        }
    });
    let daemons = kruise_rs_testkit::played_daemon::play_node_image_daemons(
        env.client.clone(),
        kruise_rs_testkit::played_daemon::PlayedDaemons {
            label_selector: Some(format!("kruise-rs-test={}", env.run)),
            delay_ms: 100..400,
            seed: 7,
            ..Default::default()
        },
    );
    for (i, image) in images.iter().enumerate() {
        let mut job = ImagePullJob::new(
            &format!("budget-{i}"),
            spec(&format!("{image}:v1"), env.selector(), 4),
        );
        env.label(&mut job.metadata);
        job.metadata.annotations = Some(BTreeMap::from([(
            kruise_rs_api::well_known::MAX_PULLS_PER_REGISTRY.to_owned(),
            "3".to_owned(),
        )]));
        env.jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create job");
    }
    let held_said = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let jobs = env.jobs();
    wait_for("every job to complete", Duration::from_secs(120), || {
        let (jobs, held_said, host) = (jobs.clone(), held_said.clone(), host.clone());
        async move {
            let list = jobs.list(&Default::default()).await.ok()?.items;
            if list.iter().any(|j| {
                j.status
                    .as_ref()
                    .and_then(|s| s.message.as_deref())
                    .is_some_and(|m| m.contains(&format!("waiting for room at {host}")))
            }) {
                held_said.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            (list.len() == 5 && list.iter().all(completed)).then_some(())
        }
    })
    .await;
    daemons.abort();
    watch.abort();
    let max = *max_in_flight.lock().unwrap();
    println!("at most {max} pulls from {host} at once (budget 3, 20 without)");
    assert!(max <= 3, "{max} pulls from {host} at once, budget 3");
    assert_eq!(max, 3, "the budget should be used");
    assert!(
        held_said.load(std::sync::atomic::Ordering::Relaxed),
        "a job held back says so in its status message"
    );
    let _ = nodes;
}

/// The most intervals of `spans` open at one moment.
fn most_at_once(spans: &[(std::time::SystemTime, std::time::SystemTime)]) -> usize {
    let mut edges: Vec<(std::time::SystemTime, i32)> = spans
        .iter()
        .flat_map(|(start, end)| [(*start, 1), (*end, -1)])
        .collect();
    // An end before a start at the same moment: back to back is not at once.
    edges.sort_by_key(|(at, change)| (*at, *change));
    let mut open = 0i32;
    let mut most = 0i32;
    for (_, change) in edges {
        open += change;
        most = most.max(open);
    }
    most as usize
}

#[test]
fn intervals_at_once_count_overlaps_only() {
    let t = |s: u64| std::time::UNIX_EPOCH + Duration::from_secs(s);
    assert_eq!(most_at_once(&[]), 0);
    assert_eq!(
        most_at_once(&[(t(0), t(2)), (t(2), t(4))]),
        1,
        "back to back"
    );
    assert_eq!(
        most_at_once(&[(t(0), t(5)), (t(1), t(2)), (t(1), t(3)), (t(4), t(6))]),
        3
    );
}

/// The budget as the registry sees it: three jobs over two nodes, each node with its own
/// containerd and a real daemon, pulling three images of one 8 MiB layer each through a proxy
/// that serves 2 MiB/s per connection (six pulls at once without a budget), under
/// `kruise-rs.io/max-pulls-per-registry: 2`. The registry's own log says when each layer's
/// download began and ended: never more than two at once, and two at some point.
#[tokio::test]
async fn the_registry_never_serves_more_pulls_at_once_than_the_budget() {
    let env = env("ipj-budget-real").await;
    let node_env = crate::support::node::node_env().await;
    let cluster = support::cluster().await;
    let nodes = env.nodes(2).await;
    let mut running = Vec::new();
    for node in &nodes {
        let dir = tempfile::Builder::new()
            .prefix("ctrd")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let containerd = node_env.start_containerd(dir.path());
        let daemon = crate::support::daemon::Daemon::start(
            node,
            containerd.socket(),
            cluster.kubeconfig_path(),
            4,
        )
        .await;
        running.push((daemon, containerd, dir));
    }
    let images_dir = tempfile::tempdir().expect("tempdir");
    let tags: Vec<String> = (0..3).map(|i| format!("{}-{i}", env.run)).collect();
    let tag_refs: Vec<&str> = tags.iter().map(String::as_str).collect();
    kruise_rs_testkit::slow_registry::build_large_images(images_dir.path(), &tag_refs, 8 << 20);
    for tag in &tag_refs {
        let out = std::process::Command::new("skopeo")
            .args(["copy", "-q", "--dest-tls-verify=false"])
            .arg(format!(
                "oci:{}:{tag}",
                images_dir.path().join("oci").display()
            ))
            .arg(format!(
                "docker://{}/{}/{tag}:v1",
                node_env.registry(),
                env.run
            ))
            .output()
            .expect("running skopeo");
        assert!(
            out.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let upstream: std::net::SocketAddr = node_env.registry().parse().expect("an address");
    let proxy = kruise_rs_testkit::slow_registry::slow_proxy(upstream, 2 << 20).await;
    node_env.add_plain_http_registry(&proxy.to_string());
    for (i, tag) in tag_refs.iter().enumerate() {
        let mut job = ImagePullJob::new(
            &format!("budget-{i}"),
            spec(&format!("{proxy}/{}/{tag}:v1", env.run), env.selector(), 2),
        );
        env.label(&mut job.metadata);
        job.metadata.annotations = Some(BTreeMap::from([(
            kruise_rs_api::well_known::MAX_PULLS_PER_REGISTRY.to_owned(),
            "2".to_owned(),
        )]));
        env.jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create job");
    }
    let jobs = env.jobs();
    wait_for("every job to complete", Duration::from_secs(180), || {
        let jobs = jobs.clone();
        async move {
            let list = jobs.list(&Default::default()).await.ok()?.items;
            (list.len() == 3
                && list
                    .iter()
                    .all(|j| completed(j) && j.status.as_ref().is_some_and(|s| s.succeeded == 2)))
            .then_some(())
        }
    })
    .await;
    for (daemon, containerd, _dir) in running {
        daemon.stop().await;
        containerd.stop();
    }
    // The large layers only (the manifests, configs and the shared busybox layer are small or
    // fetched once per node).
    let downloads = node_env.registry_downloads(&format!("/v2/{}/", env.run), 4 << 20);
    assert_eq!(
        downloads.len(),
        6,
        "each node fetched each image's layer once"
    );
    let most = most_at_once(&downloads);
    println!("the registry served at most {most} of the 6 layer downloads at once (budget 2)");
    assert!(most <= 2, "{most} downloads at once, budget 2");
    assert_eq!(most, 2, "the budget should be used");
}
