//! Switching a cluster from upstream OpenKruise to kruise-rs, the CRD part of the runbook in
//! `deploy/README.md` ("Switching from OpenKruise"), played on a control plane of its own: CRDs
//! are cluster-wide, and every other test needs ours as they are.
//!
//! The cluster's history, as upstream leaves it:
//! 1. upstream 1.8: the three CRDs serve and store `v1alpha1` only; objects are created then
//!    (stored as `v1alpha1`);
//! 2. upgraded to upstream 1.9: both versions served, `v1beta1` stored, and the SidecarSet CRD
//!    converts through kruise-manager's conversion webhook (upstream's `config/crd/kustomization.yaml`
//!    and chart enable it for SidecarSet, not for ImagePullJob or NodeImage). More objects are
//!    created, in the stored version, which needs no conversion. Then kruise-manager is gone: its
//!    Service does not exist here, so every conversion fails, as in a cluster whose upstream
//!    manager was stopped.
//!
//! The upstream CRDs are ours with upstream's versions and conversion, plus a printer column of
//! upstream's own that the switch must remove, and without schema defaults for ImagePullJob,
//! ImageListPullJob and NodeImage (upstream's CRDs of those have none: its webhooks set them);
//! they are written with field manager `helm`, the way upstream's chart installs them.
//! `runbook.rs` builds its upstream cluster from the same pieces.
//!
//! Upstream's kruise-manager itself is played by its leader Lease: `kruise-system/kruise-manager`,
//! held and renewed the way client-go's leader election does. Our manager runs with
//! `--leader-election-id=kruise-manager` as the runbook says, and must not run its controllers
//! until upstream's replica is gone and its Lease has expired.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceConversion, CustomResourceDefinition,
    ServiceReference, WebhookClientConfig, WebhookConversion,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kruise_rs::controllers::ControllerOptions;
use kruise_rs::manager::crds::{conversion_reset_patch, ensure_installed};
use kruise_rs::manager::{self, LeaderElection, ManagerError, ManagerOptions};
use kruise_rs_api::crd;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::{oneshot, watch};

use crate::sidecarset_upgrade::poll;
use crate::support::{ExtraControlPlane, client_for, create_ready_node, http_get};

pub(crate) const GROUP: &str = "apps.kruise.io";
pub(crate) const ALPHA: &str = "v1alpha1";
pub(crate) const BETA: &str = "v1beta1";
const VERSIONS: [&str; 2] = [ALPHA, BETA];
/// The namespace of the ImagePullJobs.
const JOBS: &str = "cutover-jobs";
/// The field manager standing in for upstream's installer.
pub(crate) const UPSTREAM_MANAGER: &str = "helm";
/// The printer column only upstream's CRDs have here.
const UPSTREAM_COLUMN: &str = "UPSTREAM-ONLY";
/// How long the apiserver may take to act on a CRD change, and the manager on an object.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    SidecarSet,
    ImagePullJob,
    NodeImage,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::SidecarSet, Kind::ImagePullJob, Kind::NodeImage];

    fn name(self) -> &'static str {
        match self {
            Kind::SidecarSet => "SidecarSet",
            Kind::ImagePullJob => "ImagePullJob",
            Kind::NodeImage => "NodeImage",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::SidecarSet => "sidecarsets",
            Kind::ImagePullJob => "imagepulljobs",
            Kind::NodeImage => "nodeimages",
        }
    }

    fn crd(self) -> String {
        format!("{}.{GROUP}", self.plural())
    }

    fn namespace(self) -> Option<&'static str> {
        (self == Kind::ImagePullJob).then_some(JOBS)
    }

    fn api(self, client: &Client, version: &str) -> Api<DynamicObject> {
        let resource = ApiResource {
            group: GROUP.to_owned(),
            version: version.to_owned(),
            api_version: format!("{GROUP}/{version}"),
            kind: self.name().to_owned(),
            plural: self.plural().to_owned(),
        };
        match self.namespace() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        }
    }
}

/// An object the test created, and in which version.
#[derive(Clone, Debug)]
struct Object {
    kind: Kind,
    name: String,
    created_as: &'static str,
}

