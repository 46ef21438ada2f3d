//! Events through the real apiserver: each distinct message is an Event of its own, a repeated
//! one the next of its series (kube's recorder alone would fold the second message into the
//! first's series and show only the first).

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kruise_rs_kube::events::Recorder;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Resource, ResourceExt};

use crate::support::{self, unique_name};

#[tokio::test]
async fn each_message_is_an_event_and_a_repeated_one_a_series() {
    let cluster = support::cluster().await;
    let client = cluster.client().await;
    let ns = cluster.namespace("events").await;
    let name = unique_name("regarding");
    let mut object = ConfigMap::default();
    object.metadata.name = Some(name.clone());
    let object = Api::<ConfigMap>::namespaced(client.clone(), ns.name())
        .create(&PostParams::default(), &object)
        .await
        .expect("a ConfigMap to publish events about");
    let regarding = object.object_ref(&());

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kruise-rs-tests".into(),
            instance: None,
        },
    );
    let event = |note: &str| Event {
        type_: EventType::Normal,
        reason: "PullImageSucceed".into(),
        note: Some(note.into()),
        action: "PullImage".into(),
        secondary: None,
    };
    for note in ["Image a:1 pulled", "Image b:2 pulled", "Image a:1 pulled"] {
        recorder
            .publish(&event(note), &regarding)
            .await
            .unwrap_or_else(|e| panic!("publishing {note:?}: {e}"));
    }

    let events = Api::<K8sEvent>::namespaced(client.clone(), ns.name())
        .list(&ListParams::default().fields(&format!("regarding.name={name}")))
        .await
        .expect("listing the events");
    let mut seen: Vec<(String, i32)> = events
        .items
        .iter()
        .map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count);
            (e.note.clone().unwrap_or_default(), count)
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("Image a:1 pulled".to_owned(), 2),
            ("Image b:2 pulled".to_owned(), 1)
        ],
        "events: {:?}",
        events
            .items
            .iter()
            .map(|e| e.name_any())
            .collect::<Vec<_>>()
    );
}
