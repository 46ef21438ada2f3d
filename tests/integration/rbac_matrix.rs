//! The RBAC matrix: every verb on every resource the manager and the daemon hold, each with the
//! reason it is there, compared with what the apiserver says their service accounts may do
//! (`kubectl auth can-i --list`, a SelfSubjectRulesReview under impersonation) once
//! `deploy/manifests/` RBAC is applied. Exact equality: a rule added to the chart without a row
//! here (a widening) fails, and so does a row the chart no longer grants.
//!
//! What every service account may do anyway (discovery, self reviews, `/healthz`, ...) differs
//! between Kubernetes versions; it is read from an account with no bindings at all in the same
//! run and left out of both sides.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::deploy::{apply, manifest_objects};
use crate::support::{self, TestCluster};

const MANAGER_SA: &str = "system:serviceaccount:kruise-system:kruise-rs-manager";
const DAEMON_SA: &str = "system:serviceaccount:kruise-system:kruise-rs-daemon";
/// Bound to nothing: what any service account may do.
const BASELINE_SA: &str = "system:serviceaccount:default:kruise-rs-rbac-baseline";
/// RBAC changes reach the authorizer through informers: allow them this long to show.
const RBAC_PROPAGATION: Duration = Duration::from_secs(30);

/// Where a grant applies.
#[derive(Clone, Copy, PartialEq)]
enum Scope {
    /// A ClusterRole: every namespace, and cluster-scoped resources.
    Cluster,
    /// A Role in this namespace.
    In(&'static str),
}

/// One row of the matrix: `verbs` on `resource` (`plural[.group][/subresource]`, as `kubectl
/// auth can-i --list` names it), limited to `names` when not empty.
struct Grant {
    scope: Scope,
    resource: &'static str,
    names: &'static [&'static str],
    verbs: &'static [&'static str],
    why: &'static str,
}

const fn grant(
    scope: Scope,
    resource: &'static str,
    verbs: &'static [&'static str],
    why: &'static str,
) -> Grant {
    named(scope, resource, &[], verbs, why)
}

const fn named(
    scope: Scope,
    resource: &'static str,
    names: &'static [&'static str],
    verbs: &'static [&'static str],
    why: &'static str,
) -> Grant {
    Grant {
        scope,
        resource,
        names,
        verbs,
        why,
    }
}

use Scope::{Cluster, In};

const SYSTEM: Scope = In("kruise-system");
const DAEMON_CONFIG: Scope = In("kruise-daemon-config");
const WATCH: &[&str] = &["get", "list", "watch"];
const OWN: &[&str] = &["get", "list", "watch", "create", "patch", "delete"];
const RECORD: &[&str] = &["create", "patch"];

