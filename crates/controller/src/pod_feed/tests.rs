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

/// Where a test sends a watch's events.
type Sent = mpsc::UnboundedSender<Result<watcher::Event<ConfigMap>, watcher::Error>>;

/// A watch fed by hand: the sender of its events, the drive, and the watch sharing them.
fn by_hand() -> (Sent, impl Future<Output = ()>, SharedWatch<ConfigMap>) {
    let (tx, rx) = mpsc::unbounded();
    let (store, writer) = reflector::store();
    let (drive, shared) = SharedWatch::new(rx.reflect(writer), store);
    (tx, drive, shared)
}

/// The events a feed has received so far.
async fn received(feed: &mut Feed<ConfigMap>) -> Vec<String> {
    // The drive runs on its own task of this single-threaded runtime, and all it has to do is
    // already queued: each yield lets it take a step.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    let mut got = Vec::new();
    while let Ok(event) = feed.events.try_recv() {
        got.push(event);
    }
    names(got.iter().map(|e| &**e))
}

#[tokio::test]
async fn a_feed_asked_for_after_the_list_gets_the_store_as_a_list_then_each_event() {
    let (tx, drive, shared) = by_hand();
    let drive = tokio::spawn(drive);
    for event in events() {
        tx.unbounded_send(Ok(event)).expect("the drive runs");
    }
    // Nobody reads yet: the watch goes on (a standby's).
    let mut ready = shared.ready();
    tokio::time::timeout(std::time::Duration::from_secs(10), ready.wait_for(|r| *r))
        .await
        .expect("listed without a feed")
        .expect("the drive runs");

    let mut late = shared.feed();
    let mut got = received(&mut late).await;
    // The store's order is its own: only the objects' set is the store's.
    got[1..3].sort();
    assert_eq!(got, ["init", "init-apply b", "init-apply c", "init-done"]);
    tx.unbounded_send(Ok(watcher::Event::Apply(object("d"))))
        .expect("the drive runs");
    assert_eq!(received(&mut late).await, ["apply d"]);

    // The watch ends once its handle and every feed are gone.
    drop(shared);
    drop(late);
    tx.unbounded_send(Ok(watcher::Event::Apply(object("e"))))
        .expect("the drive runs until it sees nobody is left");
    tokio::time::timeout(std::time::Duration::from_secs(10), drive)
        .await
        .expect("the drive stops")
        .expect("join");
}

#[tokio::test]
async fn a_feed_asked_for_during_a_list_gets_it_once_the_list_is_done() {
    let (tx, drive, shared) = by_hand();
    let _drive = tokio::spawn(drive);
    let mut first = shared.feed();
    tx.unbounded_send(Ok(watcher::Event::Init)).expect("runs");
    tx.unbounded_send(Ok(watcher::Event::InitApply(object("a"))))
        .expect("runs");
    assert_eq!(received(&mut first).await, ["init", "init-apply a"]);

    let mut second = shared.feed();
    assert_eq!(received(&mut second).await, Vec::<String>::new());
    tx.unbounded_send(Ok(watcher::Event::InitApply(object("b"))))
        .expect("runs");
    tx.unbounded_send(Ok(watcher::Event::InitDone))
        .expect("runs");
    assert_eq!(received(&mut first).await, ["init-apply b", "init-done"]);
    let mut got = received(&mut second).await;
    got[1..3].sort();
    assert_eq!(got, ["init", "init-apply a", "init-apply b", "init-done"]);

    // A re-list later reaches both as it comes.
    tx.unbounded_send(Ok(watcher::Event::Init)).expect("runs");
    for feed in [&mut first, &mut second] {
        assert_eq!(received(feed).await, ["init"]);
    }
}

#[tokio::test]
async fn a_feed_dropped_during_its_replay_does_not_stop_the_watch() {
    let (tx, drive, shared) = by_hand();
    let _drive = tokio::spawn(drive);
    tx.unbounded_send(Ok(watcher::Event::Init)).expect("runs");
    for i in 0..BUFFER * 2 {
        tx.unbounded_send(Ok(watcher::Event::InitApply(object(&format!("o{i}")))))
            .expect("runs");
    }
    tx.unbounded_send(Ok(watcher::Event::InitDone))
        .expect("runs");
    let mut ready = shared.ready();
    tokio::time::timeout(std::time::Duration::from_secs(10), ready.wait_for(|r| *r))
        .await
        .expect("listed")
        .expect("runs");
    // More objects than a feed buffers: the replay waits on this feed, which goes.
    let abandoned = shared.feed();
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    drop(abandoned);
    let mut next = shared.feed();
    let consumed = async {
        let mut n = 0;
        while let Some(event) = next.events.next().await {
            n += 1;
            if matches!(*event, watcher::Event::InitDone) {
                return n;
            }
        }
        n
    };
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), consumed)
        .await
        .expect("the next feed gets its list");
    assert_eq!(n, BUFFER * 2 + 2);
}
