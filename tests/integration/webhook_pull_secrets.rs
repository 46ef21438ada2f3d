//! Pull Secrets must be readable by whoever names them (decision 0009): the ImagePullJob and
//! SidecarSet webhooks ask the apiserver (SubjectAccessReview) whether the requesting user may
//! `get` each Secret. Requests are sent as user "alice-*" by impersonation (the kubeconfig's
//! admin may impersonate), with RBAC granted to her here; the RBAC authorizer learns of new
//! bindings a moment later, so every outcome that depends on a grant is polled for.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_api::well_known::PULL_SECRET_UIDS;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};

use crate::support::webhook::webhook_cluster;
use crate::support::{CONTROLLED_LABEL, unique_name, wait_for};

/// Longest wait for the RBAC authorizer to see a new binding.
const RBAC_TIMEOUT: Duration = Duration::from_secs(30);

/// A client acting as `user` (in no group but `system:authenticated`).
async fn impersonating(user: &str) -> Client {
    let kubeconfig =
        Kubeconfig::read_from(webhook_cluster().kubeconfig_path()).expect("kubeconfig");
    let mut config: Config =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("config");
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".to_owned()]);
    Client::try_from(config).expect("client")
}

/// Grants `user` the RBAC `rules`: a Role and RoleBinding in `namespace`, or a ClusterRole and
/// ClusterRoleBinding when None.
async fn grant(admin: &Client, namespace: Option<&str>, user: &str, rules: Value) {
    let name = unique_name("pull-secrets-test");
    let subjects = json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]);
    let pp = PostParams::default();
    match namespace {
        Some(ns) => {
            let role: Role = serde_json::from_value(json!({
                "metadata": {"name": &name, "namespace": ns}, "rules": rules
            }))
            .expect("a Role");
            let binding: RoleBinding = serde_json::from_value(json!({
                "metadata": {"name": &name, "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": &name},
                "subjects": subjects
            }))
            .expect("a RoleBinding");
            Api::<Role>::namespaced(admin.clone(), ns)
                .create(&pp, &role)
                .await
                .expect("Role created");
            Api::<RoleBinding>::namespaced(admin.clone(), ns)
                .create(&pp, &binding)
                .await
                .expect("RoleBinding created");
        }
        None => {
            let role: ClusterRole = serde_json::from_value(json!({
                "metadata": {"name": &name}, "rules": rules
            }))
            .expect("a ClusterRole");
            let binding: ClusterRoleBinding = serde_json::from_value(json!({
                "metadata": {"name": &name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": &name},
                "subjects": subjects
            }))
            .expect("a ClusterRoleBinding");
            Api::<ClusterRole>::all(admin.clone())
                .create(&pp, &role)
                .await
                .expect("ClusterRole created");
            Api::<ClusterRoleBinding>::all(admin.clone())
                .create(&pp, &binding)
                .await
                .expect("ClusterRoleBinding created");
        }
    }
}

async fn create_secret(admin: &Client, namespace: &str, name: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": "{\"auths\":{}}"}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret created");
}

/// How one create came out.
#[derive(Debug)]
enum Outcome {
    Admitted,
    /// Refused by the kruise-rs webhook, with its message.
    Denied(String),
    /// Refused by RBAC or anything else before the webhook decided (read in failure messages,
    /// through Debug).
    Other(#[allow(dead_code)] String),
}

fn outcome<T>(result: Result<T, kube::Error>) -> Outcome {
    match result {
        Ok(_) => Outcome::Admitted,
        Err(kube::Error::Api(status)) if status.message.contains("denied the request") => {
            Outcome::Denied(status.message)
        }
        Err(e) => Outcome::Other(e.to_string()),
    }
}

/// Creates (a fresh copy of) an object with `create` until `settled` accepts the outcome,
/// e.g. until RBAC lets the request reach the webhook; returns that outcome.
async fn create_until<F, Fut>(what: &str, create: F, settled: fn(&Outcome) -> bool) -> Outcome
where
    F: Fn() -> Fut,
    Fut: Future<Output = Outcome>,
{
    let create = &create;
    wait_for(what, RBAC_TIMEOUT, move || async move {
        let outcome = create().await;
        settled(&outcome).then_some(outcome)
    })
    .await
}

fn job(name: &str, secrets: &[&str]) -> ImagePullJob {
    serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
        "metadata": {"name": name},
        "spec": {"image": "busybox:1.36", "pullSecrets": secrets}
    }))
    .expect("a job")
}