// One row per rule, so the matrix reads as a table.
#[rustfmt::skip]
const MANAGER: &[Grant] = &[
    grant(Cluster, "sidecarsets.apps.kruise.io", WATCH,
        "the SidecarSet controller and the pod webhook's cache watch every SidecarSet"),
    grant(Cluster, "sidecarsets.apps.kruise.io/status", &["patch"],
        "the SidecarSet controller writes status (server-side apply)"),
    grant(Cluster, "sidecarsets.apps.kruise.io/finalizers", &["update"],
        "ControllerRevisions and pre-download ImagePullJobs carry a blocking ownerReference to \
         their SidecarSet, which OwnerReferencesPermissionEnforcement allows only to who may \
         update its finalizers"),
    grant(Cluster, "imagepulljobs.apps.kruise.io", OWN,
        "the ImagePullJob controller (TTL deletion) and SidecarSet pre-download (creates, \
         patches and deletes its own jobs in the pods' namespaces); NodeImage GC reads jobs"),
    grant(Cluster, "imagepulljobs.apps.kruise.io/status", &["patch"],
        "the ImagePullJob controller writes status"),
    grant(Cluster, "imagelistpulljobs.apps.kruise.io", &["get", "list", "watch", "patch", "delete"],
        "the ImageListPullJob controller labels lists with their template hash and deletes \
         them when ttlSecondsAfterFinished passes; it creates and deletes their ImagePullJobs \
         under the imagepulljobs grant"),
    grant(Cluster, "imagelistpulljobs.apps.kruise.io/status", &["patch"],
        "the ImageListPullJob controller writes status"),
    grant(Cluster, "imagelistpulljobs.apps.kruise.io/finalizers", &["update"],
        "the ImagePullJobs of a list carry a blocking ownerReference to it, which \
         OwnerReferencesPermissionEnforcement allows only to who may update its finalizers"),
    grant(Cluster, "nodeimages.apps.kruise.io", OWN,
        "one NodeImage per Node (created, deleted with it); job work written into spec"),
    grant(Cluster, "nodeimages.apps.kruise.io/status", &["patch"],
        "tag GC removes finished tags from status"),
    grant(Cluster, "pods", &["get", "list", "watch", "patch"],
        "SidecarSet and ImagePullJob podSelector watch pods; the in-place upgrade patches \
         sidecar images; patchPodMetadata reads the live pod first"),
    grant(Cluster, "pods/status", &["patch"],
        "the in-place upgrade sets the InPlaceUpdateReady condition"),
    grant(Cluster, "pods/resize", &["patch"],
        "a SidecarSet change of a sidecar's resources resizes running pods in place"),
    grant(Cluster, "nodes", WATCH, "NodeImages follow Nodes; job node selection"),
    grant(Cluster, "namespaces", WATCH,
        "SidecarSet namespaceSelector, in the controller and the pod webhook"),
    grant(Cluster, "secrets", &["get"],
        "ImagePullJob pullSecrets are read by name in the job's namespace to be copied for the \
         daemons (the webhook first checks that the job's author may read them)"),
    grant(Cluster, "subjectaccessreviews.authorization.k8s.io", &["create"],
        "the ImagePullJob and SidecarSet webhooks ask whether the author may read the pull \
         secrets they name"),
    named(Cluster, "customresourcedefinitions.apiextensions.k8s.io",
        &["imagelistpulljobs.apps.kruise.io", "imagepulljobs.apps.kruise.io",
          "nodeimages.apps.kruise.io", "sidecarsets.apps.kruise.io"],
        &["get"], "startup check that the four CRDs are installed and Established"),
    named(Cluster, "mutatingwebhookconfigurations.admissionregistration.k8s.io",
        &["kruise-rs-mutating-webhook-configuration"], &["patch"],
        "the manager applies its webhook rules and caBundle to the shipped placeholder"),
    named(Cluster, "validatingwebhookconfigurations.admissionregistration.k8s.io",
        &["kruise-rs-validating-webhook-configuration"], &["patch"],
        "the same, for the validating configuration"),
    grant(Cluster, "events", RECORD,
        "events on SidecarSets, ImagePullJobs, ImageListPullJobs and NodeImages (core API)"),
    grant(Cluster, "events.events.k8s.io", RECORD, "the same, events.k8s.io API"),
    grant(SYSTEM, "secrets", &["create"],
        "self-managed webhook certificates: the first manager creates the Secret \
         (create cannot be limited by name)"),
    named(SYSTEM, "secrets", &["kruise-rs-webhook-certs"], &["get", "list", "watch", "update"],
        "self-managed webhook certificates: read, watched by name, renewed"),
    named(SYSTEM, "configmaps", &["kruise-configuration"], &["get"],
        "the patchPodMetadata whitelist the SidecarSet webhook enforces"),
    grant(SYSTEM, "controllerrevisions.apps", OWN, "SidecarSet revision history"),
    grant(SYSTEM, "pods", &["create"],
        "the SidecarSet webhook dry-runs (dryRun=All, never stored) a pod holding the \
         SidecarSet's containers for Kubernetes' pod validation; RBAC counts a dry-run create \
         as a create; this namespace skips the pod webhook; the ValidatingAdmissionPolicy \
         refuses the manager any create that is not a dry run (decision 0012)"),
    grant(SYSTEM, "leases.coordination.k8s.io", &["create"],
        "leader election: the Lease is created once (create cannot be limited by name)"),
    named(SYSTEM, "leases.coordination.k8s.io", &["kruise-rs-manager"], &["get", "update"],
        "leader election: acquire, renew, release, guarded by resourceVersion"),
    grant(DAEMON_CONFIG, "secrets", &["get", "list", "create", "update", "delete"],
        "the copies of job pull secrets the daemons read; list finds a source's copies \
         whatever their name (copies named before the SHA-256 names) to release them"),
];

