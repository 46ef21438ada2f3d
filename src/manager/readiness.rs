//! When a manager replica is ready. `/readyz` gates the webhook Service's endpoints and a
//! Deployment's rollout, so it waits until what this replica serves works: the webhooks' caches
//! have listed, and, on the replica running the controllers, every controller's caches have. A
//! manager that cannot watch (a refused watch, missing RBAC) therefore stays unready and stops
//! a rollout instead of reporting `ok`.

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
