//! The CRDs against a real apiserver: they install, every shipped manifest applies with
//! `kubectl` and reads back through the typed API intact in both versions, and bad objects are
//! refused with the field named.

use std::path::PathBuf;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kruise_rs_api::{ImagePullJob, NodeImage, SidecarSet};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::Value;

use crate::harness::repo_path;
use crate::support::{self, TestCluster};

const KINDS: [(&str, &str); 4] = [
    ("SidecarSet", "sidecarsets"),
    ("ImagePullJob", "imagepulljobs"),
    ("NodeImage", "nodeimages"),
    ("ImageListPullJob", "imagelistpulljobs"),
];

/// One manifest file, parsed.
struct Manifest {
    path: PathBuf,
    object: Value,
}

impl Manifest {
    fn load(path: PathBuf) -> Self {
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let object: Value =
            serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Manifest { path, object }
    }
    fn kind(&self) -> &str {
        self.object["kind"].as_str().expect("kind")
    }
    fn version(&self) -> &str {
        self.object["apiVersion"]
            .as_str()
            .and_then(|v| v.split('/').nth(1))
            .expect("apiVersion")
    }
    fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().expect("name")
    }
    fn namespaced(&self) -> bool {
        self.kind() == "ImagePullJob"
    }
}

fn example_manifests() -> Vec<Manifest> {
    let mut paths: Vec<_> = std::fs::read_dir(repo_path("examples"))
        .expect("examples/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 4,
        "examples/ should hold the shipped manifests, found {paths:?}"
    );
    paths.into_iter().map(Manifest::load).collect()
}

fn seed_manifests() -> Vec<Manifest> {
    [
        "tests/fixtures/seed-003-imagepulljob.yaml",
        "tests/fixtures/seed-003-nodeimage.yaml",
    ]
    .into_iter()
    .map(|p| Manifest::load(repo_path(p)))
    .collect()
}

fn api_resource(kind: &str, version: &str) -> ApiResource {
    let plural = KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, p)| *p)
        .expect("known kind");
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apps.kruise.io", version, kind),
        plural,
    )
}

fn dynamic_api(client: &Client, kind: &str, version: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = api_resource(kind, version);
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// How strictly [`assert_contains`] compares.
#[derive(Clone, Copy, PartialEq)]
enum Omit {
    /// Every field must be there (what the apiserver stores).
    Nothing,
    /// A zero value (`false`, `0`, `""`, `[]`, `{}`) may be left out, as upstream's Go types
    /// (`omitempty`) and ours (`skip_serializing_if`) do; it reads back as the same value.
    ZeroValues,
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Null => true,
    }
}

/// Asserts every field of `expected` is in `actual` with the same value (the server may add
/// defaults and metadata, never drop or change what the manifest said).
fn assert_contains(expected: &Value, actual: &Value, path: &str, context: &str, omit: Omit) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, value) in e {
                let child = format!("{path}.{key}");
                match a.get(key) {
                    Some(got) => assert_contains(value, got, &child, context, omit),
                    None if omit == Omit::ZeroValues && is_zero(value) => {}
                    None => panic!("{context}: {child} was lost; got {actual}"),
                }
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            assert_eq!(
                e.len(),
                a.len(),
                "{context}: {path} has {} items, expected {}",
                a.len(),
                e.len()
            );
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                assert_contains(ev, av, &format!("{path}[{i}]"), context, omit);
            }
        }
        _ => assert_eq!(expected, actual, "{context}: {path} changed"),
    }
}

/// `kubectl apply` the manifest (into `ns` when namespaced) and return the server's object name.
fn kubectl_apply(cluster: &TestCluster, manifest: &Manifest, ns: &str) {
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "-f"]).arg(&manifest.path);
    if manifest.namespaced() {
        cmd.args(["-n", ns]);
    }
    let out = cmd.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl apply -f {} failed: {}",
        manifest.path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Reads the object back through the typed v1beta1 API and through both versions dynamically,