impl Object {
    fn describe(&self) -> String {
        format!(
            "{} {} (created as {})",
            self.kind.name(),
            self.name,
            self.created_as
        )
    }
}

/// The upstream conversion webhook of SidecarSet, pointing at kruise-manager's Service.
fn upstream_webhook() -> CustomResourceConversion {
    CustomResourceConversion {
        strategy: "Webhook".to_owned(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: "kruise-system".to_owned(),
                    name: "kruise-webhook-service".to_owned(),
                    path: Some("/convert".to_owned()),
                    port: Some(443),
                }),
                ..WebhookClientConfig::default()
            }),
            conversion_review_versions: vec!["v1".to_owned(), "v1beta1".to_owned()],
        }),
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum Upstream {
    /// 1.8: `v1alpha1` only, stored.
    V1_8,
    /// 1.9: both served, `v1beta1` stored, SidecarSet through a conversion webhook.
    V1_9,
}

/// Upstream's CRDs at `release`, built from ours (the same schema, but no defaults where
/// upstream's have none).
pub(crate) fn upstream_crds(release: Upstream) -> Vec<CustomResourceDefinition> {
    crd::crds()
        .into_iter()
        .map(|mut crd| {
            crd.spec.conversion = None;
            if crd.spec.names.kind != "SidecarSet" {
                without_defaults(&mut crd);
            }
            if let Upstream::V1_8 = release {
                crd.spec.versions.retain(|v| v.name == ALPHA);
            }
            for version in &mut crd.spec.versions {
                version.storage = match release {
                    Upstream::V1_8 => true,
                    Upstream::V1_9 => version.name == BETA,
                };
                version
                    .additional_printer_columns
                    .get_or_insert_with(Vec::new)
                    .push(CustomResourceColumnDefinition {
                        name: UPSTREAM_COLUMN.to_owned(),
                        type_: "string".to_owned(),
                        json_path: ".metadata.uid".to_owned(),
                        ..CustomResourceColumnDefinition::default()
                    });
            }
            if let Upstream::V1_9 = release
                && crd.spec.names.kind == "SidecarSet"
            {
                crd.spec.conversion = Some(upstream_webhook());
            }
            crd
        })
        .collect()
}

/// Removes every `default` from `crd`'s schemas: upstream's ImagePullJob, ImageListPullJob and
/// NodeImage CRDs have none (its mutating webhooks default those kinds).
fn without_defaults(crd: &mut CustomResourceDefinition) {
    fn walk(value: &mut Value, properties: bool) {
        match value {
            Value::Object(map) => {
                if !properties {
                    map.remove("default");
                }
                for (key, child) in map.iter_mut() {
                    walk(child, !properties && key == "properties");
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, false)),
            _ => {}
        }
    }
    for version in &mut crd.spec.versions {
        if let Some(validation) = version.schema.as_mut() {
            let mut json = serde_json::to_value(&validation.open_api_v3_schema).expect("a schema");
            walk(&mut json, false);
            validation.open_api_v3_schema = serde_json::from_value(json).expect("still a schema");
        }
    }
}

/// Creates or replaces `crds` as upstream's installer would, and waits until each is
/// Established.
pub(crate) async fn put_crds(client: &Client, crds: Vec<CustomResourceDefinition>) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PostParams {
        field_manager: Some(UPSTREAM_MANAGER.to_owned()),
        ..PostParams::default()
    };
    for mut crd in crds {
        let name = crd.metadata.name.clone().expect("named");
        match api.get_opt(&name).await.expect("reading a CRD") {
            None => api.create(&params, &crd).await,
            Some(existing) => {
                crd.metadata.resource_version = existing.metadata.resource_version;
                api.replace(&name, &params, &crd).await
            }
        }
        .unwrap_or_else(|e| panic!("writing upstream's CRD {name}: {e}"));
        let api = &api;
        let name = &name;
        poll(
            &format!("upstream's CRD {name} to be Established"),
            TIMEOUT,
            || async move {
                let crd = api.get(name).await.map_err(|e| e.to_string())?;
                let status = crd.status.unwrap_or_default();
                let established = status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    Ok(())
                } else {
                    Err(format!("stored versions {:?}", status.stored_versions))
                }
            },
        )
        .await;
    }
}

