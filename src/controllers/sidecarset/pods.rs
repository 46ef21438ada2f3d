//! The pods a SidecarSet owns, and what the upgrade decision reads of each ([`PodView`]).
//!
//! A SidecarSet owns a pod (upstream's `getMatchingPods`) when the pod's
//! `kruise.io/sidecarset-injected-list` names it, the SidecarSet's selector and namespace
//! selector match it, and every sidecar container of the SidecarSet is in the pod. Pods that
//! predate the SidecarSet were never injected and are not its to upgrade.
//!
//! Whether a sidecar container *runs its spec image* (upstream's `IsPodStateConsistent`):
//! - the pod must report as many container statuses as it has containers;
//! - when every sidecar image of the SidecarSet in the pod is pinned by digest, the status
//!   imageID must carry that digest;
//! - otherwise the `kruise.io/sidecarset-inplace-update-state` annotation records each upgraded
//!   container's imageID from before the upgrade: while the status still shows that imageID
//!   under another image name, kubelet has not restarted the container yet. Image names are
//!   compared normalized (`nginx:1.25` is `docker.io/library/nginx:1.25`, as the runtime
//!   reports it), so a new tag of the same image (same imageID) counts as running once kubelet
//!   reports it (upstream compares the raw strings: #1270).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, PodCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::strategy::{PodPhase, PodView, SidecarView};
use crate::apis::sidecarset::SidecarSet;
use crate::apis::well_known::{
    SIDECARSET_HASH, SIDECARSET_HASH_WITHOUT_IMAGE, SIDECARSET_INJECTED_LIST,
    SIDECARSET_INPLACE_UPDATE_STATE,
};
use crate::controllers::shared::pod_summary::{
    ContainerStatusSummary, ContainerSummary, PodSummary,
};
use crate::image::ImageRef;
use crate::sidecar::annotations::{parse_injected_list, pod_entry};
use crate::sidecar::gojson::html_escape_compact_json;
use crate::sidecar::matching::{pod_namespace, sidecarset_matches_pod};

/// Namespace name to labels, for namespace selectors.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// The labels of every namespace in `namespaces`.
pub fn namespace_labels<'a>(
    namespaces: impl IntoIterator<Item = &'a Namespace>,
) -> NamespaceLabels {
    namespaces
        .into_iter()
        .filter_map(|ns| {
            let name = ns.metadata.name.clone()?;
            Some((name, ns.metadata.labels.clone().unwrap_or_default()))
        })
        .collect()
}

/// Whether `pod` was injected with `set`.
pub fn injected_with(pod: &PodSummary, set: &str) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIDECARSET_INJECTED_LIST))
        .is_some_and(|list| list.split(',').any(|name| name == set))
}

/// The SidecarSets named in `pod`'s injected list.
pub fn injected_sidecarsets(pod: &PodSummary) -> Vec<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIDECARSET_INJECTED_LIST))
        .map(|list| parse_injected_list(list).into_iter().collect())
        .unwrap_or_default()
}

/// Whether `set` owns `pod`; see the module documentation. A selector that cannot be
/// evaluated owns nothing (validation keeps such SidecarSets out).
pub fn owns(set: &SidecarSet, pod: &PodSummary, namespaces: &NamespaceLabels) -> bool {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    if !injected_with(pod, name) {
        return false;
    }
    let empty = BTreeMap::new();
    let ns_labels = namespaces.get(pod_namespace(pod)).unwrap_or(&empty);
    if !sidecarset_matches_pod(set, pod, ns_labels).unwrap_or(false) {
        return false;
    }
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice());
    set.spec.containers.iter().all(|sidecar| {
        containers
            .unwrap_or_default()
            .iter()
            .any(|c| c.name == sidecar.container.name)
    })
}

