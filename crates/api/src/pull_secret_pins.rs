//! Which pull Secret, by uid, a job's author was checked against (decision 0029).
//!
//! The webhook checks at admission that a job's author may read each Secret it names
//! (decision 0009); the manager then copies those Secrets for the node daemons for as long as
//! the job runs. A Secret deleted and created again under the same name is another Secret: it
//! may hold other credentials, put there by someone else, after the author lost access. So the
//! manager pins each Secret's uid on the job (annotation [`PULL_SECRET_UIDS`]) at the job's
//! first claim of it and gives the daemons only the Secret with that uid. A new check re-arms
//! the job: whoever changes or removes an entry must pass the webhook's check for that Secret
//! ([`rechecked`]), and the manager pins the Secret found next.
//!
//! The value is `name=uid` entries, comma-joined, sorted by name: Secret names are DNS
//! subdomains and uids UUIDs, so neither holds `,` or `=`.

use std::collections::{BTreeMap, BTreeSet};

use crate::validation::{FieldError, key};
use crate::well_known::PULL_SECRET_UIDS;

/// Secret name to the uid its author was checked against.
pub type Pins = BTreeMap<String, String>;

/// The pins in `value`, or what is wrong with it.
pub(crate) fn parse(value: &str) -> Result<Pins, String> {
    let mut pins = Pins::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, uid)) = entry.split_once('=') else {
            return Err(format!("entry {entry:?} is not name=uid"));
        };
        let (name, uid) = (name.trim(), uid.trim());
        if name.is_empty() || uid.is_empty() || uid.contains('=') {
            return Err(format!("entry {entry:?} is not name=uid"));
        }
        if pins.insert(name.to_owned(), uid.to_owned()).is_some() {
            return Err(format!("Secret {name:?} is pinned twice"));
        }
    }
    Ok(pins)
}

/// The annotation value for `pins`.
pub fn render(pins: &Pins) -> String {
    pins.iter()
        .map(|(name, uid)| format!("{name}={uid}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The pins in `annotations` (none without the annotation).
pub fn of(annotations: &BTreeMap<String, String>) -> Result<Pins, String> {
    annotations
        .get(PULL_SECRET_UIDS)
        .map_or_else(|| Ok(Pins::new()), |value| parse(value))
}

/// How a Secret found now stands against the job's pins.
#[derive(Debug, PartialEq, Eq)]
pub enum Pin {
    /// The Secret the author was checked against.
    Matches,
    /// Not pinned yet: the job's first claim pins it.
    Unpinned,
    /// Another Secret than the one checked, under the same name.
    Replaced { pinned: String },
}

/// How the Secret `name` with `uid` stands against `pins`.
pub fn check(pins: &Pins, name: &str, uid: &str) -> Pin {
    match pins.get(name) {
        None => Pin::Unpinned,
        Some(pinned) if pinned == uid => Pin::Matches,
        Some(pinned) => Pin::Replaced {
            pinned: pinned.clone(),
        },
    }
}

/// The annotation's problems, for admission.
pub fn validate(annotations: &BTreeMap<String, String>) -> Vec<FieldError> {
    match annotations.get(PULL_SECRET_UIDS).map(|v| (v, parse(v))) {
        Some((value, Err(message))) => vec![FieldError::invalid(
            key("metadata.annotations", PULL_SECRET_UIDS),
            value,
            message,
        )],
        _ => Vec::new(),
    }
}

/// The names in `pull_secrets` whose pin an update from `old` to `new` (annotation values)
/// changed or removed: each is a new check of whoever makes the update. Adding a pin for a
/// name that had none is not: the manager does that itself at the job's first claim. An old
/// value that does not parse (written before the webhook checked it) leaves nothing to compare
/// with: every name is checked.
pub fn rechecked(old: Option<&str>, new: Option<&str>, pull_secrets: &[String]) -> Vec<String> {
    if old == new {
        return Vec::new();
    }
    let Ok(old) = old.map_or_else(|| Ok(Pins::new()), parse) else {
        return pull_secrets.to_vec();
    };
    // A malformed new value is refused by `validate`; read it as no pins meanwhile.
    let new = new.and_then(|v| parse(v).ok()).unwrap_or_default();
    let changed: BTreeSet<&str> = old
        .iter()
        .filter(|(name, uid)| new.get(*name) != Some(*uid))
        .map(|(name, _)| name.as_str())
        .collect();
    pull_secrets
        .iter()
        .filter(|name| changed.contains(name.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn pins_round_trip_sorted_by_name() {
        let pins = parse("reg=u1, other=u2").expect("valid");
        assert_eq!(pins["reg"], "u1");
        assert_eq!(render(&pins), "other=u2,reg=u1");
        assert_eq!(parse(&render(&pins)), Ok(pins));
        assert_eq!(parse(""), Ok(Pins::new()));
    }

    #[test]
    fn malformed_pins_are_errors_not_panics() {
        for bad in [
            "reg",
            "reg=",
            "=u1",
            "reg=u1=u2",
            "reg=u1,reg=u2",
            "reg=u1,x",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        let annotations = BTreeMap::from([(PULL_SECRET_UIDS.to_owned(), "reg".to_owned())]);
        let errors = validate(&annotations);
        assert_eq!(errors.len(), 1);
        let text = errors[0].to_string();
        assert!(
            text.contains("metadata.annotations[kruise-rs.io/pull-secret-uids]"),
            "{text}"
        );
        assert!(text.contains("not name=uid"), "{text}");
        assert!(of(&annotations).is_err());
        assert_eq!(of(&BTreeMap::new()), Ok(Pins::new()));
    }

    #[test]
    fn only_the_pinned_uid_matches() {
        let pins = parse("reg=u1").expect("valid");
        assert_eq!(check(&pins, "reg", "u1"), Pin::Matches);
        assert_eq!(
            check(&pins, "reg", "u2"),
            Pin::Replaced {
                pinned: "u1".to_owned()
            }
        );
        assert_eq!(check(&pins, "other", "u3"), Pin::Unpinned);
    }

    #[test]
    fn changing_or_removing_a_pin_is_a_new_check_adding_one_is_not() {
        let secrets = names(&["a", "b"]);
        // Unchanged, or only new pins: nothing to check.
        assert!(rechecked(Some("a=1"), Some("a=1"), &secrets).is_empty());
        assert!(rechecked(None, Some("a=1,b=2"), &secrets).is_empty());
        assert!(rechecked(Some("a=1"), Some("a=1,b=2"), &secrets).is_empty());
        // Removed (one entry, or the annotation) or changed: those names.
        assert_eq!(rechecked(Some("a=1,b=2"), Some("b=2"), &secrets), ["a"]);
        assert_eq!(rechecked(Some("a=1,b=2"), None, &secrets), ["a", "b"]);
        assert_eq!(rechecked(Some("a=1,b=2"), Some("a=9,b=2"), &secrets), ["a"]);
        // A pin for a name the job does not pull with guards nothing.
        assert!(rechecked(Some("zzz=1"), None, &secrets).is_empty());
        // An old value that does not parse: every name.
        assert_eq!(rechecked(Some("junk"), None, &secrets), ["a", "b"]);
    }
}