pub(crate) async fn create_namespace(client: &Client, name: &str) {
    crate::harness::objects::create_namespace(client, name, &[])
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

/// Creates a Ready Node `name` labelled `zone: a`.
pub(crate) async fn create_node(client: &Client, name: &str) {
    let labels = BTreeMap::from([("zone".to_owned(), "a".to_owned())]);
    create_ready_node(client, name, labels).await;
}

/// The object as upstream's webhook would have stored it (defaulted).
fn manifest(kind: Kind, name: &str, version: &str) -> Value {
    let api_version = format!("{GROUP}/{version}");
    match kind {
        Kind::SidecarSet => {
            let mut spec = json!({
                "selector": {"matchLabels": {"app": name}},
                "updateStrategy": {"type": "RollingUpdate", "maxUnavailable": 1, "partition": 0},
                "injectionStrategy": {},
                "containers": [{
                    "name": "proxy",
                    "image": "127.0.0.1:5000/cutover/proxy:1",
                    "imagePullPolicy": "IfNotPresent",
                    "podInjectPolicy": "BeforeAppContainer",
                    "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
                    "shareVolumePolicy": {"type": "disabled"},
                    "shareVolumeDevicePolicy": {"type": "disabled"},
                }],
            });
            if version == ALPHA {
                // v1alpha1's own field; our one schema keeps it in both versions.
                spec["namespace"] = json!(JOBS);
            }
            json!({"apiVersion": api_version, "kind": "SidecarSet",
                   "metadata": {"name": name}, "spec": spec})
        }
        Kind::ImagePullJob => json!({
            "apiVersion": api_version,
            "kind": "ImagePullJob",
            "metadata": {"name": name, "namespace": JOBS},
            "spec": {
                "image": format!("127.0.0.1:5000/cutover/{name}:1"),
                // The job of the same name's node; jobs created as v1alpha1 at 1.9 use node-19.
                "selector": {"names": [job_node(name)]},
                "parallelism": 1,
                "completionPolicy": {"type": "Never"},
                "pullPolicy": {"backoffLimit": 3, "timeoutSeconds": 600},
                "imagePullPolicy": "IfNotPresent",
            },
        }),
        Kind::NodeImage => json!({
            "apiVersion": api_version,
            "kind": "NodeImage",
            "metadata": {"name": name, "labels": {"zone": "a"}},
            "spec": {},
        }),
    }
}

fn job_node(job: &str) -> &'static str {
    if job.contains("18") {
        "node-18"
    } else {
        "node-19"
    }
}

async fn create(client: &Client, kind: Kind, name: &str, version: &'static str) -> Object {
    let object: DynamicObject =
        serde_json::from_value(manifest(kind, name, version)).expect("an object");
    kind.api(client, version)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating {} {name} as {version}: {e}", kind.name()));
    Object {
        kind,
        name: name.to_owned(),
        created_as: version,
    }
}

/// Plays upstream's history (module documentation) and returns the objects created.
async fn upstream_history(client: &Client) -> Vec<Object> {
    for namespace in ["kruise-system", "kruise-daemon-config", JOBS] {
        create_namespace(client, namespace).await;
    }
    for node in ["node-18", "node-19"] {
        create_node(client, node).await;
    }
    put_crds(client, upstream_crds(Upstream::V1_8)).await;
    let mut objects = vec![
        create(client, Kind::SidecarSet, "ss-18", ALPHA).await,
        create(client, Kind::ImagePullJob, "job-18", ALPHA).await,
        create(client, Kind::NodeImage, "node-18", ALPHA).await,
    ];
    put_crds(client, upstream_crds(Upstream::V1_9)).await;
    objects.extend([
        create(client, Kind::SidecarSet, "ss-19", BETA).await,
        create(client, Kind::ImagePullJob, "job-19", BETA).await,
        // No conversion webhook for ImagePullJob and NodeImage upstream: v1alpha1 works.
        create(client, Kind::ImagePullJob, "job-19-alpha", ALPHA).await,
        create(client, Kind::NodeImage, "node-19", BETA).await,
    ]);
    objects
}

