//! The NodeImage controller against a real apiserver. There is no kubelet: the tests create
//! Node objects and set their Ready condition themselves, and play the node daemon by writing
//! NodeImage status. Other tests share the cluster (and their jobs may add tags to any
//! NodeImage), so every test uses its own nodes and image names and looks only at those.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kruise_rs_api::imagepulljob::{
    ImagePullJob, ImagePullJobNodeSelector, ImagePullJobSpec, ImagePullJobTemplate,
};
use kruise_rs_api::nodeimage::{
    ImagePullPhase, ImageSpec, ImageTagPullPolicy, ImageTagSpec, NodeImage,
};
use kruise_rs_api::well_known::FAKE_NODEIMAGE;
use kruise_rs_imagepull::nodeimage::plan::not_responded;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::support::{self, TEST_RESPONSE_TIMEOUT, TestNamespace, wait_for};

const TIMEOUT: Duration = Duration::from_secs(30);
/// The label every object of these tests carries, valued with the test's run name.
const RUN_LABEL: &str = "kruise-rs-test";

struct Env {
    client: Client,
    run: String,
}

async fn env(prefix: &str) -> Env {
    let cluster = support::cluster().await;
    cluster.start_controllers();
    Env {
        client: cluster.client().await,
        run: support::unique_name(prefix),
    }
}

fn time_now() -> Time {
    Time(Timestamp::now())
}

impl Env {
    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn nodeimages(&self) -> Api<NodeImage> {
        Api::all(self.client.clone())
    }

    fn labels(&self, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([(RUN_LABEL.to_owned(), self.run.clone())]);
        labels.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        labels
    }

    /// An image name no other test uses.
    fn image(&self, name: &str) -> String {
        format!("127.0.0.1:5000/{}/{name}", self.run)
    }

    /// Creates a Node `<run>-<suffix>` with these labels (and the run label) and, unless
    /// `ready` is `None`, a Ready condition with that status.
    async fn node(&self, suffix: &str, labels: &[(&str, &str)], ready: Option<&str>) -> String {
        let name = format!("{}-{suffix}", self.run);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(self.labels(labels)),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        self.nodes()
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
        if let Some(status) = ready {
            self.set_ready(&name, status).await;
        }
        name
    }