/// and checks that the manifest's metadata labels/annotations and its whole spec survived.
async fn assert_reads_back_intact(client: &Client, manifest: &Manifest, ns: &str) {
    let context = manifest.path.display().to_string();
    let name = manifest.name();
    let ns_opt = manifest.namespaced().then_some(ns);
    let expected_spec = &manifest.object["spec"];

    // Typed, storage version.
    let typed: Value = match manifest.kind() {
        "SidecarSet" => serde_json::to_value(
            Api::<SidecarSet>::all(client.clone())
                .get(name)
                .await
                .expect("get"),
        ),
        "ImagePullJob" => serde_json::to_value(
            Api::<ImagePullJob>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .expect("get"),
        ),
        "NodeImage" => serde_json::to_value(
            Api::<NodeImage>::all(client.clone())
                .get(name)
                .await
                .expect("get"),
        ),
        other => panic!("unexpected kind {other}"),
    }
    .expect("serializes");
    assert_contains(
        expected_spec,
        &typed["spec"],
        "spec",
        &format!("{context} (typed v1beta1)"),
        Omit::ZeroValues,
    );
    for part in ["labels", "annotations"] {
        if let Some(meta) = manifest.object["metadata"].get(part) {
            assert_contains(
                meta,
                &typed["metadata"][part],
                part,
                &context,
                Omit::Nothing,
            );
        }
    }

    // Both served versions, raw: the same spec whichever version is asked for.
    let mut specs = Vec::new();
    for version in ["v1alpha1", "v1beta1"] {
        let obj = dynamic_api(client, manifest.kind(), version, ns_opt)
            .get(name)
            .await
            .expect("get");
        let types = obj.types.as_ref().expect("typemeta");
        assert_eq!(types.api_version, format!("apps.kruise.io/{version}"));
        let raw = serde_json::to_value(&obj).expect("serializes");
        assert_contains(
            expected_spec,
            &raw["spec"],
            "spec",
            &format!("{context} ({version})"),
            Omit::Nothing,
        );
        specs.push(raw["spec"].clone());
    }
    assert_eq!(
        specs[0], specs[1],
        "{context}: v1alpha1 and v1beta1 disagree"
    );
}

/// The installed CRDs (Established is checked by the smoke tests) serve both versions.
#[tokio::test]
async fn installed_crds_serve_both_versions_and_store_v1beta1() {
    let cluster = support::cluster().await;
    let crds = Api::<CustomResourceDefinition>::all(cluster.client().await);
    for (_, plural) in KINDS {
        let crd = crds
            .get(&format!("{plural}.apps.kruise.io"))
            .await
            .expect("CRD installed");
        let versions: Vec<_> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(
            versions,
            [("v1alpha1", true, false), ("v1beta1", true, true)],
            "{plural}"
        );
        assert!(
            crd.spec.conversion.is_none_or(|c| c.strategy == "None"),
            "{plural}: conversion must be None"
        );
    }
}

#[tokio::test]
async fn examples_apply_with_kubectl_and_read_back_intact() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = cluster.namespace("examples").await;
    // The v1alpha1 SidecarSet example is scoped to this namespace; it need not exist, but make
    // the example realistic.
    let _ = cluster
        .kubectl()
        .args(["create", "namespace", "payments"])
        .output();
    for manifest in example_manifests() {
        kubectl_apply(cluster, &manifest, ns.name());
        assert_reads_back_intact(&client, &manifest, ns.name()).await;
    }
}