/// Upstream's conversion webhook is in the way: a v1alpha1 create and every read of the version
/// a SidecarSet is not stored in fail (once the apiserver's handler has the new CRD).
async fn assert_sidecarsets_need_the_dead_webhook(client: &Client) {
    let alpha = Kind::SidecarSet.api(client, ALPHA);
    let beta = Kind::SidecarSet.api(client, BETA);
    for (api, name, version) in [(&alpha, "ss-19", ALPHA), (&beta, "ss-18", BETA)] {
        poll(
            &format!("reading SidecarSet {name} as {version} to fail on the conversion webhook"),
            TIMEOUT,
            || async move {
                match api.get(name).await {
                    Err(e) if e.to_string().contains("conversion webhook") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await;
    }
    let object: DynamicObject =
        serde_json::from_value(manifest(Kind::SidecarSet, "ss-19-alpha", ALPHA)).expect("object");
    let refused = alpha
        .create(&PostParams::default(), &object)
        .await
        .expect_err("a v1alpha1 SidecarSet needs the conversion webhook");
    assert!(
        refused.to_string().contains("conversion webhook"),
        "{refused}"
    );
}

/// Every object reads by name, and takes a merge patch, in both versions.
async fn assert_every_object_reads_and_writes_in_both_versions(
    client: &Client,
    objects: &[Object],
) {
    for object in objects {
        for version in VERSIONS {
            let api = object.kind.api(client, version);
            let api = &api;
            let label = format!("cutover.kruise-rs.io/written-as-{version}");
            let patch = json!({"metadata": {"labels": {label.as_str(): "yes"}}});
            let patch = &patch;
            let got = poll(
                &format!("{} to read and write as {version}", object.describe()),
                TIMEOUT,
                || async move {
                    api.get(&object.name)
                        .await
                        .map_err(|e| format!("GET: {e}"))?;
                    api.patch(&object.name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .map_err(|e| format!("PATCH: {e}"))
                },
            )
            .await;
            assert_eq!(
                got.types.as_ref().map(|t| t.api_version.as_str()),
                Some(format!("{GROUP}/{version}").as_str())
            );
        }
        for version in VERSIONS {
            let got = object
                .kind
                .api(client, version)
                .get(&object.name)
                .await
                .unwrap_or_else(|e| panic!("{} as {version}: {e}", object.describe()));
            let labels = got.metadata.labels.unwrap_or_default();
            for written in VERSIONS {
                assert_eq!(
                    labels
                        .get(&format!("cutover.kruise-rs.io/written-as-{written}"))
                        .map(String::as_str),
                    Some("yes"),
                    "{} read as {version} lacks the label written as {written}: {labels:?}",
                    object.describe()
                );
            }
            if object.kind == Kind::SidecarSet && object.created_as == ALPHA {
                assert_eq!(got.data["spec"]["namespace"], json!(JOBS), "as {version}");
            }
        }
    }
}

/// Upstream's leader Lease (`--leader-election-id` default of kruise-manager) in its namespace.
pub(crate) const UPSTREAM_LEASE: &str = "kruise-manager";
pub(crate) const UPSTREAM_NAMESPACE: &str = "kruise-system";
/// client-go's identity: host name and a UUID.
pub(crate) const UPSTREAM_HOLDER: &str =
    "kruise-controller-manager-5d8c7b6f9d-x2x7q_3f1c2b1e-8f4a-4c1d-9a57-1b2c3d4e5f60";
/// Shorter than upstream's 15 s, to keep the test short; our replica honours what the Lease says.
pub(crate) const UPSTREAM_LEASE_SECONDS: i32 = 4;
pub(crate) const OUR_IDENTITY: &str = "kruise-rs-manager-0";

/// Plays upstream's leading kruise-manager replica: holds [`UPSTREAM_LEASE`] and renews it every
/// second, as client-go does (read, then update guarded by the resourceVersion), counting its
/// renewals; a renewal that finds another holder fails the test. Stopping it stops renewing
/// without releasing, as a deleted pod does (controller-runtime does not release by default).
pub(crate) struct UpstreamLeader {
    renewals: watch::Receiver<u32>,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl UpstreamLeader {
    pub(crate) async fn start(client: &Client) -> Self {
        let api: Api<Lease> = Api::namespaced(client.clone(), UPSTREAM_NAMESPACE);
        let now = MicroTime(Timestamp::now());
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": UPSTREAM_LEASE, "namespace": UPSTREAM_NAMESPACE},
            "spec": {
                "holderIdentity": UPSTREAM_HOLDER,
                "leaseDurationSeconds": UPSTREAM_LEASE_SECONDS,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }))
        .expect("a Lease");
        api.create(&PostParams::default(), &lease)
            .await
            .expect("upstream's Lease is created");
        let (count, renewals) = watch::channel(0u32);
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = &mut stopped => return Ok(()),
                    _ = tick.tick() => {}
                }
                let mut lease = api.get(UPSTREAM_LEASE).await.map_err(|e| e.to_string())?;
                let spec = lease.spec.get_or_insert_with(Default::default);
                if spec.holder_identity.as_deref() != Some(UPSTREAM_HOLDER) {
                    return Err(format!(
                        "upstream's Lease was taken while upstream renewed it: {spec:?}"
                    ));
                }
                spec.renew_time = Some(MicroTime(Timestamp::now()));
                api.replace(UPSTREAM_LEASE, &PostParams::default(), &lease)
                    .await
                    .map_err(|e| format!("renewing upstream's Lease: {e}"))?;
                count.send_modify(|n| *n += 1);
            }
        });
        UpstreamLeader {
            renewals,
            stop,
            task,
        }
    }

    /// Waits for `n` more renewals.
    pub(crate) async fn renewed(&mut self, n: u32) {
        let target = *self.renewals.borrow() + n;
        let renewals = &mut self.renewals;
        tokio::time::timeout(Duration::from_secs(u64::from(n) * 3 + 10), async move {
            renewals
                .wait_for(|count| *count >= target)
                .await
                .map(|_| ())
        })
        .await
        .expect("upstream's leader keeps renewing")
        .unwrap_or_else(|_| panic!("upstream's leader stopped renewing on its own"));
    }

    /// Stops renewing (the replica is gone); fails the test if a renewal had failed.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("join")
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

