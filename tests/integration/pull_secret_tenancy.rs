//! Pull credentials stay with the jobs that named them (decision 0024), through the manager,
//! the daemon and a real containerd pulling from the htpasswd registry on loopback.
//!
//! Two tenants' jobs pull two tags of one private image onto one node. Tenant A names its
//! Secret; tenant B names none and may not read A's. The NodeImage lists pull secrets per image
//! (upstream's shape), so before the fix B's tag was pulled with A's copy: B had a private image
//! it holds no credentials for on the node, to run with `IfNotPresent`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use kruise_rs_api::imagepulljob::{
    CompletionPolicy, CompletionPolicyType, ImagePullJob, ImagePullJobNodeSelector,
    ImagePullJobSpec, ImagePullJobTemplate, PullPolicy,
};
use kruise_rs_api::nodeimage::{ImagePullPhase, NodeImage};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::daemon::{WAIT, docker_config_secret, finished_at, wait_tag};
use crate::support::cri_proxy::CriProxy;
use crate::support::daemon::Daemon;
use crate::support::node::{Variant, node_env};
use crate::support::{CONTROLLED_LABEL, cluster, unique_name, wait_for};

/// The daemons' namespace of the in-process manager.
const DAEMON_NS: &str = "kruise-daemon-config";

/// A NodeImage the in-process manager serves without a Node behind it.
async fn served_nodeimage(node: &str, run: &str) {
    let nodeimage: NodeImage = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "NodeImage",
        "metadata": {"name": node, "labels": {
            "apps.kruise.io/fake-nodeimage": "true", CONTROLLED_LABEL: run}},
        "spec": {}
    }))
    .expect("NodeImage");
    Api::<NodeImage>::all(cluster().await.client().await)
        .create(&PostParams::default(), &nodeimage)
        .await
        .expect("create NodeImage");
}

/// A job pulling `image` on `node` once, with `secrets`.
fn job(
    name: &str,
    run: &str,
    image: &str,
    node: &str,
    secrets: &[&str],
    completion: CompletionPolicyType,
) -> ImagePullJob {
    let mut job = ImagePullJob::new(
        name,
        ImagePullJobSpec {
            image: image.to_owned(),
            template: ImagePullJobTemplate {
                selector: Some(ImagePullJobNodeSelector {
                    names: vec![node.to_owned()],
                    ..Default::default()
                }),
                pull_secrets: secrets.iter().map(|s| (*s).to_owned()).collect(),
                pull_policy: Some(PullPolicy {
                    backoff_limit: Some(0),
                    timeout_seconds: Some(30),
                }),
                completion_policy: CompletionPolicy {
                    type_: Some(completion),
                    ..Default::default()
                },
                ..Default::default()
            },
        },
    );
    job.metadata.labels = Some(BTreeMap::from([(
        CONTROLLED_LABEL.to_owned(),
        run.to_owned(),
    )]));
    job
}

