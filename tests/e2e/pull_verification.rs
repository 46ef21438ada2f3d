//! What a node's other pods may do with a private image the daemon pulled, under the kubelet's
//! image pull credential check (KEP-2535): the daemon pulls through CRI, so the kubelet holds no
//! pull record of the image and counts it as preloaded. Under the default policy
//! (`NeverVerifyPreloadedImages`) any pod on the node starts it without credentials; under
//! `AlwaysVerify` the kubelet pulls again with the pod's own credentials, and a pod without any
//! gets the registry's refusal. docs/security.md states both.

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kruise_rs_api::ImagePullJob;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::sidecarset::{app_command, node_has_image, ready, status};
use crate::support::{self, Cluster, TIMEOUT, unique_name, wait_for};

const POLICY_KEY: &str = "imagePullCredentialsVerificationPolicy";

/// The policy the running kubelet reports on `/configz` (through the apiserver's node proxy),
/// `None` while it does not answer or reports none.
async fn kubelet_policy(cluster: &Cluster) -> Option<String> {
    let request = http::Request::get(format!("/api/v1/nodes/{}/proxy/configz", cluster.node_name))
        .body(Vec::new())
        .expect("a configz request");
    let text = cluster.client().request_text(request).await.ok()?;
    let configz: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(configz["kubeletconfig"][POLICY_KEY].as_str()?.to_owned())
}

async fn wait_for_kubelet_policy(cluster: &Cluster, policy: &str) {
    wait_for(
        &format!("the kubelet answering /configz with {POLICY_KEY} {policy}"),
        TIMEOUT,
        || async { (kubelet_policy(cluster).await.as_deref() == Some(policy)).then_some(()) },
    )
    .await;
}

fn restart_kubelet(cluster: &Cluster) -> Result<(), String> {
    support::restart_process(&cluster.state_dir, "kubelet").map(drop)
}

/// The kubelet restarted with `AlwaysVerify` appended to its configuration (start.sh sets no
/// policy: the default); [`AlwaysVerify::restore`] (or, if the test panics first, drop) puts the
/// original configuration back and restarts it again, so later tests see the default.
struct AlwaysVerify {
    cluster: &'static Cluster,
    config: std::path::PathBuf,
    original: String,
    restored: bool,
}

impl AlwaysVerify {
    async fn set(cluster: &'static Cluster) -> Self {
        let config = cluster.state_dir.join("kubelet/config.yaml");
        let original = std::fs::read_to_string(&config)
            .unwrap_or_else(|e| panic!("reading {}: {e}", config.display()));
        assert!(
            !original.lines().any(|l| l.starts_with(POLICY_KEY)),
            "start.sh's kubelet configuration sets no {POLICY_KEY}"
        );
        // The gate is on by default from 1.35; naming it lets a 1.33 or 1.34 kubelet read the key.
        let changed = format!(
            "{original}featureGates: {{KubeletEnsureSecretPulledImages: true}}\n{POLICY_KEY}: AlwaysVerify\n"
        );
        std::fs::write(&config, changed)
            .unwrap_or_else(|e| panic!("writing {}: {e}", config.display()));
        let guard = Self {
            cluster,
            config,
            original,
            restored: false,
        };
        tokio::task::spawn_blocking(move || restart_kubelet(cluster))
            .await
            .expect("the restart task")
            .unwrap_or_else(|e| panic!("{e}"));
        wait_for_kubelet_policy(cluster, "AlwaysVerify").await;
        guard
    }

    async fn restore(mut self) {
        self.restored = true;
        let (cluster, config, original) =
            (self.cluster, self.config.clone(), self.original.clone());
        tokio::task::spawn_blocking(move || put_back(cluster, &config, &original))
            .await
            .expect("the restart task")
            .unwrap_or_else(|e| panic!("{e}"));
        wait_for_kubelet_policy(cluster, "NeverVerifyPreloadedImages").await;
    }
}

fn put_back(cluster: &Cluster, config: &Path, original: &str) -> Result<(), String> {
    std::fs::write(config, original).map_err(|e| format!("writing {}: {e}", config.display()))?;
    restart_kubelet(cluster)
}

