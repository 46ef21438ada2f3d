use std::sync::LazyLock;

use super::*;

#[test]
fn values_nobody_holds_are_swept() {
    // A table of its own, so other tests' values do not count.
    #[derive(Clone, Debug, PartialEq)]
    struct Probe(u32);
    impl Shareable for Probe {
        fn hash_key<H: std::hash::Hasher>(&self, state: &mut H) {
            std::hash::Hash::hash(&self.0, state);
        }
        fn table() -> &'static SharedTable<Probe> {
            static TABLE: LazyLock<SharedTable<Probe>> = LazyLock::new(SharedTable::default);
            &TABLE
        }
    }
    let kept: Vec<Shared<Probe>> = (0..10).map(|i| Shared::share(Probe(i))).collect();
    for i in 100..100 + MIN_SWEEP as u32 * 8 {
        drop(Shared::share(Probe(i)));
    }
    let table = Probe::table().len();
    assert!(
        table < MIN_SWEEP * 2 + kept.len(),
        "{table} values kept for 10 held"
    );
    for (i, k) in kept.iter().enumerate() {
        assert!(Shared::share(Probe(i as u32)).same_copy(k));
    }
}