pub(crate) async fn lease_holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), UPSTREAM_NAMESPACE)
        .get(UPSTREAM_LEASE)
        .await
        .ok()
        .and_then(|l| l.spec?.holder_identity)
}

pub(crate) async fn leader_gauge(addr: std::net::SocketAddr) -> String {
    let (status, body) = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
        .await
        .expect("join")
        .expect("GET /metrics");
    assert_eq!(status, 200);
    body.lines()
        .find(|l| l.starts_with("kruise_rs_manager_leader "))
        .unwrap_or_else(|| panic!("no leader gauge in {body}"))
        .to_owned()
}

fn kruise_rs(args: &[&str], kubeconfig: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kruise-rs"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("kruise-rs runs")
}

/// Our manager as the runbook runs it during the switch: on upstream's Lease.
fn manager_options(kubeconfig: &Path) -> ManagerOptions {
    ManagerOptions {
        // Every object: upstream's objects carry no test label.
        controllers: ControllerOptions {
            nodeimage_creation_delay: Duration::ZERO,
            ..ControllerOptions::default()
        },
        leader_election: Some(LeaderElection {
            lease_name: UPSTREAM_LEASE.to_owned(),
            identity: OUR_IDENTITY.to_owned(),
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_secs(1),
            ..LeaderElection::new(UPSTREAM_NAMESPACE)
        }),
        ..crate::support::manager_options(kubeconfig)
    }
}