#[rustfmt::skip]
const DAEMON: &[Grant] = &[
    grant(Cluster, "nodeimages.apps.kruise.io", WATCH,
        "the daemon watches its own NodeImage (a field selector; RBAC cannot say which one)"),
    grant(Cluster, "nodeimages.apps.kruise.io/status", &["patch"],
        "pull results; the ValidatingAdmissionPolicy limits each daemon to its own node's"),
    grant(Cluster, "events", RECORD, "events on its NodeImage (core API)"),
    grant(Cluster, "events.events.k8s.io", RECORD, "the same, events.k8s.io API"),
    grant(DAEMON_CONFIG, "secrets", &["get"],
        "pull secrets by the name its NodeImage gives: no list, no watch"),
];

/// `verb resource[ [name]]` for every access `grant` gives.
fn accesses(grant: &Grant) -> Vec<String> {
    let names: &[&str] = if grant.names.is_empty() {
        &[""]
    } else {
        grant.names
    };
    let verbs = grant.verbs.iter();
    verbs
        .flat_map(|verb| names.iter().map(|name| access(verb, grant.resource, name)))
        .collect()
}

/// The rows that apply in `namespace`.
fn applying<'a>(grants: &'a [Grant], namespace: &str) -> impl Iterator<Item = &'a Grant> {
    grants.iter().filter(move |g| match g.scope {
        Cluster => true,
        In(ns) => ns == namespace,
    })
}

/// Every access the rows give in `namespace`.
fn expected(grants: &[Grant], namespace: &str) -> BTreeSet<String> {
    applying(grants, namespace).flat_map(accesses).collect()
}

fn access(verb: &str, resource: &str, name: &str) -> String {
    if name.is_empty() {
        format!("{verb} {resource}")
    } else {
        format!("{verb} {resource} [{name}]")
    }
}

/// `[a b c]` → `["a", "b", "c"]`.
fn bracketed(cell: &str) -> Vec<String> {
    cell.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Every access in `kubectl auth can-i --list` output, one per verb, resource name and URL.
fn parse_can_i_list(table: &str) -> BTreeSet<String> {
    let mut lines = table.lines();
    let header = lines.next().expect("a header line");
    let column = |title: &str| {
        header
            .find(title)
            .unwrap_or_else(|| panic!("no {title:?} column in {header:?}"))
    };
    let (urls_at, names_at, verbs_at) = (
        column("Non-Resource URLs"),
        column("Resource Names"),
        column("Verbs"),
    );
    let mut out = BTreeSet::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let cell = |from: usize, to: usize| line.get(from..to.min(line.len())).unwrap_or("");
        let resource = cell(0, urls_at).trim();
        let urls = bracketed(cell(urls_at, names_at));
        let names = bracketed(cell(names_at, verbs_at));
        let verbs = bracketed(cell(verbs_at, line.len()));
        for verb in &verbs {
            if resource.is_empty() {
                out.extend(urls.iter().map(|url| format!("{verb} url {url}")));
            } else if names.is_empty() {
                out.insert(access(verb, resource, ""));
            } else {
                out.extend(names.iter().map(|name| access(verb, resource, name)));
            }
        }
    }
    out
}