    /// Plays the kubelet: sets the Node's Ready condition, transitioning now.
    async fn set_ready(&self, name: &str, status: &str) {
        let now = time_now();
        let patch = json!({"status": {"conditions": [{
            "type": "Ready",
            "status": status,
            "reason": "KubeletReady",
            "message": "set by the test",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }]}});
        self.nodes()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("setting Node {name} Ready={status}: {e}"));
    }

    async fn delete_node(&self, name: &str) {
        match self.nodes().delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => panic!("deleting Node {name}: {e}"),
        }
    }

    /// The NodeImage `name`, once `done` holds for it.
    async fn wait_nodeimage(
        &self,
        name: &str,
        what: &str,
        done: impl Fn(&NodeImage) -> bool,
    ) -> NodeImage {
        let api = self.nodeimages();
        wait_for(&format!("NodeImage {name}: {what}"), TIMEOUT, || {
            let api = api.clone();
            let done = &done;
            async move { api.get_opt(name).await.ok().flatten().filter(|ni| done(ni)) }
        })
        .await
    }

    async fn wait_nodeimage_gone(&self, name: &str) {
        let api = self.nodeimages();
        wait_for(&format!("NodeImage {name} to be deleted"), TIMEOUT, || {
            let api = api.clone();
            async move { matches!(api.get_opt(name).await, Ok(None)).then_some(()) }
        })
        .await;
    }

    async fn exists(&self, name: &str) -> bool {
        self.nodeimages()
            .get_opt(name)
            .await
            .unwrap_or_else(|e| panic!("reading NodeImage {name}: {e}"))
            .is_some()
    }

    /// Creates a NodeImage with no Node behind it.
    async fn orphan_nodeimage(&self, suffix: &str, labels: &[(&str, &str)]) -> String {
        let name = format!("{}-{suffix}", self.run);
        let mut ni = NodeImage::new(&name, Default::default());
        ni.metadata.labels = Some(self.labels(labels));
        self.nodeimages()
            .create(&PostParams::default(), &ni)
            .await
            .unwrap_or_else(|e| panic!("creating NodeImage {name}: {e}"));
        name
    }

    /// Adds `images` to the NodeImage's spec (a merge patch: other images are left alone).
    async fn add_images(&self, name: &str, images: &[(&str, ImageSpec)]) {
        let images: serde_json::Map<_, _> = images
            .iter()
            .map(|(k, v)| ((*k).to_owned(), serde_json::to_value(v).expect("json")))
            .collect();
        self.nodeimages()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"images": images}})),
            )
            .await
            .unwrap_or_else(|e| panic!("adding images to NodeImage {name}: {e}"));
    }

    /// An ImagePullJob that targets no real node and is paused, so the ImagePullJob
    /// controller never writes into our NodeImages: it only has to exist.
    async fn job(&self, ns: &TestNamespace, name: &str) -> ImagePullJob {
        let spec = ImagePullJobSpec {
            image: self.image("owner"),
            template: ImagePullJobTemplate {
                selector: Some(ImagePullJobNodeSelector {
                    names: vec![format!("{}-no-such-node", self.run)],
                    ..Default::default()
                }),
                parallelism: Some(IntOrString::Int(0)),
                ..Default::default()
            },
        };
        Api::<ImagePullJob>::namespaced(self.client.clone(), ns.name())
            .create(&PostParams::default(), &ImagePullJob::new(name, spec))
            .await
            .unwrap_or_else(|e| panic!("creating ImagePullJob {name}: {e}"))
    }

    /// Deletes a job and waits until it is gone.
    async fn delete_job(&self, ns: &TestNamespace, name: &str) {
        let jobs: Api<ImagePullJob> = Api::namespaced(self.client.clone(), ns.name());
        let _ = jobs.delete(name, &DeleteParams::default()).await;
        wait_for(&format!("ImagePullJob {name} to be gone"), TIMEOUT, || {
            let jobs = jobs.clone();
            async move { matches!(jobs.get_opt(name).await, Ok(None)).then_some(()) }
        })
        .await;
    }
}

fn owner(job: &ImagePullJob) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps.kruise.io/v1beta1".into()),
        kind: Some("ImagePullJob".into()),
        name: job.metadata.name.clone(),
        namespace: job.metadata.namespace.clone(),
        uid: job.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

fn tag(name: &str, owners: Vec<ObjectReference>) -> ImageTagSpec {
    ImageTagSpec {
        tag: name.into(),
        created_at: Some(time_now()),
        owner_references: owners,
        version: Some(1),
        ..ImageTagSpec::default()
    }
}

fn image(tags: Vec<ImageTagSpec>) -> ImageSpec {
    ImageSpec {
        tags,
        ..ImageSpec::default()
    }
}

fn tags_of(ni: &NodeImage, image: &str) -> Option<Vec<String>> {
    ni.spec
        .images
        .get(image)
        .map(|i| i.tags.iter().map(|t| t.tag.to_string()).collect())
}

#[tokio::test]
async fn a_ready_node_gets_a_nodeimage_that_follows_its_labels_and_goes_with_it() {
    let env = env("ni-life").await;
    let node = env
        .node("n", &[("zone", "a"), ("tier", "web")], Some("True"))
        .await;
    let want = env.labels(&[("zone", "a"), ("tier", "web")]);
    env.wait_nodeimage(&node, "labelled like its Node", |ni| {
        ni.metadata.labels.as_ref() == Some(&want)
    })
    .await;

    // Labels change, disappear and appear on the Node: the NodeImage follows exactly.
    let patch = json!({"metadata": {"labels": {"zone": "b", "tier": null, "new": "1"}}});
    env.nodes()
        .patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("relabel the Node");
    let want = env.labels(&[("zone", "b"), ("new", "1")]);
    env.wait_nodeimage(&node, "relabelled like its Node", |ni| {
        ni.metadata.labels.as_ref() == Some(&want)
    })
    .await;

    // Someone edits the NodeImage's labels: they are put back.
    let tamper = json!({"metadata": {"labels": {"zone": "x", "extra": "y"}}});
    env.nodeimages()
        .patch(&node, &PatchParams::default(), &Patch::Merge(&tamper))
        .await
        .expect("relabel the NodeImage");
    env.wait_nodeimage(&node, "its labels put back", |ni| {
        ni.metadata.labels.as_ref() == Some(&want)
    })
    .await;

    env.delete_node(&node).await;
    env.wait_nodeimage_gone(&node).await;
}