/// Our CRDs as they are on the server: conversion None, our printer columns only.
async fn assert_crds_are_ours(client: &Client) -> BTreeMap<String, Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut stored = BTreeMap::new();
    for ours in crd::crds() {
        let name = ours.metadata.name.clone().expect("named");
        let live = api.get(&name).await.expect("reading a CRD");
        let conversion = live.spec.conversion.clone().expect("conversion");
        assert_eq!(conversion.strategy, "None", "{name}");
        assert!(conversion.webhook.is_none(), "{name}: {conversion:?}");
        let columns = |crd: &CustomResourceDefinition| -> Vec<Vec<String>> {
            crd.spec
                .versions
                .iter()
                .map(|v| {
                    v.additional_printer_columns
                        .iter()
                        .flatten()
                        .map(|c| c.name.clone())
                        .collect()
                })
                .collect()
        };
        assert_eq!(
            columns(&live),
            columns(&ours),
            "{name}: upstream's column is gone"
        );
        let versions: Vec<(String, bool, bool)> = live
            .spec
            .versions
            .iter()
            .map(|v| (v.name.clone(), v.served, v.storage))
            .collect();
        assert_eq!(
            versions,
            [
                (ALPHA.to_owned(), true, false),
                (BETA.to_owned(), true, true)
            ],
            "{name}"
        );
        stored.insert(
            name,
            live.status
                .and_then(|s| s.stored_versions)
                .unwrap_or_default(),
        );
    }
    stored
}