fn reached_the_webhook(outcome: &Outcome) -> bool {
    !matches!(outcome, Outcome::Other(_))
}

fn admitted(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Admitted)
}

#[tokio::test]
async fn a_job_may_name_only_secrets_its_author_can_read() {
    let cluster = webhook_cluster();
    let admin = cluster.client().await;
    let ns = cluster.namespace("wh-pull-secrets").await;
    let user = unique_name("alice");
    create_secret(&admin, &ns, "regcred").await;
    create_secret(&admin, &ns, "other").await;
    grant(
        &admin,
        Some(&ns),
        &user,
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["imagepulljobs"], "verbs": ["create", "get"]}]),
    )
    .await;
    let alice = Api::<ImagePullJob>::namespaced(impersonating(&user).await, &ns);
    let create = |secrets: &'static [&'static str]| {
        let alice = alice.clone();
        async move {
            let job = job(&unique_name("pull"), secrets);
            outcome(alice.create(&PostParams::default(), &job).await)
        }
    };

    // (a) She may create jobs but not read the Secret: refused, naming the Secret and her.
    let refused = create_until(
        "alice's job to reach the webhook",
        || create(&["regcred"]),
        reached_the_webhook,
    )
    .await;
    let Outcome::Denied(message) = refused else {
        panic!("a job naming a Secret alice cannot read was not refused: {refused:?}");
    };
    assert!(
        message.contains(&format!(
            "spec.pullSecrets[0]: user \"{user}\" may not get Secret \"{ns}/regcred\""
        )),
        "{message}"
    );
    assert!(
        message.contains("a job may only name Secrets its author can read"),
        "{message}"
    );
    // A job without pull Secrets needs no review.
    assert!(
        matches!(create(&[]).await, Outcome::Admitted),
        "a job without pullSecrets is admitted"
    );

    // (b) Allowed to get exactly that Secret: admitted (once the grant is seen).
    grant(
        &admin,
        Some(&ns),
        &user,
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["regcred"], "verbs": ["get"]}]),
    )
    .await;
    let allowed = create_until(
        "alice's job naming regcred to be admitted",
        || create(&["regcred"]),
        admitted,
    )
    .await;
    assert!(matches!(allowed, Outcome::Admitted), "{allowed:?}");
    // Only that name: a job naming another Secret too is refused for that one alone.
    match create(&["regcred", "other"]).await {
        Outcome::Denied(message) => {
            assert!(
                message.contains(&format!(
                    "spec.pullSecrets[1]: user \"{user}\" may not get Secret \"{ns}/other\""
                )),
                "{message}"
            );
            assert!(!message.contains("pullSecrets[0]"), "{message}");
        }
        other => panic!("a job naming \"other\" was not refused: {other:?}"),
    }

    // The admin (system:masters) may read every Secret: admitted at once.
    let by_admin = Api::<ImagePullJob>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &job(&unique_name("admin"), &["other"]),
        )
        .await;
    assert!(by_admin.is_ok(), "{by_admin:?}");
}

