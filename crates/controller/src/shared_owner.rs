//! The owner references of NodeImage tags, stored once for every tag that names the same owner.
//!
//! An ImagePullJob's fan-out writes the same owner reference into one tag of every NodeImage it
//! targets: at 5,000 nodes, 5,000 copies of one `ObjectReference` (a 168-byte struct and five
//! strings each: 1.2 MiB of heap requested, counted by heaptrack once the job had run; issue 21). Parsed, a
//! reference is looked up among those alive and the stored one shared instead; references
//! nobody holds any more (a finished job's) are swept as interned strings are
//! (`SweptSet` in `super::interned`).

use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex};

use k8s_openapi::api::core::v1::ObjectReference;
use serde::{Deserialize, Deserializer};

use super::interned::SweptSet;

/// An owner reference shared by every holder of an equal one.
pub type SharedOwner = Arc<ObjectReference>;

/// A table entry: hashed and compared by every field (`ObjectReference` has no `Hash`).
struct Entry(SharedOwner);

impl Entry {
    fn fields(&self) -> [&Option<String>; 7] {
        let r = &*self.0;
        [
            &r.uid,
            &r.name,
            &r.namespace,
            &r.kind,
            &r.api_version,
            &r.resource_version,
            &r.field_path,
        ]
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl Eq for Entry {}

impl Hash for Entry {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.fields().hash(state);
    }
}

/// Below this many references the table is never swept.
const MIN_SWEEP: usize = 64;

static TABLE: LazyLock<Mutex<SweptSet<Entry>>> =
    LazyLock::new(|| Mutex::new(SweptSet::new(MIN_SWEEP)));

/// The shared copy of `owner`.
pub fn share(owner: ObjectReference) -> SharedOwner {
    let entry = Entry(Arc::new(owner));
    // A poisoned lock only means another thread panicked mid-insert; the set is still valid.
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = table.get(&entry) {
        return found.0.clone();
    }
    let shared = entry.0.clone();
    table.insert(entry, |e| Arc::strong_count(&e.0) > 1);
    shared
}

/// Reads a list of owner references as their shared copies, the list without spare room
/// (`#[serde(deserialize_with = "shared_owners")]`; null reads as empty).
pub fn shared_owners<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SharedOwner>, D::Error> {
    let owners = Option::<Vec<ObjectReference>>::deserialize(d)?.unwrap_or_default();
    // Not `collect()`: that may reuse the parsed list's buffer, 168 bytes a slot for 8-byte Arcs.
    let mut shared = Vec::with_capacity(owners.len());
    shared.extend(owners.into_iter().map(share));
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("apps.kruise.io/v1alpha1".into()),
            kind: Some("ImagePullJob".into()),
            name: Some(format!("job-{uid}")),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn equal_references_are_one_allocation() {
        let a = share(owner("shared-1"));
        let b = share(owner("shared-1"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(*a, owner("shared-1"));
    }

    #[test]
    fn references_differing_in_any_field_are_kept_apart() {
        let a = share(owner("apart-1"));
        let mut other = owner("apart-1");
        other.resource_version = Some("7".into());
        let b = share(other.clone());
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!(*b, other);
        assert_ne!(share(owner("apart-2")), a);
    }

    #[test]
    fn a_parsed_list_shares_its_references_and_keeps_no_spare_room() {
        #[derive(Deserialize)]
        struct Tag {
            #[serde(default, deserialize_with = "shared_owners")]
            owners: Vec<SharedOwner>,
        }
        let json = serde_json::json!({"owners": [
            {"apiVersion": "apps.kruise.io/v1alpha1", "kind": "ImagePullJob", "name": "job-list-1",
             "namespace": "default", "uid": "list-1"}
        ]});
        let a: Tag = serde_json::from_value(json.clone()).expect("parses");
        let b: Tag = serde_json::from_value(json).expect("parses");
        assert_eq!(a.owners.len(), 1);
        assert_eq!(a.owners.capacity(), 1);
        assert!(Arc::ptr_eq(&a.owners[0], &b.owners[0]));
        let null: Tag = serde_json::from_value(serde_json::json!({"owners": null})).expect("null");
        assert!(null.owners.is_empty());
    }

    #[test]
    fn references_nobody_holds_are_swept() {
        for i in 0..(4 * MIN_SWEEP) {
            drop(share(owner(&format!("swept-{i}"))));
        }
        let kept = TABLE.lock().unwrap_or_else(|e| e.into_inner()).len();
        // Unswept, the table would hold every one of them.
        assert!(
            kept < 4 * MIN_SWEEP,
            "{kept} references kept after the sweeps"
        );
    }
}