impl Drop for AlwaysVerify {
    fn drop(&mut self) {
        if !self.restored
            && let Err(e) = put_back(self.cluster, &self.config, &self.original)
        {
            eprintln!("putting the kubelet's default pull verification back: {e}");
        }
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pushes the test image v3, made unique by a label, to the htpasswd registry; returns its name.
/// Unique: the kubelet keys its pull records by image ID, so an image the suite's pods had the
/// kubelet pull (v3 from the open registry) would count as pulled by the kubelet, not preloaded.
fn push_unique_private_image(cluster: &Cluster) -> String {
    let name = unique_name("private-app");
    let dir = tempfile::tempdir().expect("temporary directory");
    let layout = format!("oci:{}:v3", dir.path().display());
    run(
        "skopeo",
        &["copy", "-q", &cluster.test_image_source("v3"), &layout],
    );
    run(
        "umoci",
        &[
            "config",
            "--image",
            &format!("{}:v3", dir.path().display()),
            &format!("--config.label=e2e.kruise-rs/unique={name}"),
        ],
    );
    let image = format!("{}/{name}:v3", cluster.auth_registry);
    support::skopeo_copy_as(
        Some(&format!("{}:{}", cluster.auth_user, cluster.auth_password)),
        &layout,
        &image,
    );
    image
}

fn registry_secret(cluster: &Cluster, name: &str) -> Secret {
    let config = json!({"auths": {&cluster.auth_registry: {
        "username": cluster.auth_user, "password": cluster.auth_password
    }}});
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()}
    }))
    .expect("a registry Secret")
}

/// A pod running `image` with `pull_policy`, with the pull Secret `secret` if any.
async fn create_pod(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    image: &str,
    pull_policy: &str,
    secret: Option<&str>,
) {
    let pull_secrets: Vec<_> = secret.iter().map(|s| json!({"name": s})).collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 3,
            "imagePullSecrets": pull_secrets,
            "containers": [{
                "name": "app",
                "image": image,
                "imagePullPolicy": pull_policy,
                "command": app_command()
            }]
        }
    }))
    .expect("a pod");
    Api::<Pod>::namespaced(cluster.client(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {namespace}/{name}: {e}"));
}

async fn wait_running(cluster: &Cluster, namespace: &str, name: &str, why: &str) {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    wait_for(&format!("pod {name} running: {why}"), TIMEOUT, || async {
        ready(&pods.get(name).await.ok()?).then_some(())
    })
    .await;
}

/// The message of the kubelet's `Pulled` event for pod `name`: "already present on machine" when
/// it started the image without a pull, "Successfully pulled" after one.
async fn pulled_event(cluster: &Cluster, namespace: &str, name: &str) -> String {
    let events: Api<Event> = Api::namespaced(cluster.client(), namespace);
    let selector = ListParams::default().fields(&format!("involvedObject.name={name}"));
    wait_for(
        &format!("the kubelet's Pulled event for {name}"),
        TIMEOUT,
        || async {
            let list = events.list(&selector).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("Pulled"))?
                .message
        },
    )
    .await
}

/// The message of the image failure that keeps `name`'s container waiting, one of `reasons`;
/// panics if the container runs instead.
async fn wait_image_refused(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    reasons: &[&str],
) -> String {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), namespace);
    wait_for(&format!("pod {name}'s pull refused"), TIMEOUT, || async {
        let pod = pods.get(name).await.ok()?;
        let state = status(&pod, "app")?.state.as_ref()?;
        assert!(
            state.running.is_none() && state.terminated.is_none(),
            "pod {namespace}/{name} started the private image without credentials: {state:?}"
        );
        let waiting = state.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        reasons
            .contains(&reason)
            .then(|| waiting.message.clone().unwrap_or_default())
    })
    .await
}

