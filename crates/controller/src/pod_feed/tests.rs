use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::reflector::{ObjectRef, store::Writer};

use super::*;

fn object(name: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.into());
    c.metadata.namespace = Some("ns".into());
    c
}

fn events() -> Vec<watcher::Event<ConfigMap>> {
    vec![
        watcher::Event::Init,
        watcher::Event::InitApply(object("a")),
        watcher::Event::InitApply(object("b")),
        watcher::Event::InitDone,
        watcher::Event::Apply(object("c")),
        watcher::Event::Delete(object("a")),
    ]
}

fn names<'a>(events: impl IntoIterator<Item = &'a watcher::Event<ConfigMap>>) -> Vec<String> {
    events
        .into_iter()
        .map(|e| match e {
            watcher::Event::Init => "init".into(),
            watcher::Event::InitApply(o) => format!(
                "init-apply {}",
                o.metadata.name.as_deref().unwrap_or_default()
            ),
            watcher::Event::InitDone => "init-done".into(),
            watcher::Event::Apply(o) => {
                format!("apply {}", o.metadata.name.as_deref().unwrap_or_default())
            }
            watcher::Event::Delete(o) => {
                format!("delete {}", o.metadata.name.as_deref().unwrap_or_default())
            }
        })
        .collect()
}

/// The events reflected into a fresh store, as `watch_pods` does.
fn reflected(
    items: Vec<Result<watcher::Event<ConfigMap>, watcher::Error>>,
) -> (
    impl futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>>,
    Store<ConfigMap>,
) {
    let (store, writer): (Store<ConfigMap>, Writer<ConfigMap>) = reflector::store();
    (futures::stream::iter(items).reflect(writer), store)
}

#[tokio::test]
async fn every_consumer_gets_every_event_in_order_and_the_store_follows_them() {
    let (stream, store) = reflected(events().into_iter().map(Ok).collect());
    let (drive, feeds) = fan_out(stream, store, 2);
    drive.await;
    for mut feed in feeds {
        let mut got = Vec::new();
        while let Ok(event) = feed.events.try_recv() {
            got.push(event);
        }
        assert_eq!(names(got.iter().map(|e| &**e)), names(&events()));
        assert!(*feed.ready.borrow(), "ready after InitDone");
        let stored = |name: &str| feed.store.get(&ObjectRef::new(name).within("ns")).is_some();
        assert!(!stored("a") && stored("b") && stored("c"));
    }
}

#[tokio::test]
async fn not_ready_before_the_first_full_list() {
    let (stream, store) = reflected(vec![
        Ok(watcher::Event::Init),
        Ok(watcher::Event::InitApply(object("a"))),
    ]);
    let (drive, feeds) = fan_out(stream, store, 1);
    drive.await;
    assert!(!*feeds[0].ready.borrow());
}

#[tokio::test]
async fn a_watch_error_is_skipped_and_the_rest_still_arrives() {
    let error = watcher::Error::NoResourceVersion;
    let (stream, store) = reflected(vec![
        Ok(watcher::Event::Apply(object("a"))),
        Err(error),
        Ok(watcher::Event::Apply(object("b"))),
    ]);
    let (drive, mut feeds) = fan_out(stream, store, 1);
    drive.await;
    let mut got = Vec::new();
    while let Ok(event) = feeds[0].events.try_recv() {
        got.push(event);
    }
    assert_eq!(names(got.iter().map(|e| &**e)), ["apply a", "apply b"]);
}

#[tokio::test]
async fn a_stopped_consumer_does_not_hold_up_the_others() {
    let many: Vec<_> = (0..BUFFER * 3)
        .map(|i| Ok(watcher::Event::Apply(object(&format!("o{i}")))))
        .collect();
    let (stream, store) = reflected(many);
    let (drive, mut feeds) = fan_out(stream, store, 2);
    drop(feeds.remove(0));
    let mut survivor = feeds.remove(0);
    let consume = async move {
        let mut n = 0;
        while survivor.events.next().await.is_some() {
            n += 1;
        }
        n
    };
    let ((), n) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        futures::join!(drive, consume)
    })
    .await
    .expect("the drive does not wait for a dropped consumer");
    assert_eq!(n, BUFFER * 3);
}

#[tokio::test]
async fn a_consumer_whose_triggers_are_not_read_does_not_hold_up_the_others() {
    let many: Vec<_> = (0..BUFFER * 3)
        .map(|i| Ok(watcher::Event::Apply(object(&format!("o{i}")))))
        .collect();
    let (stream, store) = reflected(many);
    let (drive, mut feeds) = fan_out(stream, store, 2);
    // A controller backing off: it holds its triggers and reads none of them.
    let (_, _, held) = feeds.remove(0).into_triggers(|e| match e {
        watcher::Event::Apply(o) => vec![o.metadata.name.clone()],
        _ => Vec::new(),
    });
    let mut other = feeds.remove(0);
    let consume = async move {
        let mut n = 0;
        while other.events.next().await.is_some() {
            n += 1;
        }
        n
    };
    let ((), n) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        futures::join!(drive, consume)
    })
    .await
    .expect("the watch does not wait for a controller that is not reading");
    assert_eq!(n, BUFFER * 3);
    let queued = held.collect::<Vec<_>>().await;
    assert_eq!(queued.len(), BUFFER * 3, "every trigger is kept for later");
}

#[tokio::test]
async fn the_drive_ends_once_every_consumer_is_gone() {
    let endless = futures::stream::repeat_with(|| Ok(watcher::Event::Apply(object("a"))));
    let (store, writer) = reflector::store();
    let (drive, feeds) = fan_out(endless.reflect(writer), store, 2);
    drop(feeds);
    tokio::time::timeout(std::time::Duration::from_secs(10), drive)
        .await
        .expect("the drive stops");
}