/// One SidecarSet's record in `kruise.io/sidecarset-inplace-update-state` (upstream's
/// `InPlaceUpdateState`; fields in its JSON order, unknown ones kept).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InPlaceUpdateState {
    #[serde(default)]
    pub revision: String,
    #[serde(rename = "updateTimestamp", default)]
    pub update_timestamp: Option<Time>,
    /// Container name to its imageID before the upgrade.
    #[serde(rename = "lastContainerStatuses", default)]
    pub last_container_statuses: BTreeMap<String, LastContainerStatus>,
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LastContainerStatus {
    #[serde(rename = "imageID", default, skip_serializing_if = "String::is_empty")]
    pub image_id: String,
}

/// SidecarSet name to its record.
pub type InPlaceUpdateStates = BTreeMap<String, InPlaceUpdateState>;

/// Reads the in-place update state annotation; `None` when unreadable.
pub fn parse_update_states(value: &str) -> Option<InPlaceUpdateStates> {
    serde_json::from_str::<Option<InPlaceUpdateStates>>(value)
        .ok()
        .map(Option::unwrap_or_default)
}

/// Writes the in-place update state annotation as upstream's `json.Marshal` does.
pub fn render_update_states(states: &InPlaceUpdateStates) -> String {
    let json = serde_json::to_string(states).unwrap_or_else(|_| "{}".to_owned());
    html_escape_compact_json(&json)
}

/// Two image references name the same image (normalized; the raw strings when either does
/// not parse).
pub fn same_image(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (ImageRef::parse(a), ImageRef::parse(b)) {
        (Ok(a), Ok(b)) => a.to_pull_ref() == b.to_pull_ref(),
        _ => false,
    }
}

/// The digest an imageID carries (`repo@sha256:…`, `docker-pullable://repo@sha256:…`, or a
/// bare `sha256:…`).
fn image_id_digest(image_id: &str) -> &str {
    match image_id.rsplit_once('@') {
        Some((_, digest)) => digest,
        None => image_id,
    }
}

/// What the in-place update state says of one container.
enum Record<'a> {
    /// Its imageID before the last upgrade.
    ImageId(&'a str),
    /// Never upgraded in place.
    None,
    /// The annotation cannot be read. Upstream then calls the pod inconsistent until the next
    /// upgrade rewrites it, which can hold a rollout forever; we compare image names instead.
    Unreadable,
}

/// The container runs the image its spec names; see the module documentation.
fn runs_spec_image(
    container: &ContainerSummary,
    status: Option<&ContainerStatusSummary>,
    all_digests: bool,
    before_upgrade: Record<'_>,
) -> bool {
    let Some(status) = status else {
        return false;
    };
    let spec_image = container.image.as_deref().unwrap_or_default();
    if all_digests {
        let digest = ImageRef::parse(spec_image)
            .ok()
            .and_then(|r| r.digest().map(str::to_owned));
        return digest.is_some_and(|d| image_id_digest(&status.image_id) == d);
    }
    match before_upgrade {
        Record::ImageId(before) => {
            before != status.image_id || same_image(spec_image, &status.image)
        }
        Record::None => true,
        Record::Unreadable => same_image(spec_image, &status.image),
    }
}

fn pod_condition<'a>(pod: &'a PodSummary, type_: &str) -> Option<&'a PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn phase(pod: &PodSummary) -> PodPhase {
    match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some("Unknown") => PodPhase::Unknown,
        _ => PodPhase::Pending,
    }
}

