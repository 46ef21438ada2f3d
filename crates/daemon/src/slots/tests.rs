use std::sync::Arc;

use super::*;

/// Spawns a waiter for `share` that records its name in `order` once it has a slot, and keeps
/// the slot until `hold` is notified.
fn waiter(
    slots: &Arc<FairSlots>,
    share: &'static str,
    name: &'static str,
    order: &Arc<Mutex<Vec<&'static str>>>,
) -> tokio::task::JoinHandle<bool> {
    let (slots, order) = (slots.clone(), order.clone());
    tokio::spawn(async move {
        let granted = slots.acquire(share).await;
        if granted {
            order.lock().unwrap().push(name);
        }
        granted
    })
}

/// Lets the spawned tasks run until they are all parked.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_free_slot_is_taken_at_once() {
    let slots = FairSlots::new(2);
    assert!(slots.acquire("a").await);
    assert!(slots.acquire("a").await);
    assert_eq!(slots.available(), 0);
    slots.release();
    assert_eq!(slots.available(), 1);
}

#[tokio::test]
async fn a_freed_slot_goes_to_the_next_tenant_not_the_next_in_line() {
    // Tenant a holds the only slot and has three more tags queued before tenant b's one.
    let slots = Arc::new(FairSlots::new(1));
    assert!(slots.acquire("a").await);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (share, name) in [("a", "a2"), ("a", "a3"), ("a", "a4"), ("b", "b1")] {
        tasks.push(waiter(&slots, share, name, &order));
        settle().await;
    }
    for _ in 0..4 {
        slots.release();
        settle().await;
    }
    for task in tasks {
        assert!(task.await.unwrap());
    }
    assert_eq!(*order.lock().unwrap(), ["a2", "b1", "a3", "a4"]);
}

#[tokio::test]
async fn turns_rotate_over_every_tenant_with_waiters() {
    let slots = Arc::new(FairSlots::new(1));
    assert!(slots.acquire("x").await);
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (share, name) in [
        ("a", "a1"),
        ("a", "a2"),
        ("b", "b1"),
        ("c", "c1"),
        ("b", "b2"),
    ] {
        tasks.push(waiter(&slots, share, name, &order));
        settle().await;
    }
    for _ in 0..5 {
        slots.release();
        settle().await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["a1", "b1", "c1", "a2", "b2"]);
    slots.release();
    assert_eq!(slots.available(), 1, "nobody waits: the slot is free again");
}

#[tokio::test]
async fn a_wait_given_up_leaves_its_place_and_loses_no_slot() {
    let slots = Arc::new(FairSlots::new(1));
    assert!(slots.acquire("a").await);
    // A worker stopped while it waited (its tag left the spec).
    let gone = {
        let slots = slots.clone();
        tokio::spawn(async move { slots.acquire("a").await })
    };
    settle().await;
    gone.abort();
    assert!(gone.await.is_err());
    let order = Arc::new(Mutex::new(Vec::new()));
    let next = waiter(&slots, "b", "b1", &order);
    settle().await;
    slots.release();
    assert!(next.await.unwrap());
    slots.release();
    assert_eq!(slots.available(), 1);
}

#[tokio::test]
async fn a_slot_handed_to_a_wait_dropped_before_it_read_it_goes_on() {
    let slots = FairSlots::new(1);
    assert!(slots.acquire("a").await);
    {
        // Polled once (queued), then handed the slot, then dropped unread.
        let mut wait = Box::pin(slots.acquire("b"));
        assert!(futures::poll!(wait.as_mut()).is_pending());
        slots.release();
    }
    assert_eq!(slots.available(), 1, "the slot came back");
}

#[tokio::test]
async fn closing_refuses_waiters_and_later_acquires() {
    let slots = Arc::new(FairSlots::new(1));
    assert!(slots.acquire("a").await);
    let order = Arc::new(Mutex::new(Vec::new()));
    let queued = waiter(&slots, "b", "b1", &order);
    settle().await;
    slots.close();
    assert!(!queued.await.unwrap());
    assert!(!slots.acquire("c").await);
    assert!(order.lock().unwrap().is_empty());
}