#[tokio::test]
async fn switching_from_upstream_with_crds_install_keeps_every_object_in_both_versions() {
    let plane = tokio::task::spawn_blocking(ExtraControlPlane::start)
        .await
        .expect("join");
    let kubeconfig = plane.kubeconfig_path().to_owned();
    let client = client_for(plane.kubeconfig_path()).await;
    let objects = upstream_history(&client).await;
    let mut upstream = UpstreamLeader::start(&client).await;
    assert_sidecarsets_need_the_dead_webhook(&client).await;

    // The manager refuses to start, naming the command.
    let err = manager::run(manager_options(&kubeconfig), std::future::pending(), None)
        .await
        .expect_err("a conversion webhook we do not serve, no manager");
    let ManagerError::CrdsUnusable(problems) = &err else {
        panic!("{err:?}");
    };
    let converting: Vec<&str> = problems
        .conversion
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(converting, [Kind::SidecarSet.crd()]);
    assert!(problems.missing.is_empty() && problems.not_established.is_empty());
    assert!(problems.unserved.is_empty() && problems.unreadable_stored.is_empty());
    let message = err.to_string();
    assert!(message.contains("`kruise-rs crds --install`"), "{message}");

    // The switch.
    let path = kubeconfig.clone();
    let out = tokio::task::spawn_blocking(move || {
        kruise_rs(&["crds", "--install", "--timeout", "60s"], &path)
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "crds --install: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    // One line per CRD: the three kinds with objects here, then ImageListPullJob (none made).
    assert_eq!(lines.len(), 4, "{stdout}");
    assert_eq!(
        lines[3],
        "customresourcedefinition/imagelistpulljobs.apps.kruise.io: updated, Established; \
         no objects yet"
    );
    assert_eq!(
        lines[0],
        "customresourcedefinition/sidecarsets.apps.kruise.io: removed a conversion webhook \
         (service kruise-system/kruise-webhook-service:443 path /convert); updated, Established; \
         SidecarSet ss-18 reads as v1alpha1 and v1beta1"
    );
    for (line, kind) in lines.iter().zip(Kind::ALL).skip(1) {
        assert!(
            line.starts_with(&format!(
                "customresourcedefinition/{}: updated, Established; {} ",
                kind.crd(),
                kind.name()
            )) && line.ends_with(" reads as v1alpha1 and v1beta1"),
            "{line}"
        );
    }

    // Idempotent.
    let path = kubeconfig.clone();
    let again = tokio::task::spawn_blocking(move || kruise_rs(&["crds", "--install"], &path))
        .await
        .expect("join");
    let stdout = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    for (line, kind) in stdout.lines().zip(Kind::ALL) {
        assert!(
            line.starts_with(&format!(
                "customresourcedefinition/{}: unchanged, Established; ",
                kind.crd()
            )),
            "{line}"
        );
    }
    assert_eq!(stdout.lines().count(), 4, "{stdout}");

    let stored = assert_crds_are_ours(&client).await;
    for kind in Kind::ALL {
        assert_eq!(
            stored[&kind.crd()],
            [ALPHA, BETA],
            "{}: upstream's history is kept",
            kind.crd()
        );
    }
    assert_every_object_reads_and_writes_in_both_versions(&client, &objects).await;

    // The manager starts, and waits while upstream's replica leads: a Node it would give a
    // NodeImage at once gets none, and the Lease stays upstream's.
    create_node(&client, "node-new").await;
    let manager =
        crate::support::start_manager(manager_options(&kubeconfig), TIMEOUT, "beside upstream's")
            .await;
    let probe = manager.probe_addr;
    // Two lease durations and more of upstream renewing: our replica tries every second.
    upstream
        .renewed(2 * UPSTREAM_LEASE_SECONDS.unsigned_abs() + 1)
        .await;
    assert_eq!(leader_gauge(probe).await, "kruise_rs_manager_leader 0");
    assert_eq!(
        lease_holder(&client).await.as_deref(),
        Some(UPSTREAM_HOLDER)
    );
    let nodeimages = Kind::NodeImage.api(&client, BETA);
    assert!(
        nodeimages.get_opt("node-new").await.expect("GET").is_none(),
        "our controllers ran while upstream's replica led"
    );

    // Upstream's replica goes away (scaled to 0): its Lease expires, ours takes it.
    upstream.stop().await;
    let client_ref = &client;
    poll("our replica to take the Lease", TIMEOUT, || async move {
        match lease_holder(client_ref).await {
            Some(holder) if holder == OUR_IDENTITY => Ok(()),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await;
    assert_reconciled(&client, &objects).await;
    assert_eq!(leader_gauge(probe).await, "kruise_rs_manager_leader 1");

    manager.stop.send(()).expect("the manager still runs");
    let stopped = tokio::time::timeout(Duration::from_secs(15), manager.task)
        .await
        .expect("the manager stops")
        .expect("join");
    assert!(stopped.is_ok(), "{stopped:?}");
}

/// The manager's controllers act on every object upstream left: SidecarSet status, ImagePullJob
/// status and its NodeImage entry, NodeImage labels from the Node, and a NodeImage for the Node
/// `node-new` created while upstream led.
async fn assert_reconciled(client: &Client, objects: &[Object]) {
    for object in objects {
        let api = object.kind.api(client, ALPHA);
        let api = &api;
        match object.kind {
            Kind::SidecarSet => {
                poll(
                    &format!("the status of {}", object.describe()),
                    TIMEOUT,
                    || async move {
                        let set = api.get(&object.name).await.map_err(|e| e.to_string())?;
                        let generation = set.metadata.generation;
                        let status = &set.data["status"];
                        (status["observedGeneration"].as_i64() == generation
                            && status["latestRevision"].is_string())
                        .then_some(())
                        .ok_or_else(|| format!("generation {generation:?}, status {status}"))
                    },
                )
                .await;
            }
            Kind::ImagePullJob => {
                let nodeimages = Kind::NodeImage.api(client, BETA);
                let nodeimages = &nodeimages;
                poll(
                    &format!("{} to reach its node", object.describe()),
                    TIMEOUT,
                    || async move {
                        let job = api.get(&object.name).await.map_err(|e| e.to_string())?;
                        let status = &job.data["status"];
                        if status["desired"] != json!(1) {
                            return Err(format!("status {status}"));
                        }
                        let node = job.data["spec"]["selector"]["names"][0]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned();
                        let image = job.data["spec"]["image"].as_str().unwrap_or_default();
                        let repository = image.rsplit_once(':').map_or(image, |(r, _)| r);
                        let nodeimage = nodeimages.get(&node).await.map_err(|e| e.to_string())?;
                        nodeimage.data["spec"]["images"]
                            .get(repository)
                            .map(|_| ())
                            .ok_or_else(|| format!("NodeImage {node}: {}", nodeimage.data["spec"]))
                    },
                )
                .await;
            }
            Kind::NodeImage => {}
        }
    }

    // Labels follow the Node, on NodeImages upstream created in either version.
    let nodes = Api::<Node>::all(client.clone());
    for object in objects.iter().filter(|o| o.kind == Kind::NodeImage) {
        let relabel = json!({"metadata": {"labels": {"zone": "b"}}});
        nodes
            .patch(
                &object.name,
                &PatchParams::default(),
                &Patch::Merge(&relabel),
            )
            .await
            .unwrap_or_else(|e| panic!("relabelling Node {}: {e}", object.name));
        let api = Kind::NodeImage.api(client, ALPHA);
        let api = &api;
        poll(
            &format!("the labels of {} to follow its Node", object.describe()),
            TIMEOUT,
            || async move {
                let nodeimage = api.get(&object.name).await.map_err(|e| e.to_string())?;
                let labels = nodeimage.metadata.labels.unwrap_or_default();
                (labels.get("zone").map(String::as_str) == Some("b"))
                    .then_some(())
                    .ok_or_else(|| format!("{labels:?}"))
            },
        )
        .await;
    }

    let api = Kind::NodeImage.api(client, ALPHA);
    let api = &api;
    poll(
        "a NodeImage for the Node created meanwhile",
        TIMEOUT,
        || async move {
            api.get("node-new")
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

fn kubectl(plane: &ExtraControlPlane, args: &[&str]) -> Output {
    plane.kubectl().args(args).output().expect("kubectl runs")
}

fn kubectl_ok(plane: &ExtraControlPlane, args: &[&str]) -> String {
    let out = kubectl(plane, args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The same switch with kubectl only, as `deploy/README.md` spells it, and the optional
/// migration of stored versions after it.
#[tokio::test]
async fn switching_from_upstream_with_kubectl_only_and_migrating_stored_versions() {
    let plane = tokio::task::spawn_blocking(ExtraControlPlane::start)
        .await
        .expect("join");
    let client = client_for(plane.kubeconfig_path()).await;
    let objects = upstream_history(&client).await;
    assert_sidecarsets_need_the_dead_webhook(&client).await;
    let crds_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let crds_dir = crds_dir.to_str().expect("utf-8 path").to_owned();
    let apply = [
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        crds_dir.as_str(),
    ];

    let plane = &plane;
    // Applying ours over the webhook stanza is refused: it must be removed first.
    let refused = kubectl(plane, &apply);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "the apply went through");
    assert!(stderr.contains("spec.conversion"), "{stderr}");

    let patch = conversion_reset_patch().to_string();
    kubectl_ok(
        plane,
        &[
            "patch",
            "crd",
            &Kind::SidecarSet.crd(),
            "--type=merge",
            "-p",
            &patch,
        ],
    );
    kubectl_ok(plane, &apply);
    kubectl_ok(
        plane,
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd",
            "sidecarsets.apps.kruise.io",
            "imagepulljobs.apps.kruise.io",
            "nodeimages.apps.kruise.io",
            "imagelistpulljobs.apps.kruise.io",
        ],
    );
    assert_crds_are_ours(&client).await;
    assert_every_object_reads_and_writes_in_both_versions(&client, &objects).await;
    ensure_installed(&client)
        .await
        .expect("the start-up check passes");

    // Optional: rewrite every object in v1beta1, then forget v1alpha1 was ever stored.
    for kind in Kind::ALL {
        let resource = format!("{}.{BETA}.{GROUP}", kind.plural());
        let listed = kubectl_ok(plane, &["get", &resource, "-A", "-o", "json"]);
        let replaced = plane.kubectl_with_stdin(&["replace", "-f", "-"], &listed);
        assert!(
            replaced.status.success(),
            "kubectl replace {resource}: {}",
            String::from_utf8_lossy(&replaced.stderr)
        );
        kubectl_ok(
            plane,
            &[
                "patch",
                "crd",
                &kind.crd(),
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"storedVersions":["v1beta1"]}}"#,
            ],
        );
    }
    let stored = assert_crds_are_ours(&client).await;
    for kind in Kind::ALL {
        assert_eq!(stored[&kind.crd()], [BETA], "{}", kind.crd());
    }
    assert_every_object_reads_and_writes_in_both_versions(&client, &objects).await;
    ensure_installed(&client)
        .await
        .expect("the start-up check still passes");
}