#[tokio::test]
async fn a_node_being_deleted_loses_its_nodeimage_at_once() {
    let env = env("ni-deleting").await;
    let node = env.node("n", &[], Some("True")).await;
    env.wait_nodeimage(&node, "created", |_| true).await;
    // A finalizer keeps the Node around, being deleted, as a real kubelet-less cluster might.
    let finalizer = json!({"metadata": {"finalizers": ["kruise-rs-tests/hold"]}});
    env.nodes()
        .patch(&node, &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .expect("add a finalizer");
    env.delete_node(&node).await;
    env.wait_nodeimage_gone(&node).await;
    let release = json!({"metadata": {"finalizers": null}});
    env.nodes()
        .patch(&node, &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("drop the finalizer");
}

#[tokio::test]
async fn only_ready_nodes_that_are_not_virtual_get_a_nodeimage() {
    let env = env("ni-ready").await;
    let unready = env.node("unready", &[], Some("False")).await;
    let unknown = env.node("no-status", &[], None).await;
    let virtual_ = env
        .node("virtual", &[("type", "virtual-kubelet")], Some("True"))
        .await;
    let ready = env.node("ready", &[], Some("True")).await;

    // The ready node, created last, is the barrier: the others were seen before it.
    env.wait_nodeimage(&ready, "created", |_| true).await;
    for name in [&unready, &unknown, &virtual_] {
        assert!(!env.exists(name).await, "{name} must have no NodeImage");
    }

    // Once Ready, it gets one.
    env.set_ready(&unready, "True").await;
    env.wait_nodeimage(&unready, "created once Ready", |_| true)
        .await;
    assert!(!env.exists(&virtual_).await);

    for name in [&unready, &unknown, &virtual_, &ready] {
        env.delete_node(name).await;
    }
    env.wait_nodeimage_gone(&ready).await;
    env.wait_nodeimage_gone(&unready).await;
}

#[tokio::test]
async fn a_nodeimage_without_a_node_is_deleted_unless_labelled_fake() {
    let env = env("ni-fake").await;
    let fake = env.orphan_nodeimage("fake", &[(FAKE_NODEIMAGE, "")]).await;
    // A tag of a job that never existed: once it is collected, the controller has certainly
    // reconciled the fake NodeImage, and kept it.
    let ghost = ObjectReference {
        api_version: Some("apps.kruise.io/v1alpha1".into()),
        kind: Some("ImagePullJob".into()),
        name: Some("never-existed".into()),
        namespace: Some("default".into()),
        uid: Some(format!("{}-ghost", env.run)),
        ..ObjectReference::default()
    };
    let img = env.image("app");
    env.add_images(&fake, &[(&img, image(vec![tag("v1", vec![ghost])]))])
        .await;
    let orphan = env.orphan_nodeimage("orphan", &[]).await;

    env.wait_nodeimage_gone(&orphan).await;
    let kept = env
        .wait_nodeimage(&fake, "its ghost-owned image collected", |ni| {
            !ni.spec.images.contains_key(img.as_str())
        })
        .await;
    assert!(kept.metadata.deletion_timestamp.is_none());

    env.nodeimages()
        .delete(&fake, &DeleteParams::default())
        .await
        .expect("clean up the fake NodeImage");
}

#[tokio::test]
async fn tags_of_gone_jobs_are_collected_and_tags_of_live_owners_stay() {
    let env = env("ni-gc").await;
    let cluster = support::cluster().await;
    let ns = cluster.namespace("ni-gc").await;
    let job = env.job(&ns, "live").await;
    let node = env.node("n", &[], Some("True")).await;
    env.wait_nodeimage(&node, "created", |_| true).await;

    let gone_job = ObjectReference {
        name: Some("gone".into()),
        uid: Some(format!("{}-gone", env.run)),
        ..owner(&job)
    };
    let replaced = ObjectReference {
        uid: Some(format!("{}-older-live", env.run)),
        ..owner(&job)
    };
    let deployment = ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("Deployment".into()),
        name: Some("web".into()),
        namespace: Some(ns.name().to_owned()),
        uid: Some(format!("{}-deployment", env.run)),
        ..ObjectReference::default()
    };
    let (gone_img, live_img, other_img) =
        (env.image("gone"), env.image("live"), env.image("other"));
    env.add_images(
        &node,
        &[
            (&gone_img, image(vec![tag("v1", vec![gone_job.clone()])])),
            (
                &live_img,
                image(vec![
                    tag("v1", vec![owner(&job), gone_job]),
                    tag("v2", vec![replaced]),
                ]),
            ),
            (&other_img, image(vec![tag("v1", vec![deployment])])),
        ],
    )
    .await;

    let ni = env
        .wait_nodeimage(&node, "the gone job's tags collected", |ni| {
            tags_of(ni, &gone_img).is_none()
                && tags_of(ni, &live_img) == Some(vec!["v1".to_owned()])
        })
        .await;
    assert_eq!(
        ni.spec.images[live_img.as_str()].tags[0].owner_references,
        vec![owner(&job)],
        "only the live job's reference remains"
    );
    assert_eq!(tags_of(&ni, &other_img), Some(vec!["v1".to_owned()]));

    // Its job deleted, the live tag goes too (the job watch triggers the collection).
    env.delete_job(&ns, "live").await;
    let ni = env
        .wait_nodeimage(&node, "the deleted job's tag collected", |ni| {
            tags_of(ni, &live_img).is_none()
        })
        .await;
    assert_eq!(
        tags_of(&ni, &other_img),
        Some(vec!["v1".to_owned()]),
        "another kind of owner is never collected"
    );

    env.delete_node(&node).await;
    env.wait_nodeimage_gone(&node).await;
}

#[tokio::test]
async fn a_finished_tag_is_collected_once_its_ttl_has_passed() {
    const TTL: i64 = 3;
    let env = env("ni-ttl").await;
    let cluster = support::cluster().await;
    let ns = cluster.namespace("ni-ttl").await;
    let job = env.job(&ns, "ttl").await;
    let node = env.node("n", &[], Some("True")).await;
    env.wait_nodeimage(&node, "created", |_| true).await;

    let img = env.image("ttl");
    let mut t = tag("v1", vec![owner(&job)]);
    t.pull_policy = Some(ImageTagPullPolicy {
        ttl_seconds_after_finished: Some(TTL as i32),
        ..ImageTagPullPolicy::default()
    });
    env.add_images(&node, &[(&img, image(vec![t]))]).await;

    // Play the daemon: the pull of version 1 succeeded now.
    let status = json!({"status": {"imageStatuses": {&img: {"tags": [{
        "tag": "v1", "phase": "Succeeded", "progress": 100, "version": 1,
        "startTime": time_now(), "completionTime": time_now(),
        "imageID": format!("{img}@sha256:0000"),
    }]}}}});
    let written = env
        .nodeimages()
        .patch_status(
            &node,
            &PatchParams::apply(support::FIELD_MANAGER),
            &Patch::Merge(&status),
        )
        .await
        .expect("report the pull");
    let completed = written
        .status
        .as_ref()
        .and_then(|s| s.image_statuses.get(img.as_str()))
        .and_then(|s| s.tags[0].completion_time.clone())
        .expect("completionTime stored")
        .0;

    env.wait_nodeimage(&node, "the finished tag collected after its TTL", |ni| {
        tags_of(ni, &img).is_none()
    })
    .await;
    let seen = Timestamp::now();
    assert!(
        seen >= completed + SignedDuration::from_secs(TTL),
        "collected at {seen}, before completion {completed} + {TTL}s"
    );

    env.delete_node(&node).await;
    env.wait_nodeimage_gone(&node).await;
}

#[tokio::test]
async fn an_unanswered_tag_fails_after_the_response_timeout_with_warning_events() {
    let env = env("ni-timeout").await;
    let cluster = support::cluster().await;
    let ns = cluster.namespace("ni-timeout").await;
    let job = env.job(&ns, "silent").await;
    let node = env.node("n", &[], Some("True")).await;
    env.wait_nodeimage(&node, "created", |_| true).await;

    let img = env.image("silent");
    let t = tag("v1", vec![owner(&job)]);
    let created = t.created_at.clone().expect("createdAt").0;
    env.add_images(&node, &[(&img, image(vec![t]))]).await;

    let message = not_responded(TEST_RESPONSE_TIMEOUT);
    let api = env.nodeimages();
    let failed = wait_for(
        "the unanswered tag marked Failed",
        TIMEOUT + TEST_RESPONSE_TIMEOUT,
        || {
            let api = api.clone();
            let (node, img) = (&node, &img);
            async move {
                let ni = api.get(node).await.ok()?;
                let status = ni.status?;
                let tag = status
                    .image_statuses
                    .get(img.as_str())?
                    .tags
                    .first()?
                    .clone();
                (tag.phase == ImagePullPhase::Failed).then_some((tag, status.failed))
            }
        },
    )
    .await;
    let (tag, failed_count) = failed;
    assert_eq!(tag.message.as_deref(), Some(message.as_str()));
    assert_eq!(tag.version, Some(1));
    let completed = tag.completion_time.expect("completionTime").0;
    // Stored times have whole seconds: createdAt was rounded down when written.
    assert!(
        completed
            >= created - SignedDuration::from_secs(1)
                + SignedDuration::try_from(TEST_RESPONSE_TIMEOUT).expect("fits"),
        "failed at {completed}, before {created} + {TEST_RESPONSE_TIMEOUT:?}"
    );
    assert!(failed_count >= 1, "status.failed recounted: {failed_count}");

    // A Warning on the owner job, and one on the NodeImage.
    let note = format!("Failed to pull image {img}:v1 on node {node}: {message}");
    let job_uid = job.uid().expect("uid");
    let find = |namespace: String, uid: Option<String>, kind: &'static str, name: String| {
        let events: Api<Event> = Api::namespaced(env.client.clone(), &namespace);
        let note = note.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                let regarding = e.regarding.as_ref();
                e.reason.as_deref() == Some("PullImageFailed")
                    && e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref() == Some(note.as_str())
                    && regarding.and_then(|r| r.kind.as_deref()) == Some(kind)
                    && regarding.and_then(|r| r.name.clone()) == Some(name.clone())
                    && (uid.is_none() || regarding.and_then(|r| r.uid.clone()) == uid)
            })
        }
    };
    let on_job = wait_for("a PullImageFailed event on the job", TIMEOUT, || {
        find(
            ns.name().to_owned(),
            Some(job_uid.clone()),
            "ImagePullJob",
            "silent".to_owned(),
        )
    })
    .await;
    assert_eq!(
        on_job.reporting_controller.as_deref(),
        Some("kruise-rs-manager")
    );
    wait_for("a PullImageFailed event on the NodeImage", TIMEOUT, || {
        find("default".to_owned(), None, "NodeImage", node.clone())
    })
    .await;

    env.delete_node(&node).await;
    env.wait_nodeimage_gone(&node).await;
}