/// What the upgrade decision needs to know about `pod` for `set`.
pub fn view<'a>(set: &SidecarSet, pod: &'a PodSummary) -> PodView<'a> {
    let name = set.metadata.name.as_deref().unwrap_or_default();
    let annotations = pod.metadata.annotations.as_ref();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or_default();
    let all_reported = statuses.len() == containers.len();
    let sidecar_containers: Vec<&ContainerSummary> = set
        .spec
        .containers
        .iter()
        .filter_map(|s| containers.iter().find(|c| c.name == s.container.name))
        .collect();
    let all_digests = sidecar_containers.iter().all(|c| {
        ImageRef::parse(c.image.as_deref().unwrap_or_default()).is_ok_and(|r| r.digest().is_some())
    });
    let states = annotations
        .and_then(|a| a.get(SIDECARSET_INPLACE_UPDATE_STATE))
        .map(|v| parse_update_states(v));
    let before = |container: &str| -> Record {
        match &states {
            Some(None) => Record::Unreadable,
            Some(Some(states)) => states
                .get(name)
                .and_then(|s| s.last_container_statuses.get(container))
                .filter(|s| !s.image_id.is_empty())
                .map_or(Record::None, |s| Record::ImageId(&s.image_id)),
            None => Record::None,
        }
    };
    let sidecars = sidecar_containers
        .iter()
        .map(|c| {
            let status = statuses.iter().find(|s| s.name == c.name);
            SidecarView {
                name: c.name.clone(),
                ready: status.is_some_and(|s| s.ready),
                image_running: all_reported
                    && runs_spec_image(c, status, all_digests, before(&c.name)),
            }
        })
        .collect();
    let ready_condition = pod_condition(pod, "Ready");
    let phase = phase(pod);
    PodView {
        namespace: Cow::Borrowed(pod.metadata.namespace.as_deref().unwrap_or_default()),
        name: Cow::Borrowed(pod.metadata.name.as_deref().unwrap_or_default()),
        labels: match &pod.metadata.labels {
            Some(labels) => Cow::Borrowed(labels),
            None => Cow::Owned(BTreeMap::new()),
        },
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        phase,
        ready: phase == PodPhase::Running && ready_condition.is_some_and(|c| c.status == "True"),
        ready_since: ready_condition
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0),
        restarts: statuses.iter().map(|s| s.restart_count).max().unwrap_or(0),
        created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        hash: pod_entry(annotations, SIDECARSET_HASH, name).map(|e| e.hash),
        hash_without_image: pod_entry(annotations, SIDECARSET_HASH_WITHOUT_IMAGE, name)
            .map(|e| e.hash),
        sidecars,
        // Decided later, from the pre-download state of the pod's node.
        awaiting_images: false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::apis::sidecarset::SidecarSetSpec;
    use crate::controllers::shared::pod_summary::strip_pod;

    fn set(image: &str) -> SidecarSet {
        let spec: SidecarSetSpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "web"}},
            "containers": [{"name": "proxy", "image": image}],
        }))
        .expect("spec");
        SidecarSet::new("mesh", spec)
    }

    /// A running, ready pod injected with `mesh`, its proxy on `image` reported as `image_id`.
    fn pod(image: &str, status_image: &str, image_id: &str) -> PodSummary {
        serde_json::from_value(json!({
            "metadata": {
                "name": "web-0", "namespace": "shop", "labels": {"app": "web"},
                "annotations": {
                    SIDECARSET_INJECTED_LIST: "logs,mesh",
                    SIDECARSET_HASH: r#"{"mesh":{"updateTimestamp":null,"hash":"h1","sidecarSetName":"mesh","sidecarList":["proxy"]}}"#,
                    SIDECARSET_HASH_WITHOUT_IMAGE: r#"{"mesh":{"updateTimestamp":null,"hash":"w1","sidecarSetName":"mesh","sidecarList":["proxy"]}}"#,
                    "kubectl.kubernetes.io/last-applied-configuration": "{…}",
                }
            },
            "spec": {
                "nodeName": "node-1",
                "containers": [
                    {"name": "proxy", "image": image, "env": [{"name": "A", "value": "b"}]},
                    {"name": "app", "image": "shop:1"},
                ]
            },
            "status": {
                "phase": "Running",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:00:00Z"},
                    {"type": "PodScheduled", "status": "True"},
                ],
                "containerStatuses": [
                    {"name": "proxy", "image": status_image, "imageID": image_id, "ready": true, "restartCount": 2},
                    {"name": "app", "image": "shop:1", "imageID": "shop@sha256:aa", "ready": true, "restartCount": 0},
                ]
            }
        }))
        .expect("pod")
    }

    fn with_state(mut pod: PodSummary, state: &str) -> PodSummary {
        pod.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(SIDECARSET_INPLACE_UPDATE_STATE.to_owned(), state.to_owned());
        pod
    }

    const RECORD: &str = r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T11:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"docker.io/library/proxy@sha256:old"}}}}"#;

    #[test]
    fn the_view_reads_hashes_readiness_and_order_fields() {
        let p = pod("proxy:1", "proxy:1", "proxy@sha256:11");
        let v = view(&set("proxy:1"), &p);
        assert_eq!(v.key(), "shop/web-0");
        assert_eq!(v.hash.as_deref(), Some("h1"));
        assert_eq!(v.hash_without_image.as_deref(), Some("w1"));
        assert!(v.ready);
        assert_eq!(v.phase, PodPhase::Running);
        assert_eq!(v.restarts, 2);
        assert_eq!(v.node_name.as_deref(), Some("node-1"));
        assert_eq!(
            v.ready_since,
            Some("2026-11-29T10:00:00Z".parse().expect("time"))
        );
        assert_eq!(
            v.sidecars,
            [SidecarView {
                name: "proxy".into(),
                ready: true,
                image_running: true
            }]
        );
    }

    #[test]
    fn a_pod_is_ready_only_when_running_with_the_ready_condition() {
        let mut p = pod("proxy:1", "proxy:1", "id");
        p.status.as_mut().expect("status").phase = Some("Pending".into());
        assert!(!view(&set("proxy:1"), &p).ready);
        let mut p = pod("proxy:1", "proxy:1", "id");
        p.status
            .as_mut()
            .expect("status")
            .conditions
            .as_mut()
            .expect("c")[0]
            .status = "False".into();
        assert!(!view(&set("proxy:1"), &p).ready);
    }

    #[test]
    fn after_an_upgrade_the_sidecar_runs_its_image_once_the_image_id_changes() {
        let s = set("proxy:2");
        // kubelet has not restarted it: same imageID, old image name.
        let waiting = with_state(
            pod(
                "proxy:2",
                "docker.io/library/proxy:1",
                "docker.io/library/proxy@sha256:old",
            ),
            RECORD,
        );
        assert!(!view(&s, &waiting).sidecars[0].image_running);
        // Restarted on the new image.
        let done = with_state(
            pod(
                "proxy:2",
                "docker.io/library/proxy:2",
                "docker.io/library/proxy@sha256:new",
            ),
            RECORD,
        );
        assert!(view(&s, &done).sidecars[0].image_running);
    }

    #[test]
    fn a_new_tag_of_the_same_image_counts_once_kubelet_reports_the_new_name() {
        // #1270: the new tag has the old imageID; the runtime reports the name normalized.
        let retagged = with_state(
            pod(
                "proxy:2",
                "docker.io/library/proxy:2",
                "docker.io/library/proxy@sha256:old",
            ),
            RECORD,
        );
        assert!(view(&set("proxy:2"), &retagged).sidecars[0].image_running);
    }

    #[test]
    fn without_a_record_the_sidecar_counts_as_running() {
        let p = pod("proxy:2", "something-else", "x@sha256:zz");
        assert!(view(&set("proxy:2"), &p).sidecars[0].image_running);
    }

    #[test]
    fn an_unreadable_record_falls_back_to_the_image_names() {
        let p = with_state(pod("proxy:2", "proxy:1", "x@sha256:zz"), "{oops");
        assert!(!view(&set("proxy:2"), &p).sidecars[0].image_running);
        let p = with_state(
            pod("proxy:2", "docker.io/library/proxy:2", "x@sha256:zz"),
            "{oops",
        );
        assert!(view(&set("proxy:2"), &p).sidecars[0].image_running);
    }

    #[test]
    fn missing_container_statuses_mean_not_running() {
        let mut p = pod("proxy:1", "proxy:1", "id");
        p.status
            .as_mut()
            .expect("status")
            .container_statuses
            .as_mut()
            .expect("statuses")
            .pop();
        assert!(!view(&set("proxy:1"), &p).sidecars[0].image_running);
    }

    #[test]
    fn digest_pinned_sidecars_compare_the_digest() {
        let d = "sha256:0123456789012345678901234567890123456789012345678901234567890123";
        let image = format!("proxy@{d}");
        let s = set(&image);
        let running = pod(
            &image,
            "proxy:whatever",
            &format!("docker.io/library/proxy@{d}"),
        );
        assert!(view(&s, &running).sidecars[0].image_running);
        let other = pod(&image, &image, "docker.io/library/proxy@sha256:other");
        assert!(!view(&s, &other).sidecars[0].image_running);
    }

    #[test]
    fn ownership_needs_the_injected_list_the_selector_and_every_sidecar() {
        let s = set("proxy:1");
        let namespaces = NamespaceLabels::new();
        assert!(owns(&s, &pod("proxy:1", "proxy:1", "id"), &namespaces));

        let mut not_listed = pod("proxy:1", "proxy:1", "id");
        not_listed
            .metadata
            .annotations
            .as_mut()
            .expect("annotations")
            .insert(SIDECARSET_INJECTED_LIST.into(), "mesh-v2".into());
        assert!(!owns(&s, &not_listed, &namespaces));

        let mut relabelled = pod("proxy:1", "proxy:1", "id");
        relabelled.metadata.labels = Some([("app".into(), "db".into())].into());
        assert!(!owns(&s, &relabelled, &namespaces));

        let mut missing = pod("proxy:1", "proxy:1", "id");
        missing.spec.as_mut().expect("spec").containers.remove(0);
        assert!(!owns(&s, &missing, &namespaces));
    }

    #[test]
    fn ownership_follows_the_namespace_selector() {
        let mut s = set("proxy:1");
        s.spec.namespace_selector =
            serde_json::from_value(json!({"matchLabels": {"mesh": "on"}})).expect("selector");
        let p = pod("proxy:1", "proxy:1", "id");
        let mut namespaces = NamespaceLabels::new();
        namespaces.insert("shop".into(), [("mesh".into(), "off".into())].into());
        assert!(!owns(&s, &p, &namespaces));
        namespaces.insert("shop".into(), [("mesh".into(), "on".into())].into());
        assert!(owns(&s, &p, &namespaces));
    }

    #[test]
    fn stripping_keeps_what_decisions_read_and_drops_other_annotations() {
        let mut p = with_state(pod("proxy:1", "proxy:1", "id"), RECORD);
        let unstripped = p.clone();
        let before = view(&set("proxy:1"), &unstripped);
        strip_pod(&mut p);
        assert_eq!(view(&set("proxy:1"), &p), before);
        let annotations = p.metadata.annotations.as_ref().expect("annotations");
        assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        assert!(annotations.contains_key(SIDECARSET_INJECTED_LIST));
        let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
        assert_eq!(conditions.map(Vec::len), Some(1), "only Ready is kept");
    }

    #[test]
    fn update_states_round_trip_in_upstream_order_and_keep_unknown_fields() {
        let text = r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T11:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"a<b"}},"updateImages":true}}"#;
        let states = parse_update_states(text).expect("readable");
        assert_eq!(
            render_update_states(&states),
            r#"{"mesh":{"revision":"h2","updateTimestamp":"2026-11-29T11:00:00Z","lastContainerStatuses":{"proxy":{"imageID":"a\u003cb"}},"updateImages":true}}"#
        );
        assert_eq!(
            parse_update_states("null"),
            Some(InPlaceUpdateStates::new())
        );
        assert_eq!(parse_update_states("[1]"), None);
    }

    #[test]
    fn injected_lists_are_read_by_name_not_substring() {
        let p = pod("proxy:1", "proxy:1", "id");
        assert!(injected_with(&p, "mesh"));
        assert!(!injected_with(&p, "mes"));
        assert_eq!(injected_sidecarsets(&p), ["logs", "mesh"]);
    }
}
