//! The pod webhook's SidecarSets, confirmed against the apiserver before a pod is admitted.
//!
//! The SidecarSet cache is fed by a watch, which runs behind the apiserver: by milliseconds when
//! quiet, by seconds when the manager is busy or its watch is being re-established. A pod created
//! in that window after its SidecarSet was created or changed would be admitted without it, or
//! with the old one (upstream's informer lags the same way). So each admission reads, in a read
//! that started after the request arrived, the resource version the apiserver's own SidecarSet
//! cache stands at (a *fence*: a list at `resourceVersion=0` selecting no object, which answers
//! with that version and nothing else). When our cache is known to hold what the apiserver's held
//! at that version ([`known_versions`]), it is used as it is (decision 0044). Otherwise our watch
//! is behind, or the apiserver's cache moved on without a SidecarSet changing, and whichever
//! comes first settles it: our watch reaching that version, or a list of the SidecarSets' names
//! and resource versions (metadata only, `resourceVersion=0`), against which the cached objects
//! the list names at the cached version are used, and the ones the cache lacks or holds at
//! another version and the cached ones the list lacks (deleted, or the list came from an HA peer
//! whose cache is behind: the list may add to the cache, never take away unconfirmed) are
//! fetched (decision 0031).
//!
//! Not a consistent (quorum) read: for a resource as quiet as SidecarSets, the apiserver answers
//! one only once its cache has caught up with etcd's latest revision, which it learns by a
//! progress notification requested every 100 ms, so while pods are being written each list
//! waited up to that long (93 ms per admission, measured). The apiserver's cache lags etcd by
//! its own watch, milliseconds, where ours can lag by seconds.
//!
//! Admissions share fences and lists ([`SharedReads`]).

mod known_versions;
mod shared_reads;

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Api;
use kube::api::ListParams;

use kruise_rs_api::sidecarset::SidecarSet;
use kruise_rs_kube::error_chain::error_chain;

pub(super) use known_versions::{KnownVersions, Settled, after_stores, before_stores};
pub(super) use shared_reads::{READ_TIMEOUT, SharedReads};

/// How the pod webhook reads its SidecarSet cache (`--sidecarset-cache-fence`, decision 0046).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SidecarSetCacheReads {
    /// Confirmed against the apiserver before each admission (a fence, and a list on a miss):
    /// a pod created just after a SidecarSet changed gets it as it is.
    #[default]
    Confirmed,
    /// Used as it stands, as upstream's informer cache is: no request per admission, but a pod
    /// created while the watch lags gets the SidecarSets as the cache last saw them.
    AsTheyStand,
}

/// A name no SidecarSet can have (two dots in a row): the fence's field selector.
const NO_SIDECARSET: &str = "kruise-rs..fence";

/// What a list of the SidecarSets' metadata saw.
#[derive(Debug, Default)]
pub(super) struct Listed {
    /// The list's resource version: the apiserver cache's when it answered.
    pub(super) version: Option<String>,
    /// The SidecarSets: name → resource version.
    pub(super) sets: BTreeMap<String, String>,
}

/// Fences: the resource version the apiserver's SidecarSet cache stands at (`None` when the
/// answer has none), read from a list at `resourceVersion=0` selecting a name no SidecarSet can
/// have. The apiserver answers it with a lookup of that one name in its cache, so its cost does
/// not grow with the number of SidecarSets.
pub(super) fn fences(api: Api<SidecarSet>) -> Arc<SharedReads<Option<String>>> {
    SharedReads::new("reading the SidecarSets' resource version", move || {
        let api = api.clone();
        Box::pin(async move {
            let params = ListParams::default()
                .match_any()
                .fields(&format!("metadata.name={NO_SIDECARSET}"));
            let list = api.list_metadata(&params).await.map_err(|e| {
                format!(
                    "reading the SidecarSets' resource version: {}",
                    error_chain(&e)
                )
            })?;
            Ok(list.metadata.resource_version)
        })
    })
}

/// Lists of the SidecarSets' metadata from the apiserver's cache as it is (`resourceVersion=0`,
/// no wait for freshness; see the module documentation).
pub(super) fn lists(api: Api<SidecarSet>) -> Arc<SharedReads<Listed>> {
    SharedReads::new("listing the SidecarSets", move || {
        let api = api.clone();
        Box::pin(async move {
            let list = api
                .list_metadata(&ListParams::default().match_any())
                .await
                .map_err(|e| format!("listing the SidecarSets: {}", error_chain(&e)))?;
            Ok(Listed {
                version: list.metadata.resource_version,
                sets: list
                    .items
                    .into_iter()
                    .filter_map(|set| Some((set.metadata.name?, set.metadata.resource_version?)))
                    .collect(),
            })
        })
    })
}

