//! The installed system's own life on a real cluster: leader failover while a rollout runs,
//! `helm upgrade` to a new image tag under pod admissions, `helm uninstall` (leaving no webhook
//! and no job that cannot be deleted).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kruise_rs_api::{ImagePullJob, SidecarSet};
use kruise_rs_imagepull::imagepulljob::secrets;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::sidecarset::{
    create_sidecarset, deployment, running_pods, set_sidecar_image, sidecarset,
};
use crate::support::{
    self, Cluster, FIRST_TAG, LEASE_DURATION, RELEASE, SECOND_TAG, SYSTEM_NAMESPACE, TIMEOUT,
    lease_holder, wait_for,
};

/// Deleting the leading manager pod mid-rollout: the other replica holds the Lease within the
/// lease duration and finishes the rollout the first one started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_other_replica_takes_over_and_finishes_the_rollout() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    let ns = cluster.namespace("e2e-failover", json!({})).await;
    let name = support::unique_name("failover");
    let (v1, v2) = (cluster.app_image("v1"), cluster.app_image("v2"));
    create_sidecarset(cluster, &sidecarset(&name, &ns.name, &v1, 1), &ns.name).await;
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), &ns.name);
    deployments
        .create(&PostParams::default(), &deployment(&name, &v1, 2))
        .await
        .expect("creating the Deployment");
    running_pods(cluster, &ns.name, &name, 2).await;

    let client = cluster.client();
    let first = wait_for("a leader", TIMEOUT, || lease_holder(&client)).await;
    let sidecarsets: Api<SidecarSet> = Api::all(cluster.client());
    set_sidecar_image(cluster, &name, &v2).await;
    // The rollout has started once the leader wrote the new revision's status.
    wait_for("the leader to start the rollout", TIMEOUT, || async {
        let s = sidecarsets.get(&name).await.ok()?;
        (s.status?.observed_generation == s.metadata.generation).then_some(())
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(cluster.client(), SYSTEM_NAMESPACE);
    let deleted = Instant::now();
    pods.delete(&first, &DeleteParams::default())
        .await
        .expect("deleting the leader pod");
    let second = wait_for(
        "another replica to lead",
        LEASE_DURATION + Duration::from_secs(5),
        || async {
            lease_holder(&client)
                .await
                .filter(|holder| *holder != first)
        },
    )
    .await;
    let takeover = deleted.elapsed();
    println!(
        "leader {first} deleted; {second} leads after {takeover:.1?} (lease duration {LEASE_DURATION:?})"
    );

    wait_for("the new leader to finish the rollout", TIMEOUT, || async {
        let s = sidecarsets.get(&name).await.ok()?;
        let status = s.status?;
        (status.observed_generation == s.metadata.generation
            && status.updated_pods == 2
            && status.updated_ready_pods == 2)
            .then_some(())
    })
    .await;
    // Both replicas ready again (the Deployment replaced the deleted one) for the next test.
    cluster.wait_ready(FIRST_TAG).await;
}

/// `helm upgrade` to a new image tag rolls the manager and the daemon while pods keep being
/// admitted (failurePolicy Fail: any moment without a serving webhook would refuse them), and
/// `helm uninstall` leaves nothing that blocks pod creation. The system is installed again
/// afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_keeps_admitting_and_uninstall_leaves_no_webhooks() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    let ns = cluster.namespace("e2e-helm", json!({})).await;
    let name = support::unique_name("helm");
    create_sidecarset(
        cluster,
        &sidecarset(&name, &ns.name, &cluster.app_image("v1"), 1),
        &ns.name,
    )
    .await;

    // Admissions all through the upgrade: dry-run creates go through the webhooks like real ones.
    let stop = Arc::new(AtomicBool::new(false));
    let creator = {
        let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
        let stop = stop.clone();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"generateName": "admitted-", "labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": cluster.app_image("v1")}]}
        }))
        .expect("a pod");
        tokio::spawn(async move {
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let (mut admitted, mut failures) = (0usize, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match pods.create(&dry_run, &pod).await {
                    Ok(p)
                        if p.spec
                            .as_ref()
                            .is_some_and(|s| s.containers.iter().any(|c| c.name == "sidecar")) =>
                    {
                        admitted += 1
                    }
                    Ok(_) => failures.push("admitted without its sidecar".to_owned()),
                    Err(e) => failures.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (admitted, failures)
        })
    };
    let chart = support::chart_dir();
    let started = Instant::now();
    cluster.helm(&[
        "upgrade",
        RELEASE,
        chart.to_str().expect("UTF-8 path"),
        "--set",
        &format!(
            "image.repository={}/{}",
            cluster.registry,
            support::PRODUCT_REPOSITORY
        ),
        "--set",
        &format!("image.tag={SECOND_TAG}"),
    ]);
    cluster.wait_ready(SECOND_TAG).await;
    stop.store(true, Ordering::Relaxed);
    let (admitted, failures) = creator.await.expect("the pod creator");
    println!(
        "helm upgrade rolled both workloads in {:.1?}; {admitted} pods admitted meanwhile, {} refused",
        started.elapsed(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "admissions failed during the upgrade: {failures:?}"
    );
    assert!(
        admitted >= 10,
        "only {admitted} admissions during the upgrade"
    );

    cluster.helm(&["uninstall", RELEASE, "--wait", "--timeout", "3m"]);
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(cluster.client());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client());
    let left: Vec<String> = mutating
        .list(&ListParams::default())
        .await
        .expect("listing mutating configurations")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .chain(
            validating
                .list(&ListParams::default())
                .await
                .expect("listing validating configurations")
                .items
                .into_iter()
                .filter_map(|c| c.metadata.name),
        )
        .filter(|n| n.starts_with("kruise-rs"))
        .collect();
    assert!(
        left.is_empty(),
        "webhook configurations left after uninstall: {left:?}"
    );
    // A pod the webhook would have mutated is created, unchanged.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), &ns.name);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "after-uninstall", "labels": {"app": name}},
        "spec": {"containers": [{"name": "app", "image": cluster.app_image("v1")}]}
    }))
    .expect("a pod");
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating a pod after uninstall");
    assert_eq!(
        created.spec.unwrap().containers.len(),
        1,
        "no sidecar without kruise-rs"
    );

    // Install again for whatever runs next; the chart's namespaces must be gone first.
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    wait_for("the chart's namespaces to be deleted", TIMEOUT, || async {
        let gone = namespaces.get_opt(SYSTEM_NAMESPACE).await.ok()?.is_none()
            && namespaces
                .get_opt("kruise-daemon-config")
                .await
                .ok()?
                .is_none();
        gone.then_some(())
    })
    .await;
    cluster.install(FIRST_TAG).await;
}