/// An ImageListPullJob's pull Secrets go into the ImagePullJob of each image, which the manager
/// creates and whose Secrets it copies for the daemons: the list's author must be able to read
/// them, as a job's.
#[tokio::test]
async fn an_image_list_may_name_only_secrets_its_author_can_read() {
    use kruise_rs_api::imagelistpulljob::ImageListPullJob;
    let cluster = webhook_cluster();
    let admin = cluster.client().await;
    let ns = cluster.namespace("wh-list-secrets").await;
    let user = unique_name("alice");
    create_secret(&admin, &ns, "regcred").await;
    grant(
        &admin,
        Some(&ns),
        &user,
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["imagelistpulljobs"], "verbs": ["create", "get"]}]),
    )
    .await;
    let alice = Api::<ImageListPullJob>::namespaced(impersonating(&user).await, &ns);
    let create = || {
        let alice = alice.clone();
        async move {
            let list: ImageListPullJob = serde_json::from_value(json!({
                "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImageListPullJob",
                "metadata": {"name": unique_name("list")},
                "spec": {"images": ["busybox:1.36", "nginx:1.27"], "pullSecrets": ["regcred"]}
            }))
            .expect("a list");
            outcome(alice.create(&PostParams::default(), &list).await)
        }
    };
    let refused = create_until(
        "alice's list to reach the webhook",
        create,
        reached_the_webhook,
    )
    .await;
    let Outcome::Denied(message) = refused else {
        panic!("a list naming a Secret alice cannot read was not refused: {refused:?}");
    };
    assert!(
        message.contains(&format!(
            "spec.pullSecrets[0]: user \"{user}\" may not get Secret \"{ns}/regcred\""
        )),
        "{message}"
    );
    assert!(message.contains("ImageListPullJob"), "{message}");
    grant(
        &admin,
        Some(&ns),
        &user,
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["regcred"], "verbs": ["get"]}]),
    )
    .await;
    let allowed = create_until("alice's list to be admitted", create, admitted).await;
    assert!(matches!(allowed, Outcome::Admitted), "{allowed:?}");
}

fn v1alpha1_sidecarsets(client: &Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps.kruise.io", "v1alpha1", "SidecarSet"),
        "sidecarsets",
    );
    Api::all_with(client.clone(), &resource)
}

/// A SidecarSet naming Secret `regcred`, selecting pods of an app of its own (two sets with the
/// same container name and selector would conflict), labelled `run` for the cleanup.
fn sidecarset(run: &str, extra_spec: Value) -> Value {
    let mut spec = json!({
        "selector": {"matchLabels": {"app": unique_name("app")}},
        "containers": [{"name": "side", "image": "busybox:1.36"}],
        "imagePullSecrets": [{"name": "regcred"}]
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    json!({
        "apiVersion": "apps.kruise.io/v1alpha1", "kind": "SidecarSet",
        "metadata": {"name": unique_name("set"), "labels": {RUN_LABEL: run}},
        "spec": spec
    })
}

const RUN_LABEL: &str = "pull-secrets-test";

#[tokio::test]
async fn a_sidecarset_may_name_only_secrets_its_author_can_read_where_it_selects() {
    let cluster = webhook_cluster();
    let admin = cluster.client().await;
    let ns = cluster.namespace("wh-pull-secrets-set").await;
    let user = unique_name("alice");
    let run = unique_name("run");
    create_secret(&admin, &ns, "regcred").await;
    grant(
        &admin,
        None,
        &user,
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["sidecarsets"], "verbs": ["create", "get"]}]),
    )
    .await;
    // She may read regcred in `ns` only.
    grant(
        &admin,
        Some(&ns),
        &user,
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["regcred"], "verbs": ["get"]}]),
    )
    .await;
    let alice = v1alpha1_sidecarsets(&impersonating(&user).await);
    let create = |extra_spec: Value| {
        let alice = alice.clone();
        let run = run.clone();
        async move {
            let object: DynamicObject =
                serde_json::from_value(sidecarset(&run, extra_spec)).expect("a SidecarSet");
            outcome(alice.create(&PostParams::default(), &object).await)
        }
    };

    // (c) Every namespace (no spec.namespace, or a selector labels can satisfy later): refused.
    let refused = create_until(
        "alice's SidecarSet to reach the webhook",
        || create(json!({"namespaceSelector": {"matchLabels": {"team": "a"}}})),
        reached_the_webhook,
    )
    .await;
    let Outcome::Denied(message) = refused else {
        panic!(
            "a cluster-wide SidecarSet naming a Secret alice cannot read everywhere was not refused: {refused:?}"
        );
    };
    assert!(
        message.contains(&format!(
            "spec.imagePullSecrets[0]: user \"{user}\" may not get Secret \"regcred\" in every namespace"
        )),
        "{message}"
    );

    // Confined to `ns` (v1alpha1 spec.namespace), where she may read it: admitted.
    let confined = create_until(
        "alice's SidecarSet confined to her namespace to be admitted",
        || create(json!({"namespace": &ns})),
        admitted,
    )
    .await;
    assert!(matches!(confined, Outcome::Admitted), "{confined:?}");
    // The same through a namespaceSelector on the name label (which the apiserver sets).
    let by_name =
        create(json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": &ns}}}))
            .await;
    assert!(matches!(by_name, Outcome::Admitted), "{by_name:?}");
    // Another namespace: refused there.
    let elsewhere = cluster.namespace("wh-pull-secrets-other").await;
    match create(json!({"namespace": &elsewhere})).await {
        Outcome::Denied(message) => assert!(
            message.contains(&format!("may not get Secret \"{elsewhere}/regcred\"")),
            "{message}"
        ),
        other => panic!(
            "a SidecarSet in a namespace alice cannot read regcred in was admitted: {other:?}"
        ),
    }

    // The admitted SidecarSets select no pod; remove them anyway.
    let _ = Api::<SidecarSet>::all(admin.clone())
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{RUN_LABEL}={run}")),
        )
        .await;
}