/// What an admission does with the cached SidecarSets, given a list.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Confirmation<T> {
    /// Cached at the version listed: used as cached.
    pub(super) current: Vec<T>,
    /// Listed, but missing from the cache or cached at another version (older, or newer than
    /// the list; either way a fetch returns what is current), or cached but not listed (deleted,
    /// or the list came from an apiserver whose cache is behind ours: only a fetch tells):
    /// read from the apiserver. Empty when the cache held exactly what the list did.
    pub(super) fetch: Vec<String>,
}

/// Sorts the cached SidecarSets (`name_and_version` of each) against `listed` (name → resource
/// version).
pub(super) fn confirm<T>(
    listed: &BTreeMap<String, String>,
    cached: impl IntoIterator<Item = T>,
    name_and_version: impl Fn(&T) -> (Option<&str>, Option<&str>),
) -> Confirmation<T> {
    let mut current = Vec::new();
    let mut confirmed: Vec<&str> = Vec::new();
    let mut unlisted: Vec<String> = Vec::new();
    for object in cached {
        let (Some(name), version) = name_and_version(&object) else {
            continue;
        };
        match listed.get_key_value(name) {
            Some((listed_name, listed_version)) if version == Some(listed_version.as_str()) => {
                confirmed.push(listed_name.as_str());
                current.push(object);
            }
            Some(_) => {}
            None => unlisted.push(name.to_owned()),
        }
    }
    confirmed.sort_unstable();
    let mut fetch: Vec<String> = listed
        .keys()
        .filter(|name| confirmed.binary_search(&name.as_str()).is_err())
        .cloned()
        .chain(unlisted)
        .collect();
    fetch.sort_unstable();
    fetch.dedup();
    Confirmation { current, fetch }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    type Cached = (Option<&'static str>, Option<&'static str>);

    fn sort(listed: &BTreeMap<String, String>, cached: &[Cached]) -> Confirmation<Cached> {
        confirm(listed, cached.iter().copied(), |c| (c.0, c.1))
    }

    #[test]
    fn a_cache_that_agrees_with_the_list_is_used_as_it_is() {
        let got = sort(
            &listed(&[("a", "1"), ("b", "7")]),
            &[(Some("b"), Some("7")), (Some("a"), Some("1"))],
        );
        assert_eq!(
            got.current,
            vec![(Some("b"), Some("7")), (Some("a"), Some("1"))]
        );
        assert!(got.fetch.is_empty());
    }

    #[test]
    fn a_sidecarset_created_a_moment_ago_is_fetched() {
        let got = sort(
            &listed(&[("a", "1"), ("new", "9")]),
            &[(Some("a"), Some("1"))],
        );
        assert_eq!(got.current, vec![(Some("a"), Some("1"))]);
        assert_eq!(got.fetch, vec!["new".to_owned()]);
    }

    #[test]
    fn a_sidecarset_cached_at_another_version_is_fetched_not_used() {
        // Older (an update the watch has not delivered) or newer than the list: a fetch is
        // current either way.
        let got = sort(
            &listed(&[("a", "5"), ("b", "5")]),
            &[(Some("a"), Some("4")), (Some("b"), Some("6"))],
        );
        assert!(got.current.is_empty());
        assert_eq!(got.fetch, vec!["a".to_owned(), "b".to_owned()]);
    }

    #[test]
    fn a_cached_sidecarset_the_list_lacks_is_fetched_not_dropped() {
        // Deleted, or listed by an apiserver whose cache is behind ours: a fetch tells.
        let got = sort(
            &listed(&[("a", "1")]),
            &[(Some("a"), Some("1")), (Some("gone"), Some("3"))],
        );
        assert_eq!(got.current, vec![(Some("a"), Some("1"))]);
        assert_eq!(got.fetch, vec!["gone".to_owned()]);
    }

    #[test]
    fn cached_objects_without_a_name_or_version_are_never_used() {
        let got = sort(
            &listed(&[("a", "1")]),
            &[(None, Some("1")), (Some("a"), None)],
        );
        assert!(got.current.is_empty());
        assert_eq!(got.fetch, vec!["a".to_owned()]);
    }

    #[test]
    fn an_empty_list_has_every_cached_sidecarset_fetched() {
        let got = sort(&BTreeMap::new(), &[(Some("a"), Some("1"))]);
        assert!(got.current.is_empty());
        assert_eq!(got.fetch, vec!["a".to_owned()]);
    }
}
