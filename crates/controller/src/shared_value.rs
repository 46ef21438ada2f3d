//! Values that thousands of NodeImages hold equal, stored once.
//!
//! An ImagePullJob's fan-out writes the same image entry into every NodeImage it targets, and
//! nodes that pulled it within the same second report the same state for it: at 5,000 nodes,
//! 5,000 equal copies of one `ImageSpec` and many of one `ImageStatus` (a counting allocator
//! put the job's entry, spec and status, at 366 bytes in 4 allocations per NodeImage; issue
//! 21). Parsed, such a value is looked up among those alive and the stored one shared instead
//! (as `shared_owner` does for owner references); values nobody holds any more are swept as
//! interned strings are (`SweptSet`).
//!
//! [`Shared`] reads, compares and serializes as the value it holds; changing it through
//! `DerefMut` gives the changer a copy of its own (clone on write), so sharing is never visible.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::interned::SweptSet;

/// Below this many values a table is never swept.
const MIN_SWEEP: usize = 64;

/// A value type with a table of the shared copies alive.
pub trait Shareable: Clone + PartialEq + Sized + 'static {
    /// Hashes what tells values apart; equal values must hash equal (a subset of the fields
    /// that `PartialEq` compares is enough).
    fn hash_key<H: Hasher>(&self, state: &mut H);

    /// This type's table: a `static` `LazyLock` of its own, built by `SharedTable::default`.
    fn table() -> &'static SharedTable<Self>;
}

/// The shared copies of one type's values that are alive.
pub struct SharedTable<T>(Mutex<SweptSet<TableEntry<T>>>);

impl<T: Shareable> Default for SharedTable<T> {
    fn default() -> Self {
        SharedTable(Mutex::new(SweptSet::new(MIN_SWEEP)))
    }
}

impl<T: Shareable> SharedTable<T> {
    /// How many values it holds (swept ones gone), for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A table entry: hashed by [`Shareable::hash_key`], compared by value.
struct TableEntry<T>(Arc<T>);

impl<T: Shareable> PartialEq for TableEntry<T> {
    fn eq(&self, other: &Self) -> bool {
        *self.0 == *other.0
    }
}

// The shared types compare no floats: equality is reflexive.
impl<T: Shareable> Eq for TableEntry<T> {}

impl<T: Shareable> Hash for TableEntry<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash_key(state);
    }
}

/// A value shared by every holder of an equal one (see the module docs).
pub struct Shared<T>(Arc<T>);

impl<T: Shareable> Shared<T> {
    /// The shared copy of `value`.
    pub fn share(value: T) -> Self {
        let entry = TableEntry(Arc::new(value));
        // A poisoned lock only means another thread panicked mid-insert; the set is still valid.
        let mut table = T::table().0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = table.get(&entry) {
            return Shared(found.0.clone());
        }
        let shared = entry.0.clone();
        table.insert(entry, |e| Arc::strong_count(&e.0) > 1);
        Shared(shared)
    }

    /// Whether `self` and `other` are one stored copy (for tests: sharing is otherwise
    /// invisible).
    pub fn same_copy(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> Deref for Shared<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> DerefMut for Shared<T> {
    /// A copy of its own when others hold this one.
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

/// Not looked up in the table: values built in code are few and short-lived (patches, tests);
/// what is stored comes through `Deserialize`.
impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared(Arc::new(value))
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T: Default> Default for Shared<T> {
    fn default() -> Self {
        Shared(Arc::new(T::default()))
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de, T: Shareable + Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Shared::share)
    }
}

#[cfg(test)]
mod tests;