/// Issue 42: `--webhook-namespace-selector` (the chart's `manager.webhook.namespaceSelector`)
/// scopes the pod webhook only. The test manager's selector requires a label this namespace
/// lacks, so its pods skip the pod webhook; ImagePullJobs and ImageListPullJobs naming a Secret
/// their author cannot read are refused there all the same.
#[tokio::test]
async fn jobs_outside_the_pod_webhooks_namespaces_are_still_checked() {
    use crate::support::webhook::WEBHOOK_NAMESPACE_LABEL;
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use kruise_rs_api::imagelistpulljob::ImageListPullJob;

    let cluster = webhook_cluster();
    let admin = cluster.client().await;
    // The pod webhook is confined to namespaces with the label...
    let pods_webhook = Api::<MutatingWebhookConfiguration>::all(admin.clone())
        .get("kruise-rs-mutating-webhook-configuration")
        .await
        .expect("the mutating configuration")
        .webhooks
        .into_iter()
        .flatten()
        .find(|w| w.name == "mutate-pods.kruise-rs.io")
        .expect("the pod webhook");
    let required = pods_webhook
        .namespace_selector
        .and_then(|s| s.match_labels)
        .unwrap_or_default();
    assert!(
        required.contains_key(WEBHOOK_NAMESPACE_LABEL),
        "the test manager's pod webhook should require {WEBHOOK_NAMESPACE_LABEL}: {required:?}"
    );
    // ...which this namespace does not carry.
    let ns = unique_name("wh-unselected");
    crate::harness::objects::create_namespace(&admin, &ns, &[])
        .await
        .expect("a namespace outside the pod webhook's selector");
    let user = unique_name("alice");
    create_secret(&admin, &ns, "regcred").await;
    grant(
        &admin,
        Some(&ns),
        &user,
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["imagepulljobs", "imagelistpulljobs"], "verbs": ["create", "get"]}]),
    )
    .await;
    let alice = impersonating(&user).await;
    let jobs = Api::<ImagePullJob>::namespaced(alice.clone(), &ns);
    let refused = create_until(
        "alice's job to reach the webhook",
        || {
            let jobs = jobs.clone();
            async move {
                let job = job(&unique_name("pull"), &["regcred"]);
                outcome(jobs.create(&PostParams::default(), &job).await)
            }
        },
        reached_the_webhook,
    )
    .await;
    let Outcome::Denied(message) = refused else {
        panic!(
            "a job naming a Secret alice cannot read, outside the pod webhook's namespaces, \
             was not refused: {refused:?}"
        );
    };
    assert!(
        message.contains(&format!(
            "spec.pullSecrets[0]: user \"{user}\" may not get Secret \"{ns}/regcred\""
        )),
        "{message}"
    );
    let lists = Api::<ImageListPullJob>::namespaced(alice, &ns);
    let list: ImageListPullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImageListPullJob",
        "metadata": {"name": unique_name("list")},
        "spec": {"images": ["busybox:1.36"], "pullSecrets": ["regcred"]}
    }))
    .expect("a list");
    match outcome(lists.create(&PostParams::default(), &list).await) {
        Outcome::Denied(message) => assert!(
            message.contains(&format!("may not get Secret \"{ns}/regcred\"")),
            "{message}"
        ),
        other => panic!("a list naming a Secret alice cannot read was not refused: {other:?}"),
    }
}

