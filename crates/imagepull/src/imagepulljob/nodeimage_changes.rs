//! What a NodeImage event changed, as far as ImagePullJobs care (upstream #2483: every daemon
//! status write used to wake every running job that could target the node).
//!
//! A job needs waking when
//! - a tag it owns changed in the spec, its entries appeared or went, or the daemon's report of
//!   it changed phase (or round, or start time): its counts and its next nodes follow from
//!   them. A report whose progress or message alone moved wakes nobody: a daemon writes those
//!   every few seconds while it pulls, and the job reads the progress again on its own every
//!   [`super::reconcile::PROGRESS_REFRESH`];
//! - the node appeared, went, or its labels changed: a job that may target it but owns nothing
//!   there yet decides again whether to write it;
//! - the NodeImage lost images: a job it refused for holding the most images it may (256) tries
//!   again.
//!
//! So each NodeImage seen is remembered as a fingerprint (one hash of its labels, one per owner
//! of the tags it owns), and an event is compared with the last fingerprint of its node. A
//! daemon reporting one job's tag then wakes that job alone.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};

use kube::runtime::watcher;
use serde::Serialize;

use crate::compact_nodeimage::SharedOwner;
use crate::lean_nodeimage::LeanNodeImage;

/// What an event changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Change {
    /// Owners (job UIDs) whose tags on the node changed, appeared or went.
    pub(crate) owners: Vec<String>,
    /// The node appeared, went, its labels changed or it lost images.
    pub(crate) node: bool,
}

/// One NodeImage as the wake-ups need it.
/// Kept for every NodeImage the manager watches, so small (about 50 bytes with its key and
/// nothing owned): the owners are the store's own shared references, in a boxed slice (a
/// `BTreeMap` allocates room for 11 entries at once).
#[derive(Debug)]
struct Fingerprint {
    labels: u64,
    images: u32,
    /// Each owner with a hash of its tags' spec entries and of the phase, round and start time
    /// the daemon reports for them, by UID.
    owned: Box<[(SharedOwner, u64)]>,
}

impl Fingerprint {
    fn owners(&self) -> impl Iterator<Item = (&str, u64)> {
        self.owned
            .iter()
            .map(|(owner, hash)| (owner.uid.as_deref().unwrap_or_default(), *hash))
    }

    fn hash_of(&self, uid: &str) -> Option<u64> {
        self.owned
            .binary_search_by(|(owner, _)| owner.uid.as_deref().unwrap_or_default().cmp(uid))
            .ok()
            .map(|i| self.owned[i].1)
    }
}

/// The last fingerprint of every NodeImage seen, by a 64-bit hash of its name (two names
/// sharing one would at worst wake a job for nothing: a missed change would need the other
/// node's fingerprint to equal the changed one's).
#[derive(Debug, Default)]
pub(crate) struct NodeImageChanges {
    seen: HashMap<u64, Fingerprint>,
    /// The nodes a re-list has brought so far (between `Init` and `InitDone`).
    relisted: Option<HashSet<u64>>,
}

fn name_key(ni: &LeanNodeImage) -> u64 {
    let mut hasher = DefaultHasher::new();
    ni.metadata
        .name
        .as_deref()
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

impl NodeImageChanges {
    /// Records `event` and says what it changed. At the end of a re-list, NodeImages the list no
    /// longer holds count as gone (no deletion event comes for them).
    pub(crate) fn observe(&mut self, event: &watcher::Event<LeanNodeImage>) -> Change {
        match event {
            watcher::Event::Init => {
                self.relisted = Some(HashSet::new());
                Change::default()
            }
            watcher::Event::InitApply(ni) | watcher::Event::Apply(ni) => {
                let key = name_key(ni);
                if let (watcher::Event::InitApply(_), Some(relisted)) = (event, &mut self.relisted)
                {
                    relisted.insert(key);
                }
                let new = fingerprint(ni);
                let change = diff(self.seen.get(&key), Some(&new));
                self.seen.insert(key, new);
                change
            }
            watcher::Event::Delete(ni) => diff(self.seen.remove(&name_key(ni)).as_ref(), None),
            watcher::Event::InitDone => {
                let Some(relisted) = self.relisted.take() else {
                    return Change::default();
                };
                let gone: Vec<u64> = self
                    .seen
                    .keys()
                    .filter(|key| !relisted.contains(*key))
                    .copied()
                    .collect();
                let mut change = Change::default();
                for key in gone {
                    let old = self.seen.remove(&key);
                    let each = diff(old.as_ref(), None);
                    change.node |= each.node;
                    change.owners.extend(each.owners);
                }
                change.owners.sort();
                change.owners.dedup();
                change
            }
        }
    }
}

/// What changed from `old` to `new` (`None`: not there).
fn diff(old: Option<&Fingerprint>, new: Option<&Fingerprint>) -> Change {
    match (old, new) {
        (None, None) => Change::default(),
        (Some(only), None) | (None, Some(only)) => Change {
            owners: only.owners().map(|(uid, _)| uid.to_owned()).collect(),
            node: true,
        },
        (Some(old), Some(new)) => {
            let mut owners: Vec<String> = old
                .owners()
                .filter(|(uid, hash)| new.hash_of(uid) != Some(*hash))
                .chain(new.owners().filter(|(uid, _)| old.hash_of(uid).is_none()))
                .map(|(uid, _)| uid.to_owned())
                .collect();
            owners.sort();
            Change {
                owners,
                node: old.labels != new.labels || new.images < old.images,
            }
        }
    }
}

fn fingerprint(ni: &LeanNodeImage) -> Fingerprint {
    let mut owned: BTreeMap<&str, (&SharedOwner, DefaultHasher)> = BTreeMap::new();
    let statuses = ni.status.as_ref().map(|s| &s.image_statuses);
    for (image, spec) in ni.spec.images.iter() {
        let status = statuses.and_then(|s| s.get(image.as_str()));
        for tag in &spec.tags {
            let reported = status
                .and_then(|s| s.tags.iter().find(|t| t.tag == tag.tag))
                .map(|t| (t.phase, t.version, &t.start_time));
            for owner in &tag.owner_references {
                let Some(uid) = owner.uid.as_deref() else {
                    continue;
                };
                let (_, hasher) = owned
                    .entry(uid)
                    .or_insert_with(|| (owner, DefaultHasher::new()));
                image.as_str().hash(hasher);
                hash_json(&(tag, reported), hasher);
            }
        }
    }
    let mut labels = DefaultHasher::new();
    hash_json(ni.labels(), &mut labels);
    Fingerprint {
        labels: labels.finish(),
        images: u32::try_from(ni.spec.images.len()).unwrap_or(u32::MAX),
        owned: owned
            .into_values()
            .map(|(owner, h)| (owner.clone(), h.finish()))
            .collect(),
    }
}

/// Feeds `value`'s JSON to `hasher`: the compact types have no `Hash`, and their JSON is what
/// the API says they are.
fn hash_json(value: &impl Serialize, hasher: &mut DefaultHasher) {
    // Serializing plain data cannot fail; an empty slice still hashes the rest.
    serde_json::to_vec(value).unwrap_or_default().hash(hasher);
}

#[cfg(test)]
mod tests;