#[tokio::test]
async fn seed_manifests_apply_and_keep_sandbox_config_owners_and_pull_policy() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = cluster.namespace("seeds").await;
    for manifest in seed_manifests() {
        assert_eq!(
            manifest.version(),
            "v1alpha1",
            "the seed manifests are v1alpha1"
        );
        kubectl_apply(cluster, &manifest, ns.name());
        assert_reads_back_intact(&client, &manifest, ns.name()).await;
    }

    let job = Api::<ImagePullJob>::namespaced(client.clone(), ns.name())
        .get("job-with-always")
        .await
        .expect("job");
    let sandbox = job
        .spec
        .template
        .sandbox_config
        .as_ref()
        .expect("sandboxConfig kept");
    assert_eq!(
        sandbox.annotations["io.kubernetes.image.metrics.tags"],
        "app=foo"
    );
    // Upstream's webhook defaults, applied here by the schema.
    assert_eq!(
        job.spec.template.completion_policy.type_,
        Some(kruise_rs_api::imagepulljob::CompletionPolicyType::Always)
    );
    let pull = job
        .spec
        .template
        .pull_policy
        .as_ref()
        .expect("pullPolicy defaulted");
    assert_eq!(
        (pull.timeout_seconds, pull.backoff_limit),
        (Some(600), Some(3))
    );
    assert_eq!(
        job.spec.template.image_pull_policy,
        Some(kruise_rs_api::common::ImagePullPolicy::IfNotPresent)
    );

    let node = Api::<NodeImage>::all(client)
        .get("vm-0-10-ubuntu")
        .await
        .expect("nodeimage");
    let tag = &node.spec.images["nginx"].tags[0];
    assert_eq!(
        tag.owner_references[0].name.as_deref(),
        Some("job-with-always")
    );
    assert_eq!(
        tag.pull_policy
            .as_ref()
            .and_then(|p| p.ttl_seconds_after_finished),
        Some(2246)
    );
    assert_eq!(
        node.spec.images["nginx"]
            .sandbox_config
            .as_ref()
            .map(|s| s.labels["app"].as_str()),
        Some("foo")
    );
}

#[tokio::test]
async fn a_v1alpha1_sidecarset_keeps_its_meaning_when_read_as_v1beta1() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let name = support::unique_name("alpha");
    let manifest = serde_json::json!({
        "apiVersion": "apps.kruise.io/v1alpha1",
        "kind": "SidecarSet",
        "metadata": {"name": name, "labels": {"apps.kruise.io/sidecarset-custom-version": "v7"}},
        "spec": {
            "namespace": "team-a",
            "selector": {"matchLabels": {"app": "x"}},
            "containers": [{"name": "c", "image": "example.com/c:1"}]
        }
    });
    let alpha = dynamic_api(&client, "SidecarSet", "v1alpha1", None);
    let obj: DynamicObject = serde_json::from_value(manifest).expect("object");
    alpha
        .create(&Default::default(), &obj)
        .await
        .expect("v1alpha1 create");

    let set = Api::<SidecarSet>::all(client)
        .get(&name)
        .await
        .expect("typed v1beta1 get");
    assert_eq!(set.custom_version(), Some("v7"));
    let selector = set
        .spec
        .effective_namespace_selector()
        .expect("scoped to a namespace");
    assert_eq!(
        selector
            .match_labels
            .expect("labels")
            .get("kubernetes.io/metadata.name")
            .map(String::as_str),
        Some("team-a")
    );
}