/// The measurement behind the pull-Secret bounds (decision 0026): how long SubjectAccessReviews
/// take on this control plane, one at a time and [`secret_access::MAX_REVIEWS`] at once as the
/// webhook sends them, and whole admissions at the bounds: an ImagePullJob naming
/// [`limits::MAX_PULL_SECRETS`] Secrets, a SidecarSet naming as many in namespaces pinned by
/// name up to `MAX_REVIEWS` reviews. Prints the numbers; each must stay inside the 10 s webhook
/// timeout (the SidecarSet's reviews inside the 5 s its dry-run pod leaves).
#[tokio::test]
async fn pull_secret_reviews_at_the_bounds_fit_the_webhook_timeout() {
    use k8s_openapi::api::authentication::v1::UserInfo;
    use kruise_rs::webhook::secret_access::{self, MAX_REVIEWS, SecretRead};
    use kruise_rs_api::limits::MAX_PULL_SECRETS;
    use std::time::Instant;

    let cluster = webhook_cluster();
    let admin = cluster.client().await;
    let user = unique_name("alice");
    let run = unique_name("run");
    let names: Vec<String> = (0..MAX_PULL_SECRETS).map(|i| format!("reg{i}")).collect();
    let spread = MAX_REVIEWS / MAX_PULL_SECRETS;
    let mut namespaces = Vec::new();
    for _ in 0..spread {
        let ns = cluster.namespace("wh-sar-bench").await;
        grant(
            &admin,
            Some(&ns),
            &user,
            json!([
                {"apiGroups": [""], "resources": ["secrets"], "resourceNames": &names, "verbs": ["get"]},
                {"apiGroups": ["apps.kruise.io"], "resources": ["imagepulljobs"], "verbs": ["create"]}
            ]),
        )
        .await;
        namespaces.push(ns);
    }
    grant(
        &admin,
        None,
        &user,
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["sidecarsets"], "verbs": ["create"]}]),
    )
    .await;
    let alice_info = UserInfo {
        username: Some(user.clone()),
        groups: Some(vec!["system:authenticated".to_owned()]),
        ..UserInfo::default()
    };
    let reads: Vec<SecretRead> = namespaces
        .iter()
        .flat_map(|ns| {
            names.iter().enumerate().map(move |(i, name)| SecretRead {
                field: format!("spec.imagePullSecrets[{i}]"),
                namespace: ns.clone(),
                name: name.clone(),
            })
        })
        .collect();
    assert_eq!(reads.len(), MAX_REVIEWS);
    // Once RBAC has seen every grant, every review is allowed.
    wait_for("RBAC to see alice's grants", RBAC_TIMEOUT, || async {
        let answers = secret_access::ask(&admin, &alice_info, &reads).await;
        answers
            .iter()
            .all(|a| *a == secret_access::Answer::Allowed)
            .then_some(())
    })
    .await;

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut one = Vec::new();
    for read in reads.iter().cycle().take(200) {
        let start = Instant::now();
        let answers = secret_access::ask(&admin, &alice_info, std::slice::from_ref(read)).await;
        one.push(start.elapsed());
        assert_eq!(answers, [secret_access::Answer::Allowed]);
    }
    one.sort();
    let mut batches = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let answers = secret_access::ask(&admin, &alice_info, &reads).await;
        batches.push(start.elapsed());
        assert_eq!(answers.len(), MAX_REVIEWS);
    }
    batches.sort();

    // Whole admissions at the bounds, as alice.
    let alice = impersonating(&user).await;
    let jobs = Api::<ImagePullJob>::namespaced(alice.clone(), &namespaces[0]);
    let secrets: Vec<&str> = names.iter().map(String::as_str).collect();
    let start = Instant::now();
    let created = jobs
        .create(
            &PostParams::default(),
            &job(&unique_name("bench"), &secrets),
        )
        .await;
    let job_took = start.elapsed();
    assert!(created.is_ok(), "{created:?}");
    let pinned = json!({"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": &namespaces
    }]}});
    let mut set = sidecarset(&run, pinned);
    set["spec"]["imagePullSecrets"] =
        json!(names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>());
    let set: DynamicObject = serde_json::from_value(set).expect("a SidecarSet");
    let start = Instant::now();
    let created = v1alpha1_sidecarsets(&alice)
        .create(&PostParams::default(), &set)
        .await;
    let set_took = start.elapsed();
    assert!(created.is_ok(), "{created:?}");

    println!(
        "one SubjectAccessReview (200, sequential): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         {MAX_REVIEWS} reviews {} at a time (20 runs): p50 {:.1} ms, max {:.1} ms; an \
         ImagePullJob naming {MAX_PULL_SECRETS} Secrets: {:.1} ms; a SidecarSet naming \
         {MAX_PULL_SECRETS} Secrets in {spread} namespaces ({MAX_REVIEWS} reviews): {:.1} ms",
        ms(one[100]),
        ms(one[197]),
        ms(one[199]),
        secret_access::CONCURRENT_REVIEWS,
        ms(batches[10]),
        ms(batches[19]),
        ms(job_took),
        ms(set_took),
    );
    assert!(batches[19] < Duration::from_secs(5), "{batches:?}");
    assert!(job_took < Duration::from_secs(10) && set_took < Duration::from_secs(10));
    let _ = Api::<SidecarSet>::all(admin.clone())
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{RUN_LABEL}={run}")),
        )
        .await;
}

