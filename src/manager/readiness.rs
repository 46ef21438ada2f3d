//! When a manager replica is ready. `/readyz` gates the webhook Service's endpoints and a
//! Deployment's rollout, so it waits until what this replica serves works: the webhooks' caches
//! have listed, and, on the replica running the controllers, every controller's caches have. A
//! manager that cannot watch (a refused watch, missing RBAC) therefore stays unready and stops
//! a rollout instead of reporting `ok`.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;

/// Where this replica's controllers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Controllers {
    /// Not running here (another replica holds the Lease), and this replica's warm watches
    /// (decision 0043) have not listed yet: it could not take over at once.
    StandbyListing,
    /// Not running here: another replica holds the Lease (or they have stopped).
    Standby,
    /// Running; some controller's caches have not listed yet.
    Syncing,
    /// Running; every controller's caches have listed once.
    Synced,
}

/// Steps `state` down to standing by (this replica stopped leading, or its controllers stopped):
/// `Standby`, or `StandbyListing` while its warm watches have not listed (`warm_listed`): a
/// replica that won the Lease before they had listed and lost it again could not take over at
/// once either. The flag is read under the state's lock, as [`warm_watches_listed`] sets it,
/// so the end of the listing cannot slip in between.
pub(crate) fn stand_by(state: &watch::Sender<Controllers>, warm_listed: &AtomicBool) {
    state.send_modify(|now| {
        *now = if warm_listed.load(Ordering::SeqCst) {
            Controllers::Standby
        } else {
            Controllers::StandbyListing
        };
    });
}

/// This replica's warm watches have listed: a standby that waited for them is ready; a leader
/// stays as it is.
pub(crate) fn warm_watches_listed(state: &watch::Sender<Controllers>, warm_listed: &AtomicBool) {
    state.send_if_modified(|now| {
        warm_listed.store(true, Ordering::SeqCst);
        let listing = *now == Controllers::StandbyListing;
        if listing {
            *now = Controllers::Standby;
        }
        listing
    });
}

/// The readiness decision. `webhook_caches`: `None` when this replica serves no webhooks, else
/// whether their caches have listed.
pub(crate) fn is_ready(webhook_caches: Option<bool>, controllers: Controllers) -> bool {
    webhook_caches.unwrap_or(true)
        && !matches!(
            controllers,
            Controllers::Syncing | Controllers::StandbyListing
        )
}

/// What `/readyz` waits for, for the log when it is not ready.
pub(crate) fn waiting_for(
    webhook_caches: Option<bool>,
    controllers: Controllers,
) -> Vec<&'static str> {
    let mut waiting = Vec::new();
    if webhook_caches == Some(false) {
        waiting.push("the webhooks' caches");
    }
    match controllers {
        Controllers::Syncing => waiting.push("the controllers' caches"),
        Controllers::StandbyListing => waiting.push("the standby's pod and NodeImage lists"),
        Controllers::Standby | Controllers::Synced => {}
    }
    waiting
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_that_stops_leading_before_its_warm_watches_listed_is_not_ready() {
        let (state, seen) = watch::channel(Controllers::StandbyListing);
        let warm_listed = AtomicBool::new(false);
        // It wins the Lease at once, and loses it before the lists end.
        state.send_replace(Controllers::Syncing);
        stand_by(&state, &warm_listed);
        assert_eq!(*seen.borrow(), Controllers::StandbyListing);
        warm_watches_listed(&state, &warm_listed);
        assert_eq!(*seen.borrow(), Controllers::Standby);
    }

    #[test]
    fn lists_that_end_while_leading_leave_the_leader_as_it_is_and_make_a_later_standby_ready() {
        let (state, seen) = watch::channel(Controllers::StandbyListing);
        let warm_listed = AtomicBool::new(false);
        state.send_replace(Controllers::Synced);
        warm_watches_listed(&state, &warm_listed);
        assert_eq!(*seen.borrow(), Controllers::Synced);
        stand_by(&state, &warm_listed);
        assert_eq!(*seen.borrow(), Controllers::Standby);
    }

    #[test]
    fn a_follower_is_ready_once_its_webhook_caches_are() {
        assert!(!is_ready(Some(false), Controllers::Standby));
        assert!(is_ready(Some(true), Controllers::Standby));
        assert!(is_ready(None, Controllers::Standby));
    }

    #[test]
    fn a_warm_follower_also_waits_for_its_lists() {
        assert!(!is_ready(Some(true), Controllers::StandbyListing));
        assert!(!is_ready(None, Controllers::StandbyListing));
        assert_eq!(
            waiting_for(None, Controllers::StandbyListing),
            vec!["the standby's pod and NodeImage lists"]
        );
    }

    #[test]
    fn the_leader_also_waits_for_its_controllers() {
        assert!(!is_ready(Some(true), Controllers::Syncing));
        assert!(!is_ready(None, Controllers::Syncing));
        assert!(is_ready(Some(true), Controllers::Synced));
        assert!(is_ready(None, Controllers::Synced));
        assert!(!is_ready(Some(false), Controllers::Synced));
    }

    #[test]
    fn the_log_names_what_is_missing() {
        assert_eq!(
            waiting_for(Some(false), Controllers::Syncing),
            vec!["the webhooks' caches", "the controllers' caches"]
        );
        assert_eq!(
            waiting_for(None, Controllers::Syncing),
            vec!["the controllers' caches"]
        );
        assert!(waiting_for(Some(true), Controllers::Synced).is_empty());
    }
}
