//! The Helm chart `deploy/chart/kruise-rs/`: `helm lint` passes, `helm template` with the
//! default values renders exactly the objects of `deploy/manifests/`, and rendering them again
//! with `deploy/render-manifests.sh` (`make manifests`) gives the committed files byte for byte
//! (so the plain manifests cannot drift from the chart), the chart's `crds/` are byte-for-byte
//! copies of `crds/`, and the documented values reach the objects they are meant for.
//!
//! helm is built from its Go module by `tests/deploy/build-helm.sh` (run by `tests/setup.sh`,
//! hence by `make test`), cached under `~/.cache/kruise-rs/bin/helm-<version>/`. No cluster.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

const RELEASE: &str = "kruise-rs";
const NAMESPACE: &str = "kruise-system";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn chart_dir() -> PathBuf {
    root().join("deploy/chart/kruise-rs")
}

/// The helm binary `tests/deploy/build-helm.sh` built; fails (never skips) when it is missing.
fn helm_binary() -> PathBuf {
    let script = root().join("tests/deploy/build-helm.sh");
    let out = Command::new(&script)
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "helm is not built: run `tests/deploy/build-helm.sh` (or `tests/setup.sh`, which `make \
         test` runs) to build it from helm.sh/helm/v3 into ~/.cache/kruise-rs/bin/\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Runs helm with `args` in a throwaway HOME-like environment.
fn helm_output(args: &[&str]) -> std::process::Output {
    let homes = tempfile::tempdir().expect("temporary directory");
    Command::new(helm_binary())
        .args(args)
        .env("HELM_CACHE_HOME", homes.path().join("cache"))
        .env("HELM_CONFIG_HOME", homes.path().join("config"))
        .env("HELM_DATA_HOME", homes.path().join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .unwrap_or_else(|e| panic!("helm {}: cannot run: {e}", args.join(" ")))
}

/// Runs helm with `args`; returns stdout or panics with the command and its output.
fn helm(args: &[&str]) -> String {
    let shown = format!("helm {}", args.join(" "));
    let out = helm_output(args);
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("helm prints UTF-8")
}

/// `helm template` of the chart, with `extra` arguments (`--set ...`), CRDs included.
fn render(extra: &[&str]) -> String {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().expect("UTF-8 path"),
        "--namespace",
        NAMESPACE,
        "--include-crds",
    ];
    args.extend_from_slice(extra);
    helm(&args)
}

/// The non-empty YAML documents of `text`, `origin` naming it in errors.
fn documents(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|document| {
            Value::deserialize(document).unwrap_or_else(|e| panic!("{origin}: not YAML: {e}"))
        })
        .filter(|value| !value.is_null())
        .collect()
}

/// `kind namespace/name` (or `kind name` for cluster-scoped objects).
fn key(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("<no kind>");
    let name = object["metadata"]["name"].as_str().unwrap_or("<no name>");
    match object["metadata"]["namespace"].as_str() {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Objects by key; a key seen twice is an error.
fn by_key(objects: Vec<Value>, origin: &str) -> BTreeMap<String, Value> {
    let mut map = BTreeMap::new();
    for object in objects {
        let k = key(&object);
        assert!(
            map.insert(k.clone(), object).is_none(),
            "{origin}: {k} appears twice"
        );
    }
    map
}

fn manifest_objects() -> BTreeMap<String, Value> {
    let dir = root().join("deploy/manifests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/manifests/ exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("manifest readable");
        objects.extend(documents(&text, &file.display().to_string()));
    }
    by_key(objects, "deploy/manifests/")
}

fn rendered_objects(extra: &[&str]) -> BTreeMap<String, Value> {
    by_key(documents(&render(extra), "helm template"), "helm template")
}

/// Every difference between `want` and `got`, as `path: want ... got ...` lines.
fn differences(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                let p = format!("{path}.{k}");
                match g.get(k) {
                    Some(gv) => differences(&p, wv, gv, out),
                    None => out.push(format!("{p}: missing from the chart (manifests: {wv})")),
                }
            }
            for (k, gv) in g {
                if !w.contains_key(k) {
                    out.push(format!(
                        "{path}.{k}: only in the chart ({gv}), not in the manifests"
                    ));
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                differences(&format!("{path}[{i}]"), wv, gv, out);
            }
        }
        _ if want != got => out.push(format!("{path}: manifests {want}, chart {got}")),
        _ => {}
    }
}

fn find<'a>(objects: &'a BTreeMap<String, Value>, key: &str) -> &'a Value {
    objects.get(key).unwrap_or_else(|| {
        panic!(
            "helm template rendered no {key}; it rendered {:?}",
            objects.keys()
        )
    })
}

#[test]
fn helm_lint_passes() {
    let chart = chart_dir();
    let out = helm(&["lint", "--strict", chart.to_str().expect("UTF-8 path")]);
    assert!(
        out.contains("0 chart(s) failed"),
        "helm lint --strict: unexpected output:\n{out}"
    );
}

