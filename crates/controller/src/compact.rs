//! Containers for API objects the manager keeps thousands of: no room allocated beyond what
//! they hold.
//!
//! A NodeImage usually lists a few images. As a `BTreeMap` its first entry allocates a node with
//! room for eleven (about 1.4 KiB for `spec.images`, 0.5 KiB for `status.imageStatuses`), and a
//! `Vec` read from JSON grows to room for four before it holds one: at 5,000 nodes one
//! ImagePullJob's entry added ~2 KiB per NodeImage, most of it empty room (issue 21, the fan-out's
//! peak). [`SortedMap`] is a map kept as a sorted `Vec` of pairs, trimmed to its length when
//! read; [`compact_vec`] reads a `Vec` the same way. Both have the JSON shape of what they
//! replace.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A map as a `Vec` of pairs sorted by key, each key once: lookups by binary search, inserts and
/// removals shift the tail (these maps hold a handful of entries). Serializes as a JSON object,
/// in key order like `BTreeMap`; reading one keeps the last value of a repeated key, as
/// `BTreeMap` does.
#[derive(Clone, PartialEq, Eq)]
pub struct SortedMap<K, V>(Vec<(K, V)>);

impl<K, V> SortedMap<K, V> {
    pub const fn new() -> Self {
        Self(Vec::new())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&K, &V)> + ExactSizeIterator {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// Entries in key order, values mutable.
    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&K, &mut V)> + ExactSizeIterator {
        self.0.iter_mut().map(|(k, v)| (&*k, v))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut V> + ExactSizeIterator {
        self.0.iter_mut().map(|(_, v)| v)
    }

    /// Keeps the entries `keep` says yes to, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) {
        self.0.retain_mut(|(k, v)| keep(k, v));
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

impl<K: Ord, V> SortedMap<K, V> {
    fn position<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).is_ok()
    }

    /// Sets `key`'s value; returns the one it replaces.
    pub fn insert(&mut self, key: K, value: impl Into<V>) -> Option<V> {
        let value = value.into();
        match self.position(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|i| self.0.remove(i).1)
    }

    /// `key`'s value, inserted from `make` first when missing.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        let i = match self.position(&key) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (key, make()));
                i
            }
        };
        &mut self.0[i].1
    }

    /// From pairs in any order; the last of a repeated key wins. Holds no spare room.
    fn from_pairs(mut pairs: Vec<(K, V)>) -> Self {
        // Stable: among equal keys the later pair stays later.
        pairs.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(K, V)> = Vec::with_capacity(pairs.len());
        for pair in pairs {
            match out.last_mut() {
                Some(last) if last.0 == pair.0 => *last = pair,
                _ => out.push(pair),
            }
        }
        out.shrink_to_fit();
        Self(out)
    }
}

/// `map[key]`, as for a `BTreeMap`: panics when `key` is missing, so for tests and keys known
/// to be there.
impl<K: Ord + Borrow<Q>, Q: Ord + ?Sized, V> std::ops::Index<&Q> for SortedMap<K, V> {
    type Output = V;

    fn index(&self, key: &Q) -> &V {
        self.get(key)
            .expect("no entry for this key in the SortedMap")
    }
}

impl<K, V> Default for SortedMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for SortedMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Values are taken as anything that turns into one (such as a value into a `Shared` of it).
impl<K: Ord, V, W: Into<V>> FromIterator<(K, W)> for SortedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, W)>>(pairs: I) -> Self {
        Self::from_pairs(pairs.into_iter().map(|(k, w)| (k, w.into())).collect())
    }
}

impl<K: Ord, V, W: Into<V>, const N: usize> From<[(K, W); N]> for SortedMap<K, V> {
    fn from(pairs: [(K, W); N]) -> Self {
        Self::from_pairs(pairs.into_iter().map(|(k, w)| (k, w.into())).collect())
    }
}

impl<K: Ord, V> From<BTreeMap<K, V>> for SortedMap<K, V> {
    fn from(map: BTreeMap<K, V>) -> Self {
        Self(map.into_iter().collect())
    }
}

impl<K: Ord, V> Extend<(K, V)> for SortedMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, pairs: I) {
        for (k, v) in pairs {
            self.insert(k, v);
        }
    }
}

impl<K, V> IntoIterator for SortedMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, K, V> IntoIterator for &'a SortedMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(k, v)| (k, v))
    }
}