fn can_i_list(cluster: &TestCluster, user: &str, namespace: &str) -> BTreeSet<String> {
    let mut cmd = cluster.kubectl();
    cmd.args(["auth", "can-i", "--list", "--as", user, "-n", namespace]);
    let out = cmd.output().expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl auth can-i --list as {user} in {namespace}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_can_i_list(&String::from_utf8_lossy(&out.stdout))
}

/// The namespaces worth asking about: `default` (cluster-wide rules only) and every namespace
/// the manifests put a Role or RoleBinding in.
fn namespaces() -> BTreeSet<String> {
    let mut out = BTreeSet::from(["default".to_owned()]);
    for object in manifest_objects() {
        if object["kind"] == "Role" || object["kind"] == "RoleBinding" {
            let ns = object["metadata"]["namespace"].as_str().expect("namespace");
            out.insert(ns.to_owned());
        }
    }
    out
}

/// The differences between what `user` may do beyond any service account and `grants`, in
/// every namespace; empty when they agree.
fn differences(cluster: &TestCluster, user: &str, grants: &[Grant]) -> Vec<String> {
    let mut wrong = Vec::new();
    for ns in namespaces() {
        let baseline = can_i_list(cluster, BASELINE_SA, &ns);
        let actual: BTreeSet<String> = can_i_list(cluster, user, &ns)
            .difference(&baseline)
            .cloned()
            .collect();
        let want = expected(grants, &ns);
        for extra in actual.difference(&want) {
            wrong.push(format!(
                "in {ns}: may {extra}, which no row of the matrix grants"
            ));
        }
        for missing in want.difference(&actual) {
            let why = applying(grants, &ns)
                .find(|g| accesses(g).contains(missing))
                .map_or("", |g| g.why);
            wrong.push(format!("in {ns}: may not {missing}, needed for: {why}"));
        }
    }
    wrong
}

async fn assert_matrix(cluster: &TestCluster, user: &str, grants: &[Grant]) {
    let deadline = tokio::time::Instant::now() + RBAC_PROPAGATION;
    loop {
        let wrong = differences(cluster, user, grants);
        if wrong.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{user}'s RBAC differs from the matrix in tests/integration/rbac_matrix.rs \
             (after {RBAC_PROPAGATION:?}):\n{}",
            wrong.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn rbac_matrix_manager_holds_exactly_its_rows() {
    let cluster = support::cluster().await;
    apply(
        cluster,
        &[
            "00-namespaces.yaml",
            "02-serviceaccounts.yaml",
            "03-rbac-manager.yaml",
        ],
    );
    assert_matrix(cluster, MANAGER_SA, MANAGER).await;
}

#[tokio::test]
async fn rbac_matrix_daemon_holds_exactly_its_rows() {
    let cluster = support::cluster().await;
    apply(
        cluster,
        &[
            "00-namespaces.yaml",
            "02-serviceaccounts.yaml",
            "04-rbac-daemon.yaml",
        ],
    );
    assert_matrix(cluster, DAEMON_SA, DAEMON).await;
}

#[test]
fn can_i_list_tables_are_read_cell_by_cell() {
    let table = "\
Resources   Non-Resource URLs   Resource Names   Verbs
secrets     []                  []               [get create]
leases.x    []                  [a b]            [get]
            [/api /api/*]       []               [get]
";
    assert_eq!(
        parse_can_i_list(table),
        BTreeSet::from([
            "get secrets".to_owned(),
            "create secrets".to_owned(),
            "get leases.x [a]".to_owned(),
            "get leases.x [b]".to_owned(),
            "get url /api".to_owned(),
            "get url /api/*".to_owned(),
        ])
    );
}

#[test]
fn every_row_says_why() {
    for grant in MANAGER.iter().chain(DAEMON) {
        assert!(grant.why.len() > 10, "{} needs its reason", grant.resource);
        assert!(!grant.verbs.is_empty(), "{} grants no verb", grant.resource);
    }
}