#[test]
fn helm_template_with_default_values_equals_the_plain_manifests() {
    let want = manifest_objects();
    assert!(!want.is_empty(), "deploy/manifests/ holds no objects");
    let got = rendered_objects(&[]);
    let mut problems = Vec::new();
    for (k, w) in &want {
        match got.get(k) {
            None => problems.push(format!(
                "{k}: in deploy/manifests/, not rendered by the chart"
            )),
            Some(g) => {
                let mut fields = Vec::new();
                differences("", w, g, &mut fields);
                problems.extend(fields.into_iter().map(|f| format!("{k}: {f}")));
            }
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        problems.push(format!(
            "{k}: rendered by the chart, not in deploy/manifests/"
        ));
    }
    assert!(
        problems.is_empty(),
        "`helm template {RELEASE} deploy/chart/kruise-rs --namespace {NAMESPACE} --include-crds` \
         drifted from deploy/manifests/ ({} difference(s)):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// The YAML files of `dir` by name, with their bytes.
fn yaml_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| {
            let name = p
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, bytes)
        })
        .collect()
}

/// The first line where `want` and `got` differ, for a readable failure.
fn first_difference(want: &[u8], got: &[u8]) -> String {
    let (want, got) = (String::from_utf8_lossy(want), String::from_utf8_lossy(got));
    let mut want_lines = want.lines();
    let mut got_lines = got.lines();
    for line in 1.. {
        match (want_lines.next(), got_lines.next()) {
            (None, None) => break,
            (w, g) if w != g => {
                return format!("line {line}: rendered {w:?}, committed {g:?}");
            }
            _ => {}
        }
    }
    "only in the line endings".to_owned()
}

/// `deploy/manifests/` is generated: `deploy/render-manifests.sh` (what `make manifests` runs)
/// rendering into an empty directory gives exactly the committed files, byte for byte.
#[test]
fn plain_manifests_are_the_rendered_chart() {
    let out = tempfile::tempdir().expect("temporary directory");
    let script = root().join("deploy/render-manifests.sh");
    let run = Command::new(&script)
        .arg(out.path())
        .env("HELM", helm_binary())
        .output()
        .unwrap_or_else(|e| panic!("{}: cannot run: {e}", script.display()));
    assert!(
        run.status.success(),
        "deploy/render-manifests.sh failed ({}):\n{}{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let rendered = yaml_files(out.path());
    let committed = yaml_files(&root().join("deploy/manifests"));
    assert!(
        !rendered.is_empty(),
        "deploy/render-manifests.sh rendered nothing"
    );
    let mut problems = Vec::new();
    for (name, want) in &rendered {
        match committed.get(name) {
            None => problems.push(format!("{name}: rendered, not committed")),
            Some(got) if got != want => {
                problems.push(format!("{name}: {}", first_difference(want, got)));
            }
            Some(_) => {}
        }
    }
    for name in committed.keys().filter(|n| !rendered.contains_key(*n)) {
        problems.push(format!("{name}: committed, not rendered"));
    }
    assert!(
        problems.is_empty(),
        "deploy/manifests/ is not what the chart renders; run `make manifests` (edit the chart, \
         not the manifests):\n  {}",
        problems.join("\n  ")
    );
}

/// What helm adds for its own use stays out of the plain manifests: kubectl users do not
/// manage them with Helm.
#[test]
fn plain_manifests_carry_nothing_of_helm() {
    for (name, bytes) in yaml_files(&root().join("deploy/manifests")) {
        let text = String::from_utf8(bytes).expect("UTF-8");
        for marker in [
            "# Source:",
            "helm.sh/",
            "app.kubernetes.io/managed-by",
            "{{",
        ] {
            assert!(
                !text.contains(marker),
                "deploy/manifests/{name} contains {marker:?}"
            );
        }
    }
}

#[test]
fn chart_crds_are_copies_of_crds() {
    let list = |dir: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| {
                e.expect("directory entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        names.sort();
        names
    };
    let source = root().join("crds");
    let copies = chart_dir().join("crds");
    assert_eq!(
        list(&copies),
        list(&source),
        "deploy/chart/kruise-rs/crds/ must hold exactly the files of crds/ (make manifests \
         copies them)"
    );
    for name in list(&source) {
        let want = std::fs::read(source.join(&name)).expect("readable");
        let got = std::fs::read(copies.join(&name)).expect("readable");
        assert!(
            want == got,
            "deploy/chart/kruise-rs/crds/{name} differs from crds/{name}, its source: run \
             `make manifests` (or `make crds` after changing the types)"
        );
    }
}

/// Every kind the manager serves ships with the chart, and the manager's ClusterRole covers
/// it: ImageListPullJob (its CRD, its controller's grants, the start-up CRD check).
#[test]
fn the_chart_ships_and_grants_every_kind_the_manager_serves() {
    let crds: Vec<String> = kruise_rs_api::crds()
        .iter()
        .map(kruise_rs_api::crd::file_name)
        .collect();
    for name in &crds {
        assert!(
            chart_dir().join("crds").join(name).is_file(),
            "the chart lacks crds/{name}"
        );
    }
    assert!(crds.contains(&"apps.kruise.io_imagelistpulljobs.yaml".to_owned()));
    let objects = rendered_objects(&[]);
    let role = find(&objects, "ClusterRole kruise-rs-manager");
    let verbs = |resource: &str| -> Vec<String> {
        role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|x| x == resource))
                    && r["resourceNames"].is_null()
            })
            .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(
        verbs("imagelistpulljobs"),
        ["get", "list", "watch", "patch", "delete"]
    );
    assert_eq!(verbs("imagelistpulljobs/status"), ["patch"]);
    assert_eq!(verbs("imagelistpulljobs/finalizers"), ["update"]);
    for verb in ["create", "delete"] {
        assert!(verbs("imagepulljobs").iter().any(|v| v == verb), "{verb}");
    }
    let checked = role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["resources"][0] == "customresourcedefinitions")
        .expect("the CRD check rule");
    for name in kruise_rs::manager::crds::REQUIRED_CRDS {
        assert!(
            checked["resourceNames"]
                .as_array()
                .is_some_and(|n| n.iter().any(|x| x == name)),
            "{name} is not readable for the start-up check"
        );
    }
}