/// Issue 42: a SidecarSet's pull Secrets are reviewed in every namespace it pins by name, which
/// no schema bounds: past `MAX_REVIEWS` reviews the webhook refuses it, naming the field and the
/// counts, rather than ask for longer than its timeout. (The admin may read every Secret: the
/// refusal is for the count alone.)
#[tokio::test]
async fn a_sidecarset_pinning_too_many_namespaces_for_its_secrets_is_refused() {
    use kruise_rs::webhook::secret_access::MAX_REVIEWS;
    use kruise_rs_api::limits::MAX_PULL_SECRETS;

    let admin = webhook_cluster().client().await;
    let run = unique_name("run");
    let namespaces: Vec<String> = (0..=MAX_REVIEWS / MAX_PULL_SECRETS)
        .map(|i| format!("pinned-{i}"))
        .collect();
    let secrets: Vec<Value> = (0..MAX_PULL_SECRETS)
        .map(|i| json!({"name": format!("reg{i}")}))
        .collect();
    let mut object = sidecarset(
        &run,
        json!({"namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": &namespaces
        }]}}),
    );
    object["spec"]["imagePullSecrets"] = json!(secrets);
    let object: DynamicObject = serde_json::from_value(object).expect("a SidecarSet");
    let reviews = namespaces.len() * MAX_PULL_SECRETS;
    match outcome(
        v1alpha1_sidecarsets(&admin)
            .create(&PostParams::default(), &object)
            .await,
    ) {
        Outcome::Denied(message) => assert!(
            message.contains(&format!(
                "spec.imagePullSecrets: checking that the author may read {MAX_PULL_SECRETS} \
                 Secret(s) in {} namespace(s) takes {reviews} access reviews, more than the \
                 {MAX_REVIEWS}",
                namespaces.len()
            )),
            "{message}"
        ),
        other => panic!("{reviews} access reviews were not refused: {other:?}"),
    }
}

