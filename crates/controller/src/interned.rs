//! Strings stored once for the whole process: the same label values, hash annotations, image
//! names and image IDs recur on thousands of stored objects, and each distinct one is allocated
//! once and shared ([`Interned`]).
//!
//! The table never grows without bound: strings nobody holds any more (a deleted Node's
//! hostname) are dropped when the table has doubled since it was last swept.

use std::borrow::Borrow;
use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, LazyLock, Mutex};

use serde::de::Visitor;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A string shared by every holder of an equal one.
pub type Interned = Arc<str>;

/// Shared values, each held once here and by whoever took it: once the set has doubled since
/// its last sweep, the values nobody else holds any more are dropped (sweeping costs a pass
/// over it, so not below `min` values). The string table below and the NodeImage owner
/// references (`shared_owner`) are one each.
pub(crate) struct SweptSet<T> {
    items: HashSet<T>,
    /// Size after the last sweep; the next sweep runs at twice this.
    swept_at: usize,
    min: usize,
}

impl<T: Hash + Eq> SweptSet<T> {
    pub(crate) fn new(min: usize) -> Self {
        SweptSet {
            items: HashSet::new(),
            swept_at: 0,
            min,
        }
    }

    pub(crate) fn get<Q: Hash + Eq + ?Sized>(&self, value: &Q) -> Option<&T>
    where
        T: Borrow<Q>,
    {
        self.items.get(value)
    }

    /// Adds `item`, sweeping first when due; `held_elsewhere` says whether a value in the set
    /// is still held outside it.
    pub(crate) fn insert(&mut self, item: T, held_elsewhere: impl Fn(&T) -> bool) {
        if self.items.len() >= (self.swept_at * 2).max(self.min) {
            self.items.retain(held_elsewhere);
            self.swept_at = self.items.len();
        }
        self.items.insert(item);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// Below this many strings the table is never swept.
const MIN_SWEEP: usize = 1024;

static TABLE: LazyLock<Mutex<SweptSet<Interned>>> =
    LazyLock::new(|| Mutex::new(SweptSet::new(MIN_SWEEP)));

/// The shared copy of `s`.
pub fn intern(s: &str) -> Interned {
    // A poisoned lock only means another thread panicked mid-insert; the set is still valid.
    let mut table = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = table.get(s) {
        return found.clone();
    }
    let new: Interned = Arc::from(s);
    table.insert(new.clone(), |s| Arc::strong_count(s) > 1);
    new
}

/// A string field read as its shared copy (`#[serde(with = "shared_str")]`; null reads as
/// empty).
pub mod shared_str {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Interned, D::Error> {
        let text = Option::<Text<'de>>::deserialize(d)?;
        Ok(intern(text.as_ref().map_or("", AsRef::as_ref)))
    }

    pub fn serialize<S: Serializer>(value: &Interned, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(value)
    }
}

/// An optional string field read as its shared copy (`#[serde(with = "shared_str_option")]`).
pub mod shared_str_option {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Interned>, D::Error> {
        Ok(Option::<Text<'de>>::deserialize(d)?.map(|t| intern(t.as_ref())))
    }

    pub fn serialize<S: Serializer>(value: &Option<Interned>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_some(&**v),
            None => s.serialize_none(),
        }
    }
}

/// A string field or map key held as its shared copy: read through the table, compared, ordered
/// and written as its text. For keys and list items, where `#[serde(with)]` cannot reach (the
/// NodeImage image names and tags, the same few on thousands of NodeImages).
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InternedString(Interned);

impl InternedString {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for InternedString {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for InternedString {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for InternedString {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for InternedString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for InternedString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for InternedString {
    fn from(s: &str) -> Self {
        InternedString(intern(s))
    }
}

impl From<&String> for InternedString {
    fn from(s: &String) -> Self {
        InternedString(intern(s))
    }
}

impl From<String> for InternedString {
    fn from(s: String) -> Self {
        InternedString(intern(&s))
    }
}

impl From<&InternedString> for String {
    fn from(s: &InternedString) -> Self {
        s.0.to_string()
    }
}

impl PartialEq<str> for InternedString {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for InternedString {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for InternedString {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl Serialize for InternedString {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for InternedString {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(InternedString(intern(Text::deserialize(d)?.as_ref())))
    }
}

/// A string as the deserializer offers it: borrowed from the input when it can be.
pub struct Text<'de>(Cow<'de, str>);

impl AsRef<str> for Text<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextVisitor;
        impl<'de> Visitor<'de> for TextVisitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(TextVisitor)
    }
}

/// Whether `s` is in the table (for tests of what gets interned when).
#[doc(hidden)]
pub fn in_table(s: &str) -> bool {
    TABLE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(s)
        .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_as_shared_copies() {
        #[derive(Deserialize)]
        struct Holder {
            #[serde(with = "shared_str")]
            name: Interned,
            #[serde(default, with = "shared_str_option")]
            id: Option<Interned>,
        }
        let json = serde_json::json!({"name": "interned-test-field", "id": "interned-test-id"});
        let a: Holder = serde_json::from_value(json.clone()).expect("parses");
        let b: Holder = serde_json::from_value(json).expect("parses");
        assert!(Arc::ptr_eq(&a.name, &b.name));
        assert!(Arc::ptr_eq(
            a.id.as_ref().expect("id"),
            b.id.as_ref().expect("id")
        ));
        let none: Holder =
            serde_json::from_value(serde_json::json!({"name": null})).expect("parses");
        assert_eq!(&*none.name, "");
        assert!(none.id.is_none());
    }

    #[test]
    fn strings_nobody_holds_are_swept_when_the_table_doubles() {
        // Unique to this test so that no other test holds them.
        let dropped: Vec<String> = (0..MIN_SWEEP * 2)
            .map(|i| format!("interned-sweep-test-dropped-{i}"))
            .collect();
        for s in &dropped {
            drop(intern(s));
        }
        let kept = intern("interned-sweep-test-kept");
        // Enough new strings to cross the next sweep point, whatever other tests have interned.
        for i in 0..MIN_SWEEP * 8 {
            drop(intern(&format!("interned-sweep-test-filler-{i}")));
        }
        let table = TABLE.lock().expect("lock");
        let left = dropped
            .iter()
            .filter(|s| table.get(s.as_str()).is_some())
            .count();
        assert_eq!(left, 0, "dropped strings left in the table");
        assert!(table.get("interned-sweep-test-kept").is_some());
        drop(table);
        assert_eq!(&*kept, "interned-sweep-test-kept");
    }
}