/// The documented values reach the fields they are documented to set.
#[test]
fn helm_values_change_the_rendered_objects() {
    let got = rendered_objects(&[
        "--set=image.repository=registry.example/kruise-rs,image.tag=dev,image.pullPolicy=Always",
        "--set=namespaces.manager=kr-sys,namespaces.daemonConfig=kr-secrets",
        "--set=manager.replicas=1,manager.leaderElection.enabled=false",
        "--set=manager.webhook.failurePolicy=Ignore,manager.webhook.timeoutSeconds=5",
        "--set=manager.webhook.unreadableSidecarSetPolicy=refuse",
        "--set=manager.webhook.sidecarSetCacheFence=false",
        "--set=manager.extraArgs={--label-selector=shard=a}",
        "--set=manager.kubeApi.qps=2.5,manager.kubeApi.burst=7",
        "--set=manager.workers.sidecarset=5,manager.workers.nodeimage=4",
        "--set=manager.resources.limits.memory=512Mi",
        "--set=daemon.criSocket=/run/k3s/containerd/containerd.sock,daemon.criSocketGroup=989",
        "--set=daemon.extraArgs={--max-concurrent-pulls=4}",
        "--set=daemon.extraEnvs[0].name=HTTPS_PROXY,daemon.extraEnvs[0].value=http://127.0.0.1:3128",
        "--set=daemon.nodeSelector.pool=build,daemon.resources.limits.cpu=2",
        "--set=daemon.tolerations=null",
        "--set=serviceMonitor.enabled=true,serviceMonitor.labels.release=prom",
        "--set=podDisruptionBudget.enabled=false",
    ]);
    let manager = find(&got, "Deployment kr-sys/kruise-rs-manager");
    let pod = &manager["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(manager["spec"]["replicas"], 1);
    assert_eq!(container["image"], "registry.example/kruise-rs:dev");
    assert_eq!(container["imagePullPolicy"], "Always");
    assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
    let args: Vec<&str> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect();
    for wanted in [
        "--daemon-config-namespace=kr-secrets",
        "--leader-elect=false",
        "--webhook-failure-policy=ignore",
        "--webhook-timeout-seconds=5",
        "--unreadable-sidecarset-policy=refuse",
        "--sidecarset-cache-fence=false",
        "--label-selector=shard=a",
        "--kube-api-qps=2.5",
        "--kube-api-burst=7",
        "--sidecarset-workers=5",
        "--nodeimage-workers=4",
    ] {
        assert!(
            args.contains(&wanted),
            "manager args {args:?} lack {wanted}"
        );
    }

    let daemon = find(&got, "DaemonSet kr-sys/kruise-rs-daemon");
    let pod = &daemon["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["image"], "registry.example/kruise-rs:dev");
    assert_eq!(container["resources"]["limits"]["cpu"], 2);
    assert_eq!(pod["nodeSelector"]["pool"], "build");
    assert!(pod.get("tolerations").is_none(), "tolerations=null: {pod}");
    assert_eq!(
        pod["volumes"][0]["hostPath"]["path"],
        "/run/k3s/containerd/containerd.sock"
    );
    assert_eq!(
        pod["securityContext"]["supplementalGroups"],
        serde_json::json!([989])
    );
    let args = &container["args"];
    assert!(
        args.as_array()
            .expect("args")
            .iter()
            .any(|a| a == "--cri-socket=/run/cri/cri.sock")
            && args
                .as_array()
                .expect("args")
                .iter()
                .any(|a| a == "--max-concurrent-pulls=4"),
        "daemon args: {args}"
    );
    assert_eq!(
        container["env"],
        serde_json::json!([
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "KRUISE_RS_LOG_FORMAT", "value": "json"},
            {"name": "HTTPS_PROXY", "value": "http://127.0.0.1:3128"},
        ]),
        "daemon.extraEnvs come after the chart's own"
    );

    find(&got, "Namespace kr-sys");
    find(&got, "Namespace kr-secrets");
    let binding = find(&got, "RoleBinding kr-secrets/kruise-rs-daemon");
    assert_eq!(binding["subjects"][0]["namespace"], "kr-sys");
    let monitor = find(&got, "ServiceMonitor kr-sys/kruise-rs-manager");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    find(&got, "ServiceMonitor kr-sys/kruise-rs-daemon");
    find(&got, "Service kr-sys/kruise-rs-manager-metrics");
    find(&got, "Service kr-sys/kruise-rs-daemon-metrics");
    assert!(
        !got.keys().any(|k| k.starts_with("PodDisruptionBudget ")),
        "podDisruptionBudget.enabled=false still renders one: {:?}",
        got.keys()
    );
    for (k, object) in got
        .iter()
        .filter(|(_, o)| o["kind"] != "CustomResourceDefinition")
    {
        let text = object.to_string();
        assert!(
            !text.contains("kruise-system") && !text.contains("kruise-daemon-config"),
            "{k} still names a default namespace: {text}"
        );
    }

    // Defaults pass neither flag; the Role grants the default Lease.
    let defaults = rendered_objects(&[]);
    let args = manager_args(&defaults);
    assert!(
        !args.iter().any(|a| a.starts_with("--leader-election-id")
            || a.starts_with("--sidecarset-")
            || a.starts_with("--max-pulls-per-registry")),
        "{args:?}"
    );
    assert_eq!(lease_names(&defaults), ["kruise-rs-manager"]);
    // Switching from upstream: its Lease, in the flag and the Role; pre-download off.
    let switching = rendered_objects(&[
        "--set=manager.leaderElection.leaseName=kruise-manager",
        "--set=manager.sidecarsetPredownload=false",
        "--set=manager.maxPullsPerRegistry=20",
    ]);
    let args = manager_args(&switching);
    for wanted in [
        "--leader-election-id=kruise-manager",
        "--sidecarset-predownload=false",
        "--max-pulls-per-registry=20",
    ] {
        assert!(args.iter().any(|a| a == wanted), "{args:?} lack {wanted}");
    }
    assert_eq!(lease_names(&switching), ["kruise-manager"]);
    // Upstream's pod signal, patch-metadata gate and container sorting gate, all off by
    // default.
    let defaults = manager_args(&rendered_objects(&[]));
    assert!(
        !defaults
            .iter()
            .any(|a| a.starts_with("--sidecarset-sort-containers-by-name")
                || a.starts_with("--metrics-compat")),
        "{defaults:?}"
    );
    let upstream = rendered_objects(&[
        "--set=manager.sidecarsetUpgradableConditionOnUpgrade=true",
        "--set=manager.sidecarsetPatchPodMetadataDefaultsAllowed=true",
        "--set=manager.sidecarsetSortContainersByName=true",
        "--set=manager.metricsCompat=upstream",
    ]);
    let args = manager_args(&upstream);
    for wanted in [
        "--sidecarset-upgradable-condition-on-upgrade=true",
        "--sidecarset-patch-pod-metadata-defaults-allowed=true",
        "--sidecarset-sort-containers-by-name=true",
        "--metrics-compat=upstream",
    ] {
        assert!(args.iter().any(|a| a == wanted), "{args:?} lack {wanted}");
    }

    // namespaces.create=false: no Namespace objects.
    let got = rendered_objects(&["--set=namespaces.create=false"]);
    assert!(
        !got.keys().any(|k| k.starts_with("Namespace ")),
        "namespaces.create=false still renders: {:?}",
        got.keys()
    );
}

fn manager_args(objects: &BTreeMap<String, Value>) -> Vec<String> {
    let manager = find(objects, "Deployment kruise-system/kruise-rs-manager");
    manager["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_owned())
        .collect()
}

/// The Lease names the manager's Role lets it read and update.
fn lease_names(objects: &BTreeMap<String, Value>) -> Vec<String> {
    let role = find(objects, "Role kruise-system/kruise-rs-manager");
    role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| r["resources"] == serde_json::json!(["leases"]))
        .flat_map(|r| r["resourceNames"].as_array().cloned().unwrap_or_default())
        .map(|n| n.as_str().expect("a name").to_owned())
        .collect()
}

/// values.schema.json refuses the values the manager would only refuse at start-up.
#[test]
fn helm_refuses_invalid_values() {
    let chart = chart_dir();
    let chart = chart.to_str().expect("UTF-8 path");
    for (set, complaint) in [
        (
            "manager.webhook.failurePolicy=Never",
            "/manager/webhook/failurePolicy",
        ),
        (
            "manager.webhook.timeoutSeconds=31",
            "/manager/webhook/timeoutSeconds",
        ),
        (
            "manager.webhook.unreadableSidecarSetPolicy=ignore",
            "/manager/webhook/unreadableSidecarSetPolicy",
        ),
        (
            "manager.webhook.sidecarSetCacheFence=maybe",
            "/manager/webhook/sidecarSetCacheFence",
        ),
        ("manager.replicas=0", "/manager/replicas"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("daemon.criSocket=run/crio/crio.sock", "/daemon/criSocket"),
        ("daemon.criSocketGroup=-1", "/daemon/criSocketGroup"),
        (
            "daemon.imageFsPath=var/lib/containerd",
            "/daemon/imageFsPath",
        ),
        (
            "daemon.credentialProvider.binDir=plugins",
            "/daemon/credentialProvider/binDir",
        ),
        (
            "daemon.credentialProvider.enabled=maybe",
            "/daemon/credentialProvider/enabled",
        ),
        (
            "manager.leaderElection.leaseName=Kruise_Manager",
            "/manager/leaderElection/leaseName",
        ),
        (
            "manager.sidecarsetPredownload=maybe",
            "/manager/sidecarsetPredownload",
        ),
        (
            "manager.maxPullsPerRegistry=-1",
            "/manager/maxPullsPerRegistry",
        ),
        (
            "manager.sidecarsetUpgradableConditionOnUpgrade=maybe",
            "/manager/sidecarsetUpgradableConditionOnUpgrade",
        ),
        (
            "manager.sidecarsetPatchPodMetadataDefaultsAllowed=maybe",
            "/manager/sidecarsetPatchPodMetadataDefaultsAllowed",
        ),
        (
            "manager.sidecarsetSortContainersByName=maybe",
            "/manager/sidecarsetSortContainersByName",
        ),
        ("daemon.extraEnvs[0].value=x", "/daemon/extraEnvs/0"),
        (
            "manager.metricsCompat=controller-runtime",
            "/manager/metricsCompat",
        ),
        ("manager.kubeApi.qps=-1", "/manager/kubeApi/qps"),
        ("manager.kubeApi.qps=fast", "/manager/kubeApi/qps"),
        ("manager.kubeApi.burst=0", "/manager/kubeApi/burst"),
        ("manager.workers.nodeimage=0", "/manager/workers/nodeimage"),
        (
            "manager.workers.sidecarset=70000",
            "/manager/workers/sidecarset",
        ),
    ] {
        let out = helm_output(&["template", RELEASE, chart, "--set", set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(complaint),
            "helm template --set {set}: expected a schema error at {complaint}, got {}:\n{stderr}",
            out.status
        );
    }
}

/// `--set key=null` takes a key out of the chart's defaults. A value whose absence the templates
/// would read as `false`, `0` or an empty flag (a feature on by default silently off, a policy
/// silently gone, `--leader-election-id=`) is required by the schema, so taking it out is refused
/// with its name, not rendered.
#[test]
fn helm_refuses_to_take_out_a_value_it_needs() {
    let chart = chart_dir();
    let chart = chart.to_str().expect("UTF-8 path");
    for key in [
        "image.repository",
        "image.pullPolicy",
        "namespaces.create",
        "namespaces.manager",
        "namespaces.daemonConfig",
        "manager.replicas",
        "manager.leaderElection.enabled",
        "manager.leaderElection.leaseName",
        "manager.sidecarsetPredownload",
        "manager.maxPullsPerRegistry",
        "manager.metricsCompat",
        "manager.preStopSleepSeconds",
        "manager.terminationGracePeriodSeconds",
        "manager.webhook.failurePolicy",
        "manager.webhook.timeoutSeconds",
        "manager.webhook.shutdownGrace",
        "manager.webhook.unreadableSidecarSetPolicy",
        "manager.webhook.sidecarSetCacheFence",
        "manager.kubeApi.qps",
        "manager.kubeApi.burst",
        "manager.workers.sidecarset",
        "manager.workers.nodeimage",
        "daemon.criSocket",
        "daemon.criSocketGroup",
        "podDisruptionBudget.enabled",
        "podDisruptionBudget.minAvailable",
        "daemonPolicy.ownNodeImageOnly",
        "managerPolicy.dryRunPodsOnly",
        "serviceMonitor.enabled",
    ] {
        let set = format!("{key}=null");
        let out = helm_output(&["template", RELEASE, chart, "--set", &set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let (parent, field) = key.rsplit_once('.').expect("a nested key");
        let at = format!("/{}", parent.replace('.', "/"));
        assert!(
            !out.status.success() && stderr.contains(&at) && stderr.contains(field),
            "helm template --set {set}: expected a schema error naming {field} at {at}, got {}:\n{stderr}",
            out.status
        );
    }
    // What may be taken out still may: the lists, maps and optional strings.
    for set in [
        "daemon.tolerations=null",
        "manager.priorityClassName=null",
        "manager.webhook.namespaceSelector=null",
        "daemon.imageFsPath=null",
        "image.tag=null",
    ] {
        let out = helm_output(&["template", RELEASE, chart, "--set", set]);
        assert!(
            out.status.success(),
            "helm template --set {set}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `daemonPolicy.ownNodeImageOnly`: on by default, for the daemon's ServiceAccount in the
/// manager's namespace; false renders neither the policy nor its binding; not a boolean is
/// refused by the schema.
#[test]
fn helm_daemon_policy_value() {
    const POLICY: &str = "kruise-rs-daemon-own-nodeimage";
    let condition = |objects: &BTreeMap<String, Value>| {
        let policy = find(objects, &format!("ValidatingAdmissionPolicy {POLICY}"));
        let binding = find(
            objects,
            &format!("ValidatingAdmissionPolicyBinding {POLICY}"),
        );
        assert_eq!(binding["spec"]["policyName"], POLICY);
        assert_eq!(
            binding["spec"]["validationActions"],
            serde_json::json!(["Deny"])
        );
        policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .expect("an expression")
            .to_owned()
    };
    assert_eq!(
        condition(&rendered_objects(&[])),
        r#"request.userInfo.username == "system:serviceaccount:kruise-system:kruise-rs-daemon""#
    );
    assert_eq!(
        condition(&rendered_objects(&["--set=namespaces.manager=kr-sys"])),
        r#"request.userInfo.username == "system:serviceaccount:kr-sys:kruise-rs-daemon""#
    );

    let off = rendered_objects(&["--set=daemonPolicy.ownNodeImageOnly=false"]);
    assert!(
        !off.keys().any(|k| k.contains(POLICY)),
        "daemonPolicy.ownNodeImageOnly=false still renders: {:?}",
        off.keys()
    );

    let chart = chart_dir();
    let out = helm_output(&[
        "template",
        RELEASE,
        chart.to_str().expect("UTF-8 path"),
        "--set",
        "daemonPolicy.ownNodeImageOnly=maybe",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/daemonPolicy/ownNodeImageOnly"),
        "expected a schema error at /daemonPolicy/ownNodeImageOnly, got {}:\n{stderr}",
        out.status
    );
}

/// `managerPolicy.dryRunPodsOnly`: on by default, for the manager's ServiceAccount in the
/// manager's namespace, on pod CREATE only; false renders neither the policy nor its binding;
/// not a boolean is refused by the schema.
#[test]
fn helm_manager_policy_value() {
    const POLICY: &str = "kruise-rs-manager-dry-run-pods-only";
    let condition = |objects: &BTreeMap<String, Value>| {
        let policy = find(objects, &format!("ValidatingAdmissionPolicy {POLICY}"));
        let binding = find(
            objects,
            &format!("ValidatingAdmissionPolicyBinding {POLICY}"),
        );
        assert_eq!(binding["spec"]["policyName"], POLICY);
        assert_eq!(
            binding["spec"]["validationActions"],
            serde_json::json!(["Deny"])
        );
        assert_eq!(
            policy["spec"]["matchConstraints"]["resourceRules"],
            serde_json::json!([{"apiGroups": [""], "apiVersions": ["*"],
                                "operations": ["CREATE"], "resources": ["pods"]}])
        );
        policy["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .expect("an expression")
            .to_owned()
    };
    assert_eq!(
        condition(&rendered_objects(&[])),
        r#"request.userInfo.username == "system:serviceaccount:kruise-system:kruise-rs-manager""#
    );
    assert_eq!(
        condition(&rendered_objects(&["--set=namespaces.manager=kr-sys"])),
        r#"request.userInfo.username == "system:serviceaccount:kr-sys:kruise-rs-manager""#
    );

    let off = rendered_objects(&["--set=managerPolicy.dryRunPodsOnly=false"]);
    assert!(
        !off.keys().any(|k| k.contains(POLICY)),
        "managerPolicy.dryRunPodsOnly=false still renders: {:?}",
        off.keys()
    );

    let chart = chart_dir();
    let out = helm_output(&[
        "template",
        RELEASE,
        chart.to_str().expect("UTF-8 path"),
        "--set",
        "managerPolicy.dryRunPodsOnly=maybe",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("/managerPolicy/dryRunPodsOnly"),
        "expected a schema error at /managerPolicy/dryRunPodsOnly, got {}:\n{stderr}",
        out.status
    );
}

/// The values of the chart that mounted the host's whole /var/run are refused with what to set
/// now, rather than rendering a daemon that cannot start.
#[test]
fn helm_refuses_the_old_cri_values_saying_what_replaced_them() {
    let chart = chart_dir();
    let chart = chart.to_str().expect("UTF-8 path");
    for (set, complaint) in [
        (
            "daemon.criHostPath=/var/run",
            "daemon.criHostPath is gone: the daemon mounts only its CRI socket; set \
             daemon.criSocket",
        ),
        (
            "daemon.criSocket=/hostvarrun/k3s/containerd/containerd.sock",
            "daemon.criSocket is now the socket's path on the host, not under /hostvarrun",
        ),
    ] {
        let out = helm_output(&["template", RELEASE, chart, "--set", set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(complaint),
            "helm template --set {set}: expected {complaint:?}, got {}:\n{stderr}",
            out.status
        );
    }
}

/// `daemon.credentialProvider`: off by default (no ConfigMap, flag, volume or mount); on, the
/// config rendered into a ConfigMap the daemon accepts, or an existing ConfigMap, mounted with
/// the plugins' directory (read-only hostPath) and passed as `--plugin-config-file` and
/// `--plugin-bin-dir`; on without a config is refused.
/// `daemon.imageFsPath` mounts the runtime's image filesystem read-only at its own path (where
/// the daemon finds what ImageFsInfo names); off by default, the daemon's only host path stays
/// its socket.
#[test]
fn helm_daemon_image_fs_path_value() {
    let pod = |objects: &BTreeMap<String, Value>| {
        find(objects, "DaemonSet kruise-system/kruise-rs-daemon")["spec"]["template"]["spec"]
            .clone()
    };
    let socket = serde_json::json!({"name": "cri-socket", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}});
    let off = pod(&rendered_objects(&[]));
    assert_eq!(off["volumes"], serde_json::json!([socket]));
    let on = pod(&rendered_objects(&[
        "--set=daemon.imageFsPath=/var/lib/containerd",
    ]));
    assert_eq!(
        on["volumes"],
        serde_json::json!([
            socket,
            {"name": "image-fs", "hostPath": {"path": "/var/lib/containerd", "type": "Directory"}},
        ])
    );
    assert_eq!(
        on["containers"][0]["volumeMounts"],
        serde_json::json!([
            {"name": "cri-socket", "mountPath": "/run/cri/cri.sock", "readOnly": true},
            {"name": "image-fs", "mountPath": "/var/lib/containerd", "readOnly": true},
        ])
    );
}

#[test]
fn helm_daemon_credential_provider_values() {
    const CONFIG_MAP: &str = "ConfigMap kruise-system/kruise-rs-daemon-credential-provider";
    const DAEMON: &str = "DaemonSet kruise-system/kruise-rs-daemon";
    let pod = |objects: &BTreeMap<String, Value>| find(objects, DAEMON)["spec"]["template"].clone();
    let args = |pod: &Value| -> Vec<String> {
        pod["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg").to_owned())
            .collect()
    };
    let names = |list: &Value| -> Vec<String> {
        list.as_array()
            .expect("a list")
            .iter()
            .map(|v| v["name"].as_str().expect("a name").to_owned())
            .collect()
    };

    let defaults = rendered_objects(&[]);
    assert!(!defaults.contains_key(CONFIG_MAP), "{:?}", defaults.keys());
    let default_pod = pod(&defaults);
    assert!(
        !args(&default_pod)
            .iter()
            .any(|a| a.starts_with("--plugin-")),
        "{:?}",
        args(&default_pod)
    );
    assert_eq!(names(&default_pod["spec"]["volumes"]), ["cri-socket"]);
    assert_eq!(
        names(&default_pod["spec"]["containers"][0]["volumeMounts"]),
        ["cri-socket"]
    );
    assert!(default_pod["metadata"].get("annotations").is_none());

    let config = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1",
        "kind": "CredentialProviderConfig",
        "providers": [{
            "name": "ecr-credential-provider",
            "matchImages": ["*.dkr.ecr.*.amazonaws.com"],
            "defaultCacheDuration": "12h",
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "args": ["get-credentials"],
            "env": [{"name": "AWS_PROFILE", "value": "nodes"}],
        }],
    });
    let set_config = format!("daemon.credentialProvider.config={config}");
    let on = rendered_objects(&[
        "--set=daemon.credentialProvider.enabled=true",
        "--set-json",
        &set_config,
    ]);
    let rendered = find(&on, CONFIG_MAP)["data"]["CredentialProviderPlugin.yaml"]
        .as_str()
        .expect("the config's key")
        .to_owned();
    let back: Value = serde_yaml::from_str(&rendered).expect("YAML");
    assert_eq!(back, config);
    // The daemon accepts what the chart renders.
    let providers = kruise_rs_daemon::credential_provider::parse_config(&rendered)
        .expect("a config the daemon accepts");
    assert_eq!(providers[0].name, "ecr-credential-provider");
    let on_pod = pod(&on);
    let on_args = args(&on_pod);
    for wanted in [
        "--plugin-config-file=/etc/kruise-rs/credential-provider/CredentialProviderPlugin.yaml",
        "--plugin-bin-dir=/kruise/plugins",
    ] {
        assert!(
            on_args.iter().any(|a| a == wanted),
            "{on_args:?} lack {wanted}"
        );
    }
    assert_eq!(
        on_pod["spec"]["volumes"],
        serde_json::json!([
            {"name": "cri-socket", "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}},
            {"name": "credential-provider-config", "configMap": {"name": "kruise-rs-daemon-credential-provider"}},
            {"name": "credential-provider-plugins", "hostPath": {
                "path": "/usr/libexec/kubernetes/kubelet-plugins/credential-provider/exec",
                "type": "Directory"
            }},
        ])
    );
    assert_eq!(
        on_pod["spec"]["containers"][0]["volumeMounts"],
        serde_json::json!([
            {"name": "cri-socket", "mountPath": "/run/cri/cri.sock", "readOnly": true},
            {"name": "credential-provider-config", "mountPath": "/etc/kruise-rs/credential-provider", "readOnly": true},
            {"name": "credential-provider-plugins", "mountPath": "/kruise/plugins", "readOnly": true},
        ])
    );
    // A changed config rolls the daemons.
    let annotation = |pod: &Value| {
        pod["metadata"]["annotations"]["kruise-rs.io/credential-provider-config"].clone()
    };
    assert!(annotation(&on_pod).is_string(), "{}", on_pod["metadata"]);
    let mut changed = config.clone();
    changed["providers"][0]["defaultCacheDuration"] = "1h".into();
    let changed = rendered_objects(&[
        "--set=daemon.credentialProvider.enabled=true",
        "--set-json",
        &format!("daemon.credentialProvider.config={changed}"),
    ]);
    assert_ne!(annotation(&pod(&changed)), annotation(&on_pod));

    // A YAML string is rendered as written.
    let text =
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n";
    let as_string = rendered_objects(&[
        "--set=daemon.credentialProvider.enabled=true",
        "--set-json",
        &format!(
            "daemon.credentialProvider.config={}",
            serde_json::json!(text)
        ),
    ]);
    assert_eq!(
        find(&as_string, CONFIG_MAP)["data"]["CredentialProviderPlugin.yaml"]
            .as_str()
            .map(str::trim_end),
        Some(text.trim_end())
    );

    // An existing ConfigMap, another key and another plugins' directory.
    let existing = rendered_objects(&[
        "--set=daemon.credentialProvider.enabled=true",
        "--set=daemon.credentialProvider.existingConfigMap=node-credentials",
        "--set=daemon.credentialProvider.configKey=config.json",
        "--set=daemon.credentialProvider.binDir=/etc/eks/image-credential-provider",
    ]);
    assert!(!existing.contains_key(CONFIG_MAP), "{:?}", existing.keys());
    let existing_pod = pod(&existing);
    assert!(
        args(&existing_pod)
            .iter()
            .any(|a| a == "--plugin-config-file=/etc/kruise-rs/credential-provider/config.json"),
        "{:?}",
        args(&existing_pod)
    );
    let volumes = &existing_pod["spec"]["volumes"];
    assert_eq!(volumes[1]["configMap"]["name"], "node-credentials");
    assert_eq!(
        volumes[2]["hostPath"]["path"],
        "/etc/eks/image-credential-provider"
    );
    assert!(existing_pod["metadata"].get("annotations").is_none());

    // On without a config: refused, saying what is missing.
    let chart = chart_dir();
    let out = helm_output(&[
        "template",
        RELEASE,
        chart.to_str().expect("UTF-8 path"),
        "--set",
        "daemon.credentialProvider.enabled=true",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains(
                "daemon.credentialProvider.enabled needs daemon.credentialProvider.config"
            ),
        "{}:\n{stderr}",
        out.status
    );
}

/// Issue 20: the manager pods outlive their removal from the webhook Service (a preStop sleep,
/// then `--webhook-shutdown-grace`, within terminationGracePeriodSeconds) and are scheduled as
/// control plane; each of these is a value.
#[test]
fn the_manager_stops_gracefully_and_is_prioritized() {
    let defaults = rendered_objects(&[]);
    let spec =
        &find(&defaults, "Deployment kruise-system/kruise-rs-manager")["spec"]["template"]["spec"];
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    assert_eq!(spec["terminationGracePeriodSeconds"], 40);
    // GKE admits system-* priority pods outside kube-system only under a quota scoped to them.
    let quota = find(
        &defaults,
        "ResourceQuota kruise-system/kruise-rs-critical-pods",
    );
    assert_eq!(
        quota["spec"]["hard"]["pods"], "5",
        "2 replicas, a surge, 2 stopping"
    );
    assert_eq!(
        quota["spec"]["scopeSelector"]["matchExpressions"][0]["values"],
        serde_json::json!(["system-cluster-critical"])
    );
    let container = &spec["containers"][0];
    assert_eq!(container["lifecycle"]["preStop"]["sleep"]["seconds"], 5);
    let args = container["args"].as_array().expect("args");
    assert!(
        !args.iter().any(|a| a
            .as_str()
            .is_some_and(|a| a.starts_with("--webhook-shutdown-grace"))),
        "the default grace passes no flag: {args:?}"
    );

    let tuned = rendered_objects(&[
        "--set=manager.priorityClassName=,manager.preStopSleepSeconds=0",
        "--set=manager.terminationGracePeriodSeconds=90,manager.webhook.shutdownGrace=30s",
        "--set=manager.webhook.podObjectSelector.matchLabels.inject=yes",
    ]);
    let spec =
        &find(&tuned, "Deployment kruise-system/kruise-rs-manager")["spec"]["template"]["spec"];
    assert!(spec.get("priorityClassName").is_none(), "{spec}");
    assert!(
        !tuned.contains_key("ResourceQuota kruise-system/kruise-rs-critical-pods"),
        "no quota without a system-* priority class"
    );
    assert_eq!(spec["terminationGracePeriodSeconds"], 90);
    let container = &spec["containers"][0];
    assert!(container.get("lifecycle").is_none(), "{container}");
    assert!(
        container["args"]
            .as_array()
            .expect("args")
            .contains(&Value::from("--webhook-shutdown-grace=30s")),
        "{}",
        container["args"]
    );
    assert!(
        container["args"]
            .as_array()
            .expect("args")
            .contains(&Value::from(
                r#"--webhook-pod-object-selector={"matchLabels":{"inject":"yes"}}"#
            )),
        "{}",
        container["args"]
    );
}