/// Bad objects are refused by the apiserver with the offending field in the message.
#[tokio::test]
async fn objects_with_wrong_types_or_unknown_enum_values_are_rejected_naming_the_field() {
    let cluster = support::cluster().await;
    let ns = cluster.namespace("invalid").await;
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "ImagePullJob with a bad completion policy type",
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {name: bad-type}\nspec: {image: nginx, completionPolicy: {type: Sometimes}}",
            &["spec.completionPolicy.type", "Sometimes"],
        ),
        (
            "ImagePullJob with a string timeout",
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {name: bad-timeout}\nspec: {image: nginx, pullPolicy: {timeoutSeconds: ten}}",
            &["spec.pullPolicy.timeoutSeconds", "integer"],
        ),
        (
            "ImagePullJob with an unknown imagePullPolicy",
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {name: bad-policy}\nspec: {image: nginx, imagePullPolicy: Never}",
            &["spec.imagePullPolicy", "Never"],
        ),
        (
            "ImagePullJob without an image",
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {name: no-image}\nspec: {parallelism: 1}",
            &["spec.image", "Required"],
        ),
        (
            "SidecarSet with an unknown update strategy type",
            "apiVersion: apps.kruise.io/v1alpha1\nkind: SidecarSet\nmetadata: {name: bad-strategy}\nspec: {selector: {matchLabels: {a: b}}, updateStrategy: {type: Sometimes}}",
            &["spec.updateStrategy.type", "Sometimes"],
        ),
        (
            "SidecarSet container without a name and with a bad inject policy",
            "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {name: bad-container}\nspec: {containers: [{image: x, podInjectPolicy: Sideways}]}",
            &[
                "spec.containers[0].name",
                "spec.containers[0].podInjectPolicy",
                "Sideways",
            ],
        ),
        (
            "SidecarSet with a list where an int-or-string goes",
            "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {name: bad-partition}\nspec: {updateStrategy: {partition: [1]}}",
            &["spec.updateStrategy.partition"],
        ),
        // The bounds of decision 0019, in both API versions of each kind.
        (
            "v1alpha1 ImagePullJob with a negative backoffLimit",
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {name: negative-backoff}\nspec: {image: nginx, pullPolicy: {backoffLimit: -1}}",
            &["spec.pullPolicy.backoffLimit", "greater than or equal to 0"],
        ),
        (
            "v1beta1 ImagePullJob with a deadline past 365 days",
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {name: long-deadline}\nspec: {image: nginx, completionPolicy: {activeDeadlineSeconds: 9223372036854775807}}",
            &[
                "spec.completionPolicy.activeDeadlineSeconds",
                "less than or equal to 31536000",
            ],
        ),
        (
            "v1alpha1 ImageListPullJob with a zero timeout",
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImageListPullJob\nmetadata: {name: zero-timeout}\nspec: {images: [nginx], pullPolicy: {timeoutSeconds: 0}}",
            &[
                "spec.pullPolicy.timeoutSeconds",
                "greater than or equal to 1",
            ],
        ),
        (
            "v1beta1 ImageListPullJob with 1001 retries",
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImageListPullJob\nmetadata: {name: many-retries}\nspec: {images: [nginx], pullPolicy: {backoffLimit: 1001}}",
            &["spec.pullPolicy.backoffLimit", "less than or equal to 1000"],
        ),
        (
            "v1alpha1 NodeImage tag with a negative TTL",
            "apiVersion: apps.kruise.io/v1alpha1\nkind: NodeImage\nmetadata: {name: negative-ttl}\nspec: {images: {nginx: {tags: [{tag: v1, pullPolicy: {ttlSecondsAfterFinished: -1}}]}}}",
            &[
                "spec.images.nginx.tags[0].pullPolicy.ttlSecondsAfterFinished",
                "greater than or equal to 0",
            ],
        ),
        (
            "v1beta1 NodeImage tag with a deadline past 365 days",
            "apiVersion: apps.kruise.io/v1beta1\nkind: NodeImage\nmetadata: {name: long-tag-deadline}\nspec: {images: {nginx: {tags: [{tag: v1, pullPolicy: {activeDeadlineSeconds: 9223372036854775807}}]}}}",
            &[
                "spec.images.nginx.tags[0].pullPolicy.activeDeadlineSeconds",
                "less than or equal to 31536000",
            ],
        ),
        (
            "NodeImage with a negative version",
            "apiVersion: apps.kruise.io/v1beta1\nkind: NodeImage\nmetadata: {name: bad-version}\nspec: {images: {nginx: {tags: [{tag: v1, version: -1}]}}}",
            &[
                "spec.images.nginx.tags[0].version",
                "greater than or equal to 0",
            ],
        ),
        // Issue 42: pull Secrets are bounded (the webhook reviews each within its timeout).
        (
            "v1alpha1 ImagePullJob with 17 pull Secrets",
            "apiVersion: apps.kruise.io/v1alpha1\nkind: ImagePullJob\nmetadata: {name: many-secrets}\nspec: {image: nginx, pullSecrets: [s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15, s16]}",
            &["spec.pullSecrets", "must have at most 16 items"],
        ),
        (
            "v1beta1 ImageListPullJob with 17 pull Secrets",
            "apiVersion: apps.kruise.io/v1beta1\nkind: ImageListPullJob\nmetadata: {name: many-secrets}\nspec: {images: [nginx], pullSecrets: [s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15, s16]}",
            &["spec.pullSecrets", "must have at most 16 items"],
        ),
        (
            "v1beta1 SidecarSet with 17 image pull Secrets",
            "apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {name: many-secrets}\nspec: {selector: {matchLabels: {a: b}}, containers: [{name: c, image: x}], imagePullSecrets: [{name: s0}, {name: s1}, {name: s2}, {name: s3}, {name: s4}, {name: s5}, {name: s6}, {name: s7}, {name: s8}, {name: s9}, {name: s10}, {name: s11}, {name: s12}, {name: s13}, {name: s14}, {name: s15}, {name: s16}]}",
            &["spec.imagePullSecrets", "must have at most 16 items"],
        ),
    ];
    for (what, yaml, needles) in cases {
        let mut cmd = cluster.kubectl();
        cmd.args(["apply", "-n", ns.name(), "-f", "-"]);
        let out = support::run_with_stdin(cmd, yaml);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: was accepted");
        for needle in *needles {
            assert!(
                stderr.contains(needle),
                "{what}: message does not name {needle:?}: {stderr}"
            );
        }
    }
}