/// A registry Secret `name` whose credential is `data`; returns its uid.
async fn create_secret_holding(admin: &Client, namespace: &str, name: &str, data: &str) -> String {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": data}
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("Secret created")
        .metadata
        .uid
        .expect("a uid")
}

/// The credential a Secret holds, as text.
fn credential(secret: &Secret) -> Option<String> {
    let data = secret.data.as_ref()?.get(".dockerconfigjson")?;
    Some(String::from_utf8_lossy(&data.0).into_owned())
}

/// The job's pin annotation.
async fn pins_of(jobs: &Api<ImagePullJob>, name: &str) -> Option<String> {
    jobs.get(name)
        .await
        .ok()?
        .metadata
        .annotations?
        .remove(PULL_SECRET_UIDS)
}

/// A Secret deleted and created again under the same name is another Secret: a running job
/// keeps its author's check for the one it was checked against only (decision 0029). The copy
/// for the daemons is withdrawn, not refreshed with the replacement's data; the job says why;
/// removing the job's uid pin is a new check, refused to someone who may not read the Secret,
/// and once passed the job copies the replacement.
#[tokio::test]
async fn a_recreated_pull_secret_is_not_copied_on_the_old_check() {
    let cluster = webhook_cluster();
    let admin = cluster.client().await;
    let ns = cluster.namespace("wh-secret-uid").await;
    let daemon_ns = crate::support::test_controller_options().daemon_config_namespace;
    let copies = Api::<Secret>::namespaced(admin.clone(), &daemon_ns);
    let copy = kruise_rs_imagepull::imagepulljob::secrets::copy_name(&ns, "reg");
    let jobs = Api::<ImagePullJob>::namespaced(admin.clone(), &ns);
    let first = create_secret_holding(&admin, &ns, "reg", "{\"auths\":{\"first\":{}}}").await;
    let name = "long-lived";
    let mut pull: ImagePullJob = serde_json::from_value(json!({
        "apiVersion": "apps.kruise.io/v1beta1", "kind": "ImagePullJob",
        "metadata": {"name": name, "labels": {CONTROLLED_LABEL: "secret-uid"}},
        "spec": {"image": "127.0.0.1:5000/private/app:1", "pullSecrets": ["reg"],
                 "selector": {"names": [unique_name("no-such-node")]},
                 "completionPolicy": {"type": "Never"}}
    }))
    .expect("a job");
    pull = jobs
        .create(&PostParams::default(), &pull)
        .await
        .expect("the admin's job is admitted");
    let copied = wait_for("the first Secret's copy", RBAC_TIMEOUT, || async {
        copies.get_opt(&copy).await.ok().flatten()
    })
    .await;
    assert_eq!(
        credential(&copied).as_deref(),
        Some("{\"auths\":{\"first\":{}}}")
    );
    assert_eq!(
        pins_of(&jobs, name).await,
        Some(format!("reg={first}")),
        "the job pins the Secret it copied"
    );

    // The Secret is deleted and another made under its name, with other credentials.
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .delete("reg", &DeleteParams::default())
        .await
        .expect("delete the Secret");
    let second = create_secret_holding(&admin, &ns, "reg", "{\"auths\":{\"second\":{}}}").await;
    // Nothing watches Secrets: a change of the job makes it look again, as any later
    // reconcile (a node's report, a requeue) would.
    let poke = json!({"metadata": {"labels": {"poked": "1"}}});
    jobs.patch(name, &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .expect("poke the job");
    let message = wait_for(
        "the job to have looked at the new Secret",
        RBAC_TIMEOUT,
        || async {
            let job = jobs.get(name).await.ok()?;
            let taken = copies
                .get_opt(&copy)
                .await
                .ok()?
                .is_some_and(|c| credential(&c).is_some_and(|c| c.contains("second")));
            let message = job.status.and_then(|s| s.message).unwrap_or_default();
            (taken || message.contains(&second)).then_some(message)
        },
    )
    .await;
    let now = copies.get_opt(&copy).await.expect("read the copy");
    assert!(
        now.as_ref()
            .and_then(credential)
            .is_none_or(|c| !c.contains("second")),
        "the copy took the replacement's data on the old check: {now:?}"
    );
    assert!(
        now.is_none(),
        "the first Secret's copy is withdrawn: {now:?}"
    );
    for words in [&format!("{ns}/reg"), &first, &second, PULL_SECRET_UIDS] {
        let words: &str = words;
        assert!(message.contains(words), "{words:?} not in {message}");
    }
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(admin.clone(), &ns);
    let event =
        crate::support::wait_for_event(&events, "PullSecretReplaced", name, RBAC_TIMEOUT).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    // Re-arming is a new check: someone who may edit jobs but not read the Secret is refused.
    let mallory = unique_name("mallory");
    grant(
        &admin,
        Some(&ns),
        &mallory,
        json!([{"apiGroups": ["apps.kruise.io"], "resources": ["imagepulljobs"], "verbs": ["get", "patch"]}]),
    )
    .await;
    let unpin = json!({"metadata": {"annotations": {PULL_SECRET_UIDS: null}}});
    let as_mallory = Api::<ImagePullJob>::namespaced(impersonating(&mallory).await, &ns);
    let refused = wait_for(
        "mallory's edit to reach the webhook",
        RBAC_TIMEOUT,
        || async {
            let result = as_mallory
                .patch(name, &PatchParams::default(), &Patch::Merge(&unpin))
                .await;
            let outcome = outcome(result);
            reached_the_webhook(&outcome).then_some(outcome)
        },
    )
    .await;
    let Outcome::Denied(message) = refused else {
        panic!(
            "removing the pin was not refused to a user who cannot read the Secret: {refused:?}"
        );
    };
    assert!(
        message.contains(&format!(
            "user \"{mallory}\" may not get Secret \"{ns}/reg\""
        )),
        "{message}"
    );
    assert_eq!(pins_of(&jobs, name).await, Some(format!("reg={first}")));

    // Someone who may read it (here the admin) removes the pin: the job copies the new Secret.
    jobs.patch(name, &PatchParams::default(), &Patch::Merge(&unpin))
        .await
        .expect("the admin re-arms the job");
    let copied = wait_for("the new Secret's copy", RBAC_TIMEOUT, || async {
        copies.get_opt(&copy).await.ok().flatten()
    })
    .await;
    assert_eq!(
        credential(&copied).as_deref(),
        Some("{\"auths\":{\"second\":{}}}")
    );
    assert_eq!(pins_of(&jobs, name).await, Some(format!("reg={second}")));
    assert_eq!(
        copied.metadata.annotations.unwrap_or_default()["kruise-rs.io/source-uid"],
        second
    );
    drop(pull);
    jobs.delete(name, &DeleteParams::default())
        .await
        .expect("clean up");
}