#[tokio::test]
async fn the_controller_stops_promptly_even_before_its_caches_are_filled() {
    let cluster = support::cluster().await;
    // Scoped to a label nothing carries: this instance must not act on other tests' objects.
    let scope = format!("{RUN_LABEL}={}", support::unique_name("ni-stop"));
    for run_for in [
        Duration::ZERO,
        Duration::from_millis(300),
        Duration::from_secs(2),
    ] {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let opts = kruise_rs::controllers::ControllerOptions {
            label_selector: Some(scope.clone()),
            ..support::test_controller_options()
        };
        let controller = tokio::spawn(kruise_rs_imagepull::nodeimage::run(
            cluster.client().await,
            opts,
            async move {
                let _ = stopped.await;
            },
        ));
        // Not a condition to wait for: the point is to stop at different stages of start-up.
        tokio::time::sleep(run_for).await;
        let asked = tokio::time::Instant::now();
        stop.send(()).expect("the controller is still running");
        tokio::time::timeout(Duration::from_secs(5), controller)
            .await
            .unwrap_or_else(|_| {
                panic!("stopped {run_for:?} after its start, it must end within 5 s")
            })
            .expect("join");
        eprintln!(
            "stopped {run_for:?} after start: ended in {:?}",
            asked.elapsed()
        );
    }
}