#[tokio::test]
async fn kubectl_get_shows_upstreams_columns() {
    let cluster = support::cluster().await;
    let ns = cluster.namespace("columns").await;
    // One object of each kind so kubectl prints a table for each.
    let manifests = [
        format!("apiVersion: apps.kruise.io/v1beta1\nkind: SidecarSet\nmetadata: {{name: {}}}\nspec: {{selector: {{matchLabels: {{a: b}}}}}}", support::unique_name("cols")),
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImagePullJob\nmetadata: {name: cols}\nspec: {image: nginx}".to_owned(),
        format!("apiVersion: apps.kruise.io/v1beta1\nkind: NodeImage\nmetadata: {{name: {}}}\nspec: {{}}", support::unique_name("cols")),
        "apiVersion: apps.kruise.io/v1beta1\nkind: ImageListPullJob\nmetadata: {name: cols}\nspec: {images: [nginx]}".to_owned(),
    ];
    for yaml in &manifests {
        let mut cmd = cluster.kubectl();
        cmd.args(["apply", "-n", ns.name(), "-f", "-"]);
        let out = support::run_with_stdin(cmd, yaml);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let expected = [
        (
            "sidecarsets",
            vec!["NAME", "MATCHED", "UPDATED", "READY", "AGE"],
        ),
        // Upstream's, plus PROGRESS (decision 0037).
        (
            "imagepulljobs",
            vec![
                "NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "PROGRESS", "AGE",
            ],
        ),
        (
            "imagepulljobs.v1alpha1.apps.kruise.io",
            vec![
                "NAME", "TOTAL", "ACTIVE", "SUCCEED", "FAILED", "PROGRESS", "AGE", "MESSAGE",
            ],
        ),
        (
            "nodeimages",
            vec!["NAME", "DESIRED", "PULLING", "SUCCEED", "FAILED", "AGE"],
        ),
        (
            "imagelistpulljobs",
            vec!["NAME", "TOTAL", "SUCCEEDED", "COMPLETED", "AGE"],
        ),
        (
            "imagelistpulljobs.v1alpha1.apps.kruise.io",
            vec!["NAME", "TOTAL", "SUCCEEDED", "COMPLETED", "AGE"],
        ),
    ];
    for (resource, columns) in expected {
        let out = cluster
            .kubectl()
            .args(["get", resource, "-n", ns.name()])
            .output()
            .expect("kubectl");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kubectl get {resource}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let header: Vec<_> = stdout
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(header, columns, "kubectl get {resource}");
    }
}

/// `kubectl apply -f crds/` (client side, which stores the whole object in an annotation capped
/// at 256 KiB) is accepted as well as server-side apply.
#[tokio::test]
async fn crds_apply_with_client_side_kubectl_apply() {
    let cluster = support::cluster().await;
    let out = cluster
        .kubectl()
        .args(["apply", "--dry-run=server", "-f"])
        .arg(repo_path("crds"))
        .output()
        .expect("kubectl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl apply -f crds/: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (_, plural) in KINDS {
        assert!(
            stdout.contains(&format!("{plural}.apps.kruise.io")),
            "{stdout}"
        );
    }
}