/// The daemon pulls a private image for a job whose namespace holds the registry Secret; a pod of
/// another namespace without any pull Secret then starts it (`IfNotPresent`) under the kubelet's
/// default policy, and does not under `AlwaysVerify` (the registry's 401), where a pod with its
/// own Secret for the registry still starts it, but only if it may pull (not with `Never`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_pulled_private_image_needs_the_pods_credentials_only_under_always_verify() {
    // Exclusive: the kubelet restarts, twice.
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    wait_for_kubelet_policy(cluster, "NeverVerifyPreloadedImages").await;

    let image = push_unique_private_image(cluster);
    let owner = cluster.namespace("e2e-kep-owner", json!({})).await;
    Api::<Secret>::namespaced(cluster.client(), &owner.name)
        .create(&PostParams::default(), &registry_secret(cluster, "reg"))
        .await
        .expect("creating the owner's registry Secret");
    let job: ImagePullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "ImagePullJob",
        "metadata": {"name": "pull-private"},
        "spec": {
            "image": image,
            "pullSecrets": ["reg"],
            "selector": {"names": [cluster.node_name]},
            "pullPolicy": {"timeoutSeconds": 60, "backoffLimit": 1},
            "completionPolicy": {"type": "Always", "activeDeadlineSeconds": 300}
        }
    }))
    .expect("an ImagePullJob");
    let jobs: Api<ImagePullJob> = Api::namespaced(cluster.client(), &owner.name);
    jobs.create(&PostParams::default(), &job)
        .await
        .expect("creating the ImagePullJob");
    let pulled = wait_for("the private pull to complete", TIMEOUT, || async {
        let status = jobs.get("pull-private").await.ok()?.status?;
        status.completion_time.is_some().then_some(status)
    })
    .await;
    assert_eq!(
        (pulled.succeeded, pulled.failed),
        (1, 0),
        "the daemon pulled with the owner's Secret: {pulled:?}"
    );
    assert!(
        node_has_image(cluster, &image).await,
        "containerd has {image}"
    );

    let other = cluster.namespace("e2e-kep-other", json!({})).await;
    create_pod(
        cluster,
        &other.name,
        "default-policy",
        &image,
        "IfNotPresent",
        None,
    )
    .await;
    wait_running(
        cluster,
        &other.name,
        "default-policy",
        "under NeverVerifyPreloadedImages a daemon-pulled image counts as preloaded",
    )
    .await;
    let started = pulled_event(cluster, &other.name, "default-policy").await;
    assert!(
        started.contains("already present on machine"),
        "the kubelet started it without a pull: {started}"
    );

    let always_verify = AlwaysVerify::set(cluster).await;
    create_pod(
        cluster,
        &other.name,
        "no-secret",
        &image,
        "IfNotPresent",
        None,
    )
    .await;
    let refusal = wait_image_refused(
        cluster,
        &other.name,
        "no-secret",
        &["ErrImagePull", "ImagePullBackOff"],
    )
    .await;
    // containerd 1.6 quotes the registry's 401; 2.x says it had no credentials to answer it with.
    assert!(
        refusal.contains("401 Unauthorized") || refusal.contains("no basic auth credentials"),
        "the kubelet pulled again without credentials and the registry refused: {refusal}"
    );
    Api::<Secret>::namespaced(cluster.client(), &other.name)
        .create(&PostParams::default(), &registry_secret(cluster, "own-reg"))
        .await
        .expect("creating the other namespace's registry Secret");
    // `Never` forbids the pull that would check the Secret: the kubelet says the image is absent.
    create_pod(
        cluster,
        &other.name,
        "never",
        &image,
        "Never",
        Some("own-reg"),
    )
    .await;
    wait_image_refused(cluster, &other.name, "never", &["ErrImageNeverPull"]).await;
    create_pod(
        cluster,
        &other.name,
        "own-secret",
        &image,
        "IfNotPresent",
        Some("own-reg"),
    )
    .await;
    wait_running(
        cluster,
        &other.name,
        "own-secret",
        "under AlwaysVerify a pod with its own valid Secret passes the check",
    )
    .await;
    let pulled = pulled_event(cluster, &other.name, "own-secret").await;
    assert!(
        pulled.contains("Successfully pulled"),
        "the kubelet checked the Secret by pulling again: {pulled}"
    );
    always_verify.restore().await;
}
