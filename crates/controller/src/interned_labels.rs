//! Label maps whose strings are stored once for the whole process.
//!
//! (A pod's kept annotations are held the same way: the SidecarSet hash annotations are the same
//! long JSON for every pod of a revision.)
//!
//! Thousands of Nodes carry the same dozen-odd labels (`kubernetes.io/arch=amd64`, the region,
//! the zone, the instance type, the node group...) with few distinct values; as a
//! `BTreeMap<String, String>` every Node stores its own copy of each key and value (17 labels:
//! about 2.3 KiB a Node, measured with heaptrack). [`Labels`] is a sorted slice of pairs of
//! [`Interned`] strings: each distinct key or value is allocated once and shared, so a Node's
//! labels cost a pointer pair per label plus its few unique values (its hostname).
//!
//! The strings themselves are interned by [`crate::interned`] (the stored NodeImages share
//! some too), re-exported here.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use kube::core::labels::Expression;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use smallvec::SmallVec;

use crate::interned::Text;
pub use crate::interned::{Interned, intern, shared_str, shared_str_option};
use kruise_rs_sidecar::matching::LabelLookup;

/// A label map, sorted by key, its strings interned.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Box<[(Interned, Interned)]>);

impl Labels {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| self.0[i].1.as_ref())
    }

    /// `key`'s value as the shared string itself (a clone shares it).
    pub(crate) fn get_shared(&self, key: &str) -> Option<&Interned> {
        self.0
            .binary_search_by(|(k, _)| k.as_ref().cmp(key))
            .ok()
            .map(|i| &self.0[i].1)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_ref(), v.as_ref()))
    }

    /// The map as the API types hold it.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// Whether every requirement holds, as kube's `Selector::matches` decides for a map
    /// (`requirements`: a `Selector`'s, collected once for many label maps).
    pub fn matches(&self, requirements: &[Expression]) -> bool {
        requirements.iter().all(|r| self.satisfies(r))
    }

    fn satisfies(&self, requirement: &Expression) -> bool {
        match requirement {
            Expression::In(key, values) => self.get(key).is_some_and(|v| values.contains(v)),
            Expression::NotIn(key, values) => self.get(key).is_none_or(|v| !values.contains(v)),
            Expression::Equal(key, value) => self.get(key) == Some(value.as_str()),
            Expression::NotEqual(key, value) => self.get(key) != Some(value.as_str()),
            Expression::Exists(key) => self.get(key).is_some(),
            Expression::DoesNotExist(key) => self.get(key).is_none(),
        }
    }

    /// Sets `key` to `value` (a copy of the map with one more pair: for building maps, not
    /// for hot paths).
    pub fn insert(&mut self, key: &str, value: &str) {
        let rest = self.iter().filter(|(k, _)| *k != key);
        *self = Labels::from_pairs(rest.chain([(key, value)]));
    }

    /// Keeps the pairs whose key `keep` accepts, each string shared from now on (a map read
    /// with [`Labels::deserialize_unshared`] becomes an ordinary, interned one).
    pub(crate) fn retain_shared(&mut self, keep: impl Fn(&str) -> bool) {
        let kept: Vec<(Interned, Interned)> = self
            .0
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, v)| (intern(k), intern(v)))
            .collect();
        self.0 = kept.into_boxed_slice();
    }

    /// Reads a map without interning its strings: for maps most of whose entries are about to
    /// be dropped (a pod's annotations), so that strings nobody keeps never enter the table
    /// (where they would stay until its next sweep). [`Labels::retain_shared`] interns what
    /// is kept.
    pub(crate) fn deserialize_unshared<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Self>, D::Error> {
        d.deserialize_option(OptionVisitor { share: false })
    }

    fn from_pairs<K: AsRef<str>, V: AsRef<str>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        Labels::collect_pairs(pairs, intern)
    }

    fn collect_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
        store: fn(&str) -> Interned,
    ) -> Self {
        let mut pairs: Vec<(Interned, Interned)> = pairs
            .into_iter()
            .map(|(k, v)| (store(k.as_ref()), store(v.as_ref())))
            .collect();
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        // A JSON object with a repeated key keeps the last value, as a map would.
        pairs.reverse();
        pairs.dedup_by(|later, earlier| later.0 == earlier.0);
        pairs.reverse();
        Labels(pairs.into_boxed_slice())
    }
}

impl From<&BTreeMap<String, String>> for Labels {
    fn from(map: &BTreeMap<String, String>) -> Self {
        Labels::from_pairs(map)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for Labels {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Self {
        Labels::from_pairs(pairs)
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Labels {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl LabelLookup for Labels {
    fn label(&self, key: &str) -> Option<&str> {
        self.get(key)
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PairsVisitor { share: true })
    }
}

/// Entries a map is read into before it spills to the heap: a cloud provider's Node carries
/// 15–20 labels.
const PAIRS_ON_STACK: usize = 32;

/// Reads a map into [`Labels`]; `share`: intern its strings (else each gets its own).
struct PairsVisitor {
    share: bool,
}

impl<'de> Visitor<'de> for PairsVisitor {
    type Value = Labels;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of label keys to values")
    }
    fn visit_unit<E>(self) -> Result<Labels, E> {
        Ok(Labels::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
        // Borrowed from the input where it has no escapes: no String per entry. Gathered on
        // the stack: a growing `Vec` took four reallocations to read a Node's 17 labels, on
        // every NodeImage event, garbage between the blocks the stores keep.
        let mut pairs: SmallVec<[(Text<'de>, Text<'de>); PAIRS_ON_STACK]> = SmallVec::new();
        while let Some(pair) = map.next_entry::<Text<'de>, Text<'de>>()? {
            pairs.push(pair);
        }
        let store: fn(&str) -> Interned = if self.share { intern } else { |s| Arc::from(s) };
        Ok(Labels::collect_pairs(pairs, store))
    }
}

/// An optional map, as [`Labels::deserialize_unshared`] reads it.
struct OptionVisitor {
    share: bool,
}

impl<'de> Visitor<'de> for OptionVisitor {
    type Value = Option<Labels>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of keys to values, or null")
    }
    fn visit_none<E>(self) -> Result<Option<Labels>, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Option<Labels>, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<Labels>, D::Error> {
        d.deserialize_any(PairsVisitor { share: self.share })
            .map(Some)
    }
}

#[cfg(test)]
mod tests;
