//! The plain manifests under `deploy/manifests/` against a real apiserver: the CRD copies equal
//! `crds/`, every object passes server-side validation (`kubectl apply --dry-run=server`), the
//! container arguments are flags the binary accepts, and the webhook-configuration rule really
//! needs the shipped placeholders. What the RBAC grants, exactly, is `rbac_matrix.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::support::{self, TestCluster};

/// RBAC changes reach the authorizer through informers: allow them this long to show.
const RBAC_PROPAGATION: Duration = Duration::from_secs(30);

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/manifests")
}

/// The YAML files of `deploy/manifests/`, in the order `kubectl apply -f` reads them.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifests_dir())
        .expect("deploy/manifests/ exists")
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every object of every manifest file.
pub(crate) fn manifest_objects() -> Vec<Value> {
    let mut objects = Vec::new();
    for file in manifest_files() {
        let text = std::fs::read_to_string(&file).expect("manifest readable");
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", file.display()));
            if !value.is_null() {
                objects.push(value);
            }
        }
    }
    objects
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("deploy/manifests/ has no {kind} {name}"))
}

fn run(mut cmd: Command) -> std::process::Output {
    let shown = format!("{cmd:?}");
    let out = cmd.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "{shown} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Server-side applies `files` for real.
pub(crate) fn apply(cluster: &TestCluster, files: &[&str]) {
    let mut cmd = cluster.kubectl();
    cmd.args([
        "apply",
        "--server-side",
        "--field-manager=kruise-rs-deploy-test",
    ]);
    for file in files {
        cmd.arg("-f").arg(manifests_dir().join(file));
    }
    run(cmd);
}

/// `kubectl auth can-i --as=<user> <verb> <resource> (-n <namespace> | -A)`: the apiserver's
/// answer (a SubjectAccessReview), as a bool. `resource` is `kind[.group][/name][:subresource]`.
fn can_i(cluster: &TestCluster, user: &str, verb: &str, resource: &str, ns: Option<&str>) -> bool {
    let mut cmd = cluster.kubectl();
    let (resource, subresource) = match resource.split_once(':') {
        Some((resource, subresource)) => (resource, Some(subresource)),
        None => (resource, None),
    };
    cmd.args(["auth", "can-i", verb, resource, "--as", user]);
    if let Some(subresource) = subresource {
        cmd.arg(format!("--subresource={subresource}"));
    }
    match ns {
        Some(ns) => cmd.args(["-n", ns]),
        // Cluster-scoped resources, or every namespace at once.
        None => cmd.arg("--all-namespaces"),
    };
    let out = cmd.output().expect("kubectl runs");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match answer.as_str() {
        "yes" => true,
        "no" => false,
        _ => panic!(
            "kubectl auth can-i {verb} {resource} as {user}: {answer:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
fn deploy_crd_copies_equal_the_generated_crds() {
    let generated = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    let mut expected: Vec<String> = std::fs::read_dir(&generated)
        .expect("crds/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .map(|n| format!("01-{n}"))
        .collect();
    expected.sort();
    let mut copies: Vec<String> = manifest_files()
        .iter()
        .map(|p| p.file_name().expect("file").to_string_lossy().into_owned())
        .filter(|n| n.starts_with("01-"))
        .collect();
    copies.sort();
    assert_eq!(
        copies, expected,
        "deploy/manifests/01-* must be crds/* (make manifests copies them)"
    );
    for copy in &copies {
        let original = generated.join(copy.trim_start_matches("01-"));
        assert_eq!(
            std::fs::read_to_string(manifests_dir().join(copy)).expect("copy"),
            std::fs::read_to_string(&original).expect("original"),
            "deploy/manifests/{copy} differs from {}, its source: run `make manifests`",
            original.display()
        );
    }
}

#[test]
fn deploy_workloads_are_wired_as_documented() {
    let objects = manifest_objects();
    let manager = find(&objects, "Deployment", "kruise-rs-manager");
    let daemon = find(&objects, "DaemonSet", "kruise-rs-daemon");
    assert_eq!(manager["metadata"]["namespace"], "kruise-system");
    assert_eq!(manager["spec"]["replicas"], 2);
    let pod = &manager["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "kruise-rs-manager");
    let container = &pod["containers"][0];
    let env = |c: &Value, name: &str| -> Value {
        c["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == name))
            .map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(env(container, "POD_NAMESPACE"), "metadata.namespace");
    assert_eq!(env(container, "POD_NAME"), "metadata.name");
    let security = &container["securityContext"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert!(container["resources"]["limits"]["memory"].is_string());

    // The webhook Service the manager points its configurations at: 443 -> the webhook port.
    let service = find(&objects, "Service", "kruise-rs-webhook");
    assert_eq!(service["spec"]["ports"][0]["port"], 443);
    let target = &service["spec"]["ports"][0]["targetPort"];
    let webhook_port = container["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == *target || p["containerPort"] == *target)
        .expect("the Service's targetPort is a manager port");
    assert_eq!(webhook_port["containerPort"], 9443);
    assert_eq!(
        service["spec"]["selector"],
        manager["spec"]["selector"]["matchLabels"]
    );
    let pdb = find(&objects, "PodDisruptionBudget", "kruise-rs-manager");
    assert_eq!(pdb["spec"]["selector"], manager["spec"]["selector"]);

    let pod = &daemon["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "kruise-rs-daemon");
    assert_eq!(pod["tolerations"][0]["operator"], "Exists");
    let container = &pod["containers"][0];
    assert_eq!(env(container, "NODE_NAME"), "spec.nodeName");
    assert_eq!(
        pod["volumes"][0]["hostPath"]["path"],
        "/run/containerd/containerd.sock"
    );
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], "http");
    assert_eq!(container["ports"][0]["containerPort"], 10221);

    // Every argument is a flag the binary accepts with a value it parses: clap stops at the
    // first bad one, before it gets to `--help`. The manager is the image's entrypoint with its
    // subcommand; the daemon runs the daemon's own binary, which takes no subcommand.
    assert_eq!(
        container["command"],
        serde_json::json!(["/usr/local/bin/kruise-rs-daemon"])
    );
    for (what, workload, binary) in [
        ("manager", manager, env!("CARGO_BIN_EXE_kruise-rs")),
        ("daemon", daemon, env!("CARGO_BIN_EXE_kruise-rs-daemon")),
    ] {
        let args: Vec<&str> = workload["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("string arg"))
            .collect();
        if what == "manager" {
            assert_eq!(args[0], what);
        }
        let out = Command::new(binary)
            .args(&args)
            .arg("--help")
            .env_remove("POD_NAMESPACE")
            .env("NODE_NAME", "node-1")
            .output()
            .expect("kruise-rs runs");
        assert!(
            out.status.success(),
            "the {what}'s args {args:?} are refused: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The host access and privileges of both workloads: the daemon's one hostPath volume is its CRI
/// socket, mounted read-only; neither runs as root, escalates, keeps a capability or writes its
/// root filesystem; only their own pods mount their service-account tokens.
#[test]
fn deploy_workloads_have_the_smallest_host_footprint() {
    let objects = manifest_objects();
    let workloads: Vec<&Value> = objects
        .iter()
        .filter(|o| o["spec"]["template"]["spec"].is_object())
        .collect();
    let names: Vec<String> = workloads
        .iter()
        .map(|w| format!("{} {}", w["kind"], w["metadata"]["name"]))
        .collect();
    assert_eq!(
        names,
        [
            "\"Deployment\" \"kruise-rs-manager\"",
            "\"DaemonSet\" \"kruise-rs-daemon\""
        ],
        "the workloads this test covers"
    );
    for workload in &workloads {
        let name = &workload["metadata"]["name"];
        let pod = &workload["spec"]["template"]["spec"];
        for host in ["hostNetwork", "hostPID", "hostIPC", "hostUsers"] {
            assert!(
                pod.get(host).is_none(),
                "{name}: {host} is set: {}",
                pod[host]
            );
        }
        assert_eq!(pod["automountServiceAccountToken"], true, "{name}");
        let security = &pod["securityContext"];
        assert_eq!(security["runAsNonRoot"], true, "{name}");
        assert_eq!(security["runAsUser"], 65532, "{name}");
        assert_eq!(security["runAsGroup"], 65532, "{name}");
        assert_eq!(
            security["seccompProfile"]["type"], "RuntimeDefault",
            "{name}"
        );
        assert!(pod.get("initContainers").is_none(), "{name}");
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "{name}");
        let security = &containers[0]["securityContext"];
        assert_eq!(security["runAsNonRoot"], true, "{name}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{name}");
        assert_ne!(security["privileged"], true, "{name}");
        assert_eq!(security["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(
            security["capabilities"],
            serde_json::json!({"drop": ["ALL"]}),
            "{name}"
        );
        assert!(security.get("runAsUser").is_none(), "{name}: the pod's uid");
    }

    let manager = &find(&objects, "Deployment", "kruise-rs-manager")["spec"]["template"]["spec"];
    assert_eq!(
        manager["volumes"],
        serde_json::json!([{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}]),
        "the manager's only volume is a small scratch /tmp"
    );

    let daemon = &find(&objects, "DaemonSet", "kruise-rs-daemon")["spec"]["template"]["spec"];
    assert_eq!(
        daemon["volumes"],
        serde_json::json!([{
            "name": "cri-socket",
            "hostPath": {"path": "/run/containerd/containerd.sock", "type": "Socket"}
        }]),
        "the daemon's only volume is the CRI socket"
    );
    let container = &daemon["containers"][0];
    assert_eq!(
        container["volumeMounts"],
        serde_json::json!([{"name": "cri-socket", "mountPath": "/run/cri/cri.sock", "readOnly": true}])
    );
    assert!(
        container["args"]
            .as_array()
            .expect("args")
            .iter()
            .any(|a| a == "--cri-socket=/run/cri/cri.sock"),
        "the daemon is told where its socket is mounted: {}",
        container["args"]
    );
    // The socket's group (root's, as the runtimes create it) and nothing more.
    assert_eq!(
        daemon["securityContext"]["supplementalGroups"],
        serde_json::json!([0])
    );

    // A pod of someone else's that names these accounts gets no token unless it asks.
    for account in ["kruise-rs-manager", "kruise-rs-daemon"] {
        assert_eq!(
            find(&objects, "ServiceAccount", account)["automountServiceAccountToken"],
            false,
            "{account}"
        );
    }
}

#[tokio::test]
async fn deploy_manifests_pass_server_side_dry_run() {
    let cluster = support::cluster().await;
    // Namespaced objects dry-run only into existing namespaces.
    apply(cluster, &["00-namespaces.yaml"]);
    let mut cmd = cluster.kubectl();
    cmd.args([
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=kruise-rs-deploy-test",
        "--dry-run=server",
        "-o",
        "name",
        "-f",
    ])
    .arg(manifests_dir());
    let out = run(cmd);
    let applied = String::from_utf8_lossy(&out.stdout);
    let applied: Vec<&str> = applied.lines().map(str::trim).collect();
    for object in manifest_objects() {
        let kind = object["kind"].as_str().expect("kind").to_lowercase();
        let group = object["apiVersion"]
            .as_str()
            .expect("apiVersion")
            .rsplit_once('/')
            .map(|(group, _)| group.to_owned());
        let name = object["metadata"]["name"].as_str().expect("name");
        let expected = match group {
            Some(group) => format!("{kind}.{group}/{name}"),
            None => format!("{kind}/{name}"),
        };
        assert!(
            applied.contains(&expected.as_str()),
            "{expected} was not in the dry-run output: {applied:?}"
        );
    }
}

/// The manager's webhook-configuration rule grants `patch` on its two names and no `create`
/// (which RBAC cannot limit to a name). A server-side apply that *creates* an object is
/// authorized as `create`, so the manifests ship the two configurations empty and the manager's
/// apply only ever patches them. Both halves are proven here with the same rule shape on a name
/// of this test's own (the real names belong to the webhook tests sharing this cluster).
#[tokio::test]
async fn deploy_webhook_configuration_apply_needs_the_shipped_placeholder() {
    let cluster = support::cluster().await;
    let name = support::unique_name("deploy-apply-only");
    let user = format!("{name}-user");
    let rbac = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {name}
rules:
  - apiGroups: ["admissionregistration.k8s.io"]
    resources: ["validatingwebhookconfigurations"]
    resourceNames: ["{name}"]
    verbs: ["patch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {name}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {name}
subjects:
  - apiGroup: rbac.authorization.k8s.io
    kind: User
    name: {user}
"#
    );
    let mut cmd = cluster.kubectl();
    cmd.args(["apply", "-f", "-"]);
    let out = support::run_with_stdin(cmd, &rbac);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resource = format!("validatingwebhookconfigurations.admissionregistration.k8s.io/{name}");
    support::wait_for(
        "the patch-only role to reach the authorizer",
        RBAC_PROPAGATION,
        || async { can_i(cluster, &user, "patch", &resource, None).then_some(()) },
    )
    .await;

    // What the manager applies (abridged): no webhooks, so other tests never notice it.
    let configuration = format!(
        "apiVersion: admissionregistration.k8s.io/v1\n\
         kind: ValidatingWebhookConfiguration\n\
         metadata:\n  name: {name}\n  labels:\n    applied-by: manager\n\
         webhooks: []\n"
    );
    let apply_as_user = || {
        let mut cmd = cluster.kubectl();
        cmd.args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=kruise-rs",
            "--as",
            &user,
            "-f",
            "-",
        ]);
        support::run_with_stdin(cmd, &configuration)
    };
    let without_placeholder = apply_as_user();
    // The placeholder exactly as deploy/manifests/05-webhook-configurations.yaml ships it.
    let mut cmd = cluster.kubectl();
    cmd.args(["create", "-f", "-"]);
    let placeholder = support::run_with_stdin(
        cmd,
        &format!(
            "apiVersion: admissionregistration.k8s.io/v1\n\
             kind: ValidatingWebhookConfiguration\n\
             metadata:\n  name: {name}\n"
        ),
    );
    let with_placeholder = apply_as_user();
    let mut cmd = cluster.kubectl();
    cmd.args([
        "get",
        "validatingwebhookconfiguration",
        &name,
        "-o",
        "jsonpath={.metadata.labels.applied-by}",
    ]);
    let label = cmd.output().expect("kubectl runs");
    // Clean up before asserting (admin credentials).
    for kind in [
        "validatingwebhookconfiguration",
        "clusterrolebinding",
        "clusterrole",
    ] {
        let mut cmd = cluster.kubectl();
        cmd.args(["delete", kind, &name, "--ignore-not-found"]);
        run(cmd);
    }

    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !without_placeholder.status.success()
            && stderr(&without_placeholder).contains("cannot create resource"),
        "an apply that creates should need `create`: {:?} {}",
        without_placeholder.status,
        stderr(&without_placeholder)
    );
    assert!(placeholder.status.success(), "{}", stderr(&placeholder));
    assert!(
        with_placeholder.status.success(),
        "apply as {user} onto the placeholder with patch-only RBAC failed: {}",
        stderr(&with_placeholder)
    );
    assert_eq!(String::from_utf8_lossy(&label.stdout), "manager");
}
