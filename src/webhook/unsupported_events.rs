//! The Warning events the pod webhook records when it admits a pod without a SidecarSet that
//! uses a feature kruise-rs does not serve ([`kruise_rs_sidecar::unsupported`]).
//!
//! The pod does not exist yet at admission (no uid), so the event is about the SidecarSet
//! (cluster-scoped: it lands in namespace `default`) and names the pod's namespace and name or
//! `generateName`. A Deployment of 1,000 pods must not write 1,000 events: `Throttle` lets
//! one event per SidecarSet and feature through per `WINDOW`, in memory, and the next one
//! says how many pods went unreported since.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Event, EventType};

use kruise_rs_sidecar::unsupported::Found;

/// At most one event per SidecarSet and feature this often.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// An entry unused this long is dropped (with its count of unreported pods).
const FORGET: Duration = Duration::from_secs(10 * 60);

/// Event reason.
pub(crate) const REASON: &str = "UnsupportedFeature";

/// Which (SidecarSet, feature) events may be published now; the clock is passed in.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    last: HashMap<(String, &'static str), Entry>,
}

#[derive(Debug)]
struct Entry {
    /// When the last event was let through.
    published: Instant,
    /// Pods since then that got no event.
    unreported: u64,
}

impl Throttle {
    /// `Some(n)` when an event about `sidecarset` and `feature` may be published at `now`, `n`
    /// being the pods left unreported since the previous one; `None` (and the pod counted)
    /// when one was published less than [`WINDOW`] ago.
    pub(crate) fn admit(
        &mut self,
        sidecarset: &str,
        feature: &'static str,
        now: Instant,
    ) -> Option<u64> {
        self.last
            .retain(|_, e| now.saturating_duration_since(e.published) < FORGET);
        match self.last.get_mut(&(sidecarset.to_owned(), feature)) {
            Some(e) if now.saturating_duration_since(e.published) < WINDOW => {
                e.unreported += 1;
                None
            }
            Some(e) => {
                let unreported = e.unreported;
                *e = Entry {
                    published: now,
                    unreported: 0,
                };
                Some(unreported)
            }
            None => {
                self.last.insert(
                    (sidecarset.to_owned(), feature),
                    Entry {
                        published: now,
                        unreported: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// `namespace/name` of a pod being created, or `namespace/generateName*` before it has a name.
pub(crate) fn pod_key(pod: &Pod) -> String {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(name), _) if !name.is_empty() => format!("{namespace}/{name}"),
        (_, Some(prefix)) => format!("{namespace}/{prefix}*"),
        _ => format!("{namespace}/"),
    }
}

/// The Warning event for `pod` admitted without a SidecarSet because of `found`.
pub(crate) fn event(found: &Found, pod: &str, unreported: u64) -> Event {
    let mut note = format!(
        "pod {pod} was admitted without this SidecarSet: {found} (annotate the SidecarSet {}=refuse to refuse such pods instead)",
        kruise_rs_sidecar::unsupported::UNSUPPORTED_FEATURES
    );
    if unreported > 0 {
        note.push_str(&format!(
            "; {unreported} more pod(s) were admitted without it since the previous event"
        ));
    }
    Event {
        type_: EventType::Warning,
        reason: REASON.into(),
        note: Some(note),
        action: "Inject".into(),
        secondary: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_event_per_sidecarset_and_feature_per_window() {
        let t0 = Instant::now();
        let mut throttle = Throttle::default();
        assert_eq!(throttle.admit("s", "HotUpgrade", t0), Some(0));
        for i in 1..1000 {
            let at = t0 + Duration::from_millis(i * 50);
            assert_eq!(throttle.admit("s", "HotUpgrade", at), None, "pod {i}");
        }
        // Another SidecarSet or feature is counted apart.
        assert_eq!(throttle.admit("t", "HotUpgrade", t0), Some(0));
        assert_eq!(throttle.admit("s", "ResourcesPolicy", t0), Some(0));
        // After the window, the next event reports the pods that got none.
        assert_eq!(throttle.admit("s", "HotUpgrade", t0 + WINDOW), Some(999));
        assert_eq!(throttle.admit("s", "HotUpgrade", t0 + WINDOW), None);
    }

    #[test]
    fn entries_unused_for_long_are_forgotten() {
        let t0 = Instant::now();
        let mut throttle = Throttle::default();
        for i in 0..100 {
            throttle.admit(&format!("s{i}"), "HotUpgrade", t0);
        }
        throttle.admit("s0", "HotUpgrade", t0 + Duration::from_secs(1));
        assert_eq!(throttle.last.len(), 100);
        assert_eq!(throttle.admit("x", "HotUpgrade", t0 + FORGET), Some(0));
        assert_eq!(throttle.last.len(), 1, "only x is left");
    }

    #[test]
    fn a_clock_going_backwards_does_not_panic() {
        let t0 = Instant::now() + Duration::from_secs(3600);
        let mut throttle = Throttle::default();
        assert_eq!(throttle.admit("s", "HotUpgrade", t0), Some(0));
        assert_eq!(throttle.admit("s", "HotUpgrade", t0 - WINDOW), None);
    }

    #[test]
    fn the_event_names_the_pod_the_feature_and_the_unreported_pods() {
        let found = Found {
            feature: "HotUpgrade",
            field: "upgradeStrategy.upgradeType HotUpgrade",
            problem: "which kruise-rs does not support yet",
            containers: vec!["hot".into()],
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "generateName": "web-5d8-"}
        }))
        .expect("pod");
        let e = event(&found, &pod_key(&pod), 0);
        assert_eq!(e.type_, EventType::Warning);
        let note = e.note.expect("note");
        assert!(note.starts_with("pod ns/web-5d8-* was admitted without this SidecarSet: container hot uses upgradeStrategy.upgradeType HotUpgrade"), "{note}");
        assert!(!note.contains("more pod"), "{note}");
        let note = event(&found, "ns/p", 7).note.expect("note");
        assert!(
            note.ends_with("; 7 more pod(s) were admitted without it since the previous event"),
            "{note}"
        );
    }
}