/// The NodeImage's `pullSecrets` for `image`, by name.
async fn listed_secrets(node: &str, image: &str) -> Vec<String> {
    let ni = Api::<NodeImage>::all(cluster().await.client().await)
        .get(node)
        .await
        .expect("NodeImage");
    ni.spec
        .images
        .get(image)
        .map(|i| {
            i.pull_secrets
                .iter()
                .filter_map(|s| s.name.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// The copies in the daemons' namespace whose source is `namespace/name`.
async fn copies_of(namespace: &str, name: &str) -> Vec<Secret> {
    let source = format!("{namespace}/{name}");
    Api::<Secret>::namespaced(cluster().await.client().await, DAEMON_NS)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("imagepulljobs.kruise.io/source-key"))
                == Some(&source)
        })
        .collect()
}

/// Two tenants' namespaces (A holding the registry Secret `reg`), tags v1 and v2 of one private
/// image in the htpasswd registry, and a served NodeImage with the daemon pulling through the
/// recording CRI proxy.
struct Tenancy {
    client: kube::Client,
    a: crate::support::TestNamespace,
    b: crate::support::TestNamespace,
    image: String,
    node: String,
    run: String,
    proxy: CriProxy,
    daemon: Daemon,
}

impl Tenancy {
    async fn start(node_prefix: &str) -> Tenancy {
        let env = node_env().await;
        let cluster = cluster().await;
        cluster.start_controllers();
        let client = cluster.client().await;
        let (a, b) = (
            cluster.namespace("tenant-a").await,
            cluster.namespace("tenant-b").await,
        );
        let registry = env.auth_registry();
        Api::<Secret>::namespaced(client.clone(), a.name())
            .create(
                &PostParams::default(),
                &docker_config_secret(
                    a.name(),
                    "reg",
                    registry,
                    env.auth_user(),
                    env.auth_password(),
                ),
            )
            .await
            .expect("tenant A's secret");
        let image = format!("{registry}/{}", unique_name("private-app"));
        env.push(Variant::V1, &format!("{image}:v1"));
        env.push(Variant::V2, &format!("{image}:v2"));
        let node = unique_name(node_prefix);
        let run = unique_name("run");
        served_nodeimage(&node, &run).await;
        let proxy = CriProxy::start(env.containerd_socket());
        let daemon = Daemon::start(&node, proxy.socket(), cluster.kubeconfig_path(), 4).await;
        Tenancy {
            client,
            a,
            b,
            image,
            node,
            run,
            proxy,
            daemon,
        }
    }

    /// Creates, in `namespace`, a job pulling `tag` on the node with `secrets`.
    async fn job(
        &self,
        namespace: &str,
        tag: &str,
        secrets: &[&str],
        completion: CompletionPolicyType,
    ) -> Api<ImagePullJob> {
        let jobs = Api::<ImagePullJob>::namespaced(self.client.clone(), namespace);
        let name = format!("pull-{tag}");
        let image = format!("{}:{tag}", self.image);
        jobs.create(
            &PostParams::default(),
            &job(&name, &self.run, &image, &self.node, secrets, completion),
        )
        .await
        .unwrap_or_else(|e| panic!("job {namespace}/{name}: {e}"));
        jobs
    }
}

#[tokio::test]
async fn another_tenants_tag_of_the_same_image_is_not_pulled_with_its_credentials() {
    let t = Tenancy::start("tenancy").await;
    let (a, b) = (t.a.name(), t.b.name());
    // A's job keeps running (Never), so its copy exists and stays listed while B pulls.
    t.job(a, "v1", &["reg"], CompletionPolicyType::Never).await;
    wait_tag(
        &t.node,
        &t.image,
        "v1",
        "pulled with tenant A's credentials",
        finished_at(ImagePullPhase::Succeeded, 0),
    )
    .await;

    let b_jobs = t.job(b, "v2", &[], CompletionPolicyType::Always).await;
    let done = wait_for("tenant B's job to finish", WAIT, || async {
        b_jobs
            .get("pull-v2")
            .await
            .ok()
            .and_then(|j| j.status)
            .filter(|s| s.completion_time.is_some())
    })
    .await;
    assert_eq!((done.succeeded, done.failed), (0, 1), "{done:?}");
    let refused = wait_tag(
        &t.node,
        &t.image,
        "v2",
        "refused by the registry",
        finished_at(ImagePullPhase::Failed, 0),
    )
    .await;
    let message = refused.message.unwrap_or_default();
    assert!(message.contains("401 Unauthorized"), "{message}");

    // Both tags share the image entry, which lists A's copy: the daemon gave it to A's tag only.
    let copy = copies_of(a, "reg").await;
    let copy_name = copy
        .first()
        .and_then(|c| c.metadata.name.clone())
        .expect("tenant A's copy exists while its job runs");
    assert_eq!(listed_secrets(&t.node, &t.image).await, [copy_name]);
    let auth_of = |tag: &str| -> Vec<Option<String>> {
        t.proxy
            .pull_requests()
            .into_iter()
            .filter(|r| {
                r.image
                    .as_ref()
                    .is_some_and(|i| i.image == format!("{}:{tag}", t.image))
            })
            .map(|r| r.auth.map(|a| a.username))
            .collect()
    };
    assert_eq!(
        auth_of("v1"),
        [Some(node_env().await.auth_user().to_owned())]
    );
    assert_eq!(
        auth_of("v2"),
        [None],
        "tenant B's PullImage carried no credentials"
    );
    t.daemon.stop().await;
}

#[tokio::test]
async fn a_finished_jobs_copy_leaves_the_nodeimage_and_is_never_reported_missing() {
    let t = Tenancy::start("tenancy-done").await;
    let (a, b) = (t.a.name(), t.b.name());
    let a_jobs = t.job(a, "v1", &["reg"], CompletionPolicyType::Always).await;
    wait_for(
        "tenant A's job to finish and release its copy",
        WAIT,
        || async {
            let finished = a_jobs
                .get("pull-v1")
                .await
                .ok()
                .and_then(|j| j.status)
                .is_some_and(|s| s.completion_time.is_some() && s.succeeded == 1);
            (finished && copies_of(a, "reg").await.is_empty()).then_some(())
        },
    )
    .await;
    assert_eq!(
        listed_secrets(&t.node, &t.image).await.len(),
        1,
        "the released copy is still listed until the image's next write"
    );

    t.job(b, "v2", &[], CompletionPolicyType::Always).await;
    let refused = wait_tag(
        &t.node,
        &t.image,
        "v2",
        "refused by the registry",
        finished_at(ImagePullPhase::Failed, 0),
    )
    .await;
    let message = refused.message.unwrap_or_default();
    assert!(message.contains("401 Unauthorized"), "{message}");
    assert!(
        !message.contains("cannot be read"),
        "a released copy is nobody's problem: {message}"
    );
    assert_eq!(
        listed_secrets(&t.node, &t.image).await,
        Vec::<String>::new(),
        "B's write dropped the copy no running owner holds"
    );
    t.daemon.stop().await;
}