/// How long deleting a job or a namespace may take once kruise-rs is gone: nothing is left that
/// should hold them, so the apiserver's own garbage collection is all that runs.
const REMOVAL_DEADLINE: Duration = Duration::from_secs(60);

/// A paused ImagePullJob (parallelism 0: it pulls nothing and stays running) that needs the
/// registry Secret `reg` of its namespace, so the manager copies it for the daemons.
fn paused_job_with_a_pull_secret(name: &str, node: &str) -> ImagePullJob {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1",
        "kind": "ImagePullJob",
        "metadata": {"name": name},
        "spec": {
            "image": "127.0.0.1:5000/e2e/never-pulled:1",
            "selector": {"names": [node]},
            "parallelism": 0,
            "pullSecrets": ["reg"],
            "completionPolicy": {"type": "Never"}
        }
    }))
    .expect("an ImagePullJob")
}

/// A namespace holding the registry Secret `reg` and a paused job `name` using it; returns once
/// the manager has copied `reg` for the daemons on the job's behalf.
async fn job_with_a_copied_secret(cluster: &Cluster, prefix: &str, name: &str) -> String {
    let ns = cluster.namespace(prefix, json!({})).await.name;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "reg"},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": r#"{"auths":{}}"#}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(cluster.client(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the registry Secret");
    Api::<ImagePullJob>::namespaced(cluster.client(), &ns)
        .create(
            &PostParams::default(),
            &paused_job_with_a_pull_secret(name, &cluster.node_name),
        )
        .await
        .expect("creating the ImagePullJob");
    let copies: Api<Secret> = Api::namespaced(cluster.client(), "kruise-daemon-config");
    let copy = secrets::copy_name(&ns, "reg");
    let reference = format!("{ns}/{name}");
    wait_for(
        "the manager to copy the job's pull secret",
        TIMEOUT,
        || async {
            let copy = copies.get_opt(&copy).await.ok()??;
            secrets::references(&copy)
                .contains(&reference)
                .then_some(())
        },
    )
    .await;
    ns
}

/// `helm uninstall` with ImagePullJobs holding pull-secret copies, then deleting one job and the
/// namespace of another: both finish within a deadline, with no manager left to release anything
/// (issue 42: a finalizer only the manager removed kept them forever). The system is installed
/// again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_helm_uninstall_jobs_with_pull_secrets_and_their_namespaces_delete() {
    let exclusive = support::exclusive().await;
    let cluster = exclusive.cluster;
    let kept_ns = job_with_a_copied_secret(cluster, "e2e-uninstall-job", "pull").await;
    let deleted_ns = job_with_a_copied_secret(cluster, "e2e-uninstall-ns", "pull").await;

    cluster.helm(&["uninstall", RELEASE, "--wait", "--timeout", "3m"]);

    let jobs: Api<ImagePullJob> = Api::namespaced(cluster.client(), &kept_ns);
    jobs.delete("pull", &DeleteParams::default())
        .await
        .expect("deleting the job");
    let namespaces: Api<Namespace> = Api::all(cluster.client());
    namespaces
        .delete(&deleted_ns, &DeleteParams::default())
        .await
        .expect("deleting the namespace");
    wait_for("the job to be deleted", REMOVAL_DEADLINE, || async {
        jobs.get_opt("pull").await.ok()?.is_none().then_some(())
    })
    .await;
    wait_for(
        "the namespace holding a job to be deleted",
        REMOVAL_DEADLINE,
        || async {
            namespaces
                .get_opt(&deleted_ns)
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;

    // Install again for whatever runs next; the chart's namespaces must be gone first.
    wait_for("the chart's namespaces to be deleted", TIMEOUT, || async {
        let gone = namespaces.get_opt(SYSTEM_NAMESPACE).await.ok()?.is_none()
            && namespaces
                .get_opt("kruise-daemon-config")
                .await
                .ok()?
                .is_none();
        gone.then_some(())
    })
    .await;
    cluster.install(FIRST_TAG).await;
}