impl<'a, K, V> IntoIterator for &'a mut SortedMap<K, V> {
    type Item = (&'a K, &'a mut V);
    type IntoIter =
        std::iter::Map<std::slice::IterMut<'a, (K, V)>, fn(&'a mut (K, V)) -> (&'a K, &'a mut V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut().map(|(k, v)| (&*k, v))
    }
}

impl<K: Serialize, V: Serialize> Serialize for SortedMap<K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Deserialize<'de> for SortedMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs<K, V>(PhantomData<(K, V)>);

        impl<'de, K: Deserialize<'de> + Ord, V: Deserialize<'de>> Visitor<'de> for Pairs<K, V> {
            type Value = SortedMap<K, V>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                // No pre-sizing from the input's hint: `from_pairs` trims to the length anyway.
                let mut pairs = Vec::new();
                while let Some(pair) = access.next_entry()? {
                    pairs.push(pair);
                }
                Ok(SortedMap::from_pairs(pairs))
            }
        }

        deserializer.deserialize_map(Pairs(PhantomData))
    }
}

/// Reads a `Vec` with no spare room (serde's grows to four entries for the first one).
pub fn compact_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Vec<T>, D::Error> {
    let mut items = Vec::<T>::deserialize(deserializer)?;
    items.shrink_to_fit();
    Ok(items)
}

/// [`compact_vec`] for an optional `Vec`.
pub fn compact_option_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Vec<T>>, D::Error> {
    let mut items = Option::<Vec<T>>::deserialize(deserializer)?;
    if let Some(items) = items.as_mut() {
        items.shrink_to_fit();
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn lookups_inserts_and_removals_keep_the_keys_sorted_and_unique() {
        let mut map = SortedMap::new();
        assert_eq!(map.insert("b".to_owned(), 2), None);
        assert_eq!(map.insert("a".to_owned(), 1), None);
        assert_eq!(map.insert("c".to_owned(), 3), None);
        assert_eq!(map.insert("b".to_owned(), 20), Some(2));
        assert_eq!(
            map.keys().map(String::as_str).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(map.get("b"), Some(&20));
        assert!(map.contains_key("c") && !map.contains_key("d"));
        *map.get_mut("a").unwrap() += 10;
        assert_eq!(map.remove("c"), Some(3));
        assert_eq!(map.remove("c"), None);
        *map.get_or_insert_with("0".to_owned(), || 0) += 5;
        *map.get_or_insert_with("a".to_owned(), || 0) += 5;
        let pairs: Vec<(&str, i32)> = map.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(pairs, [("0", 5), ("a", 16), ("b", 20)]);
        map.retain(|k, _| k != "a");
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn it_reads_and_writes_the_json_of_a_btreemap() {
        let text = r#"{"z":{"n":1},"a":{"n":2},"m":{"n":3}}"#;
        let ours: SortedMap<String, BTreeMap<String, i32>> = serde_json::from_str(text).unwrap();
        let theirs: BTreeMap<String, BTreeMap<String, i32>> = serde_json::from_str(text).unwrap();
        assert_eq!(
            serde_json::to_string(&ours).unwrap(),
            serde_json::to_string(&theirs).unwrap()
        );
        assert_eq!(ours, SortedMap::from(theirs));
        // A repeated key: the last value wins, as in a BTreeMap.
        let repeated: SortedMap<String, i32> =
            serde_json::from_str(r#"{"k":1,"j":0,"k":2}"#).unwrap();
        assert_eq!(
            repeated,
            SortedMap::from([("j".to_owned(), 0), ("k".to_owned(), 2)])
        );
        // Not a map: refused with serde's error, not a panic.
        let err = serde_json::from_value::<SortedMap<String, i32>>(json!([1, 2])).unwrap_err();
        assert!(err.to_string().contains("expected a map"), "{err}");
    }

    #[test]
    fn what_is_read_holds_no_spare_room() {
        let map: SortedMap<String, i32> = serde_json::from_str(r#"{"only":1}"#).unwrap();
        assert_eq!(map.0.capacity(), 1);
        #[derive(Deserialize)]
        struct Holder {
            #[serde(deserialize_with = "compact_vec")]
            items: Vec<String>,
        }
        let held: Holder = serde_json::from_str(r#"{"items":["one"]}"#).unwrap();
        assert_eq!(held.items.capacity(), 1);
        let plain: Vec<String> = serde_json::from_str(r#"["one"]"#).unwrap();
        assert!(plain.capacity() > 1, "serde's own Vec keeps spare room");
    }
}
