//! Pull secrets for the node daemons. A daemon may read Secrets only in one namespace
//! (`--daemon-config-namespace`, upstream's `kruise-daemon-config`), so a job's secrets are
//! copied there, one shared copy per source Secret, as upstream's "batch mode" does: the copy
//! names its source (`imagepulljobs.kruise.io/source-key`) and the jobs using it
//! (`imagepulljobs.kruise.io/references`); the last job to let go deletes it.
//!
//! - **Only pull secrets travel.** A source Secret is copied (or, for a job in the daemons' own
//!   namespace, referenced in place) only if its type is `kubernetes.io/dockerconfigjson` or
//!   `kubernetes.io/dockercfg` (`check_type`). Anything else (a service-account token, an
//!   Opaque Secret named by mistake) would hand a credential to every daemon for nothing: the
//!   job gets a `Problem` (Warning event and status message) and pulls without it.
//! - **Names.** A copy's name is the source name plus SHA-256 of `namespace/name`
//!   ([`copy_name`]), stable across Rust releases and manager versions, so claiming a copy is a
//!   GET, not a list.
//! - **A copy is reused only if it says it is one.** A Secret at the copy name whose source
//!   annotation is not exactly this source (a collision, or pre-created by someone) is neither
//!   reused nor overwritten (`refresh_copy`): the job reports the conflict and pulls without
//!   it.
//! - **Only the Secret the author was checked against** (decision 0029). A job pins each
//!   Secret's uid before its first copy (`pins_to_add`); a Secret of that name with another
//!   uid (deleted and created again) is not copied, and the job gives up its copy, as it does
//!   when the Secret is gone (`claim`). The copy records its source's uid, so a copy refreshed
//!   for a re-armed job serves that job only (`refresh_copy`).
//! - **Releasing finds copies by their annotations, not their names.** `release` lists the
//!   namespace and lets go of every copy of a source in the job's namespace that lists the job,
//!   whatever its name (`release_action`). That covers copies named the way earlier versions
//!   named them (a `DefaultHasher` suffix): NodeImage entries written then still name them, so
//!   they live exactly as long as a job references them and go with the last one, like any
//!   other copy.
//! - **A job's deletion never waits for the manager** (decision 0030): jobs carry no finalizer.
//!   A finished job releases its copies; a deleted one is gone at once, and `sweep` (after
//!   every job deletion event and every full list of the jobs, hence at start) drops the
//!   references to jobs that no longer exist, deleting the copies left serving none.
//!
//! Reference updates and deletes carry the Secret's resourceVersion (and uid): two jobs updating
//! one copy never drop each other.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::{Client, ResourceExt};

use crate::compact_nodeimage::ReferenceObject;
use kruise_rs_api::imagepulljob::ImagePullJob;
use kruise_rs_api::pull_secret_pins::{self, Pin, Pins};
use kruise_rs_api::well_known::{
    PULL_SECRET_UIDS, SECRET_MODE, SECRET_MODE_BATCH, SECRET_REFERENCES, SECRET_SOURCE_KEY,
    SECRET_SOURCE_UID,
};

/// The Secret types a registry credential comes in; the only ones copied for the daemons.
pub(crate) const PULL_SECRET_TYPES: [&str; 2] =
    ["kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg"];

/// Hex characters of SHA-256 kept in a copy name. 64 bits: an accidental collision among the
/// copies of one namespace is negligible (about n²/2⁶⁵ for n sources), and a collision, accidental
/// or crafted, is refused rather than shared ([`refresh_copy`]), so the hash need not resist
/// one; the rest of the name stays for the readable prefix.
const HASH_HEX: usize = 16;

/// A Secret's longest name (a DNS subdomain).
const MAX_NAME: usize = 253;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretsError {
    #[error("{action} Secret {namespace}/{name}")]
    Kube {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading ImagePullJob {namespace}/{name}")]
    ReadJob {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

fn kube_err(
    action: &'static str,
    namespace: &str,
    name: &str,
) -> impl FnOnce(kube::Error) -> SecretsError {
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    move |source| SecretsError::Kube {
        action,
        namespace,
        name,
        source,
    }
}

fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == code)
}

/// Why one of a job's `pullSecrets` is not given to the daemons. The job pulls without it; the
/// reconcile reports each as a Warning event (`reason`) and in the job's status message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// No Secret of that name in the job's namespace.
    NotFound { namespace: String, name: String },
    /// The Secret is not a registry credential (`type_`: its type, `None` if it has none).
    NotAPullSecret {
        namespace: String,
        name: String,
        type_: Option<String>,
    },
    /// A Secret already sits at the copy's name and is not a copy of this source (`found`: the
    /// source it names, `None` if it names none).
    CopyConflict {
        source: String,
        copy_namespace: String,
        copy: String,
        found: Option<String>,
    },
    /// The Secret is not the one the job's author was checked against (`pinned`: that one's
    /// uid, `None` if the job pins none; `found`: this one's).
    Replaced {
        namespace: String,
        name: String,
        pinned: Option<String>,
        found: String,
    },
    /// The job's pin annotation does not parse (`error`): no Secret is known to be checked.
    PinsUnreadable { error: String },
}

impl Problem {
    /// The event reason.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Problem::NotFound { .. } => "PullSecretNotFound",
            Problem::NotAPullSecret { .. } => "PullSecretWrongType",
            Problem::CopyConflict { .. } => "PullSecretCopyConflict",
            Problem::Replaced { .. } => "PullSecretReplaced",
            Problem::PinsUnreadable { .. } => "PullSecretPinsUnreadable",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NotFound { namespace, name } => write!(
                f,
                "spec.pullSecrets: Secret {name} not found in namespace {namespace}; pulling without it"
            ),
            Problem::NotAPullSecret {
                namespace,
                name,
                type_,
            } => write!(
                f,
                "spec.pullSecrets: Secret {namespace}/{name} has type {}, not {}; not given to the \
                 node daemons, pulling without it",
                type_.as_deref().unwrap_or("(none)"),
                PULL_SECRET_TYPES.join(" or "),
            ),
            Problem::CopyConflict {
                source,
                copy_namespace,
                copy,
                found,
            } => write!(
                f,
                "spec.pullSecrets: the copy of Secret {source} would be {copy_namespace}/{copy}, \
                 which exists and is {}; left untouched, pulling without it",
                match found {
                    Some(found) => format!("a copy of {found}"),
                    None => "no copy (no source annotation)".to_owned(),
                }
            ),
            Problem::Replaced {
                namespace,
                name,
                pinned,
                found,
            } => write!(
                f,
                "spec.pullSecrets: Secret {namespace}/{name} (uid {found}) is not the Secret the \
                 job's author was checked against ({}); not given to the node daemons (a copy \
                 made earlier is withdrawn), pulling without it. A new check re-arms the job: \
                 remove the job's annotation {PULL_SECRET_UIDS} (whoever does must be allowed \
                 to get the Secret), or recreate the job",
                match pinned {
                    Some(pinned) => format!("uid {pinned}"),
                    None => "none is pinned".to_owned(),
                }
            ),
            Problem::PinsUnreadable { error } => write!(
                f,
                "metadata.annotations[{PULL_SECRET_UIDS}]: {error}; no pull Secret is given \
                 to the node daemons until it is removed (whoever removes it must be allowed to \
                 get the Secrets)"
            ),
        }
    }
}

/// `Ok` if `secret` is a registry credential, the only kind given to the daemons.
pub(crate) fn check_type(secret: &Secret) -> Result<(), Problem> {
    match secret.type_.as_deref() {
        Some(t) if PULL_SECRET_TYPES.contains(&t) => Ok(()),
        other => Err(Problem::NotAPullSecret {
            namespace: secret.namespace().unwrap_or_default(),
            name: secret.name_any(),
            type_: other.map(str::to_owned),
        }),
    }
}

/// Name of the shared copy of `namespace/name`: a readable prefix from `name`, `-`, and the
/// first 16 (`HASH_HEX`) hex characters of SHA-256 of `namespace/name`. Always a valid Secret name
/// (DNS subdomain, at most 253 characters), whatever `name` holds.
pub fn copy_name(namespace: &str, name: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}/{name}").as_bytes(),
    );
    let hash: String = digest
        .as_ref()
        .iter()
        .flat_map(|b| [b >> 4, b & 0xf])
        .take(HASH_HEX)
        .map(|n| char::from_digit(u32::from(n), 16).unwrap_or('0'))
        .collect();
    // Only [a-z0-9-] in the prefix: no label of the result can then start or end badly or be
    // empty once the ends are trimmed ('.' would start a new label).
    let prefix: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .take(MAX_NAME - HASH_HEX - 1)
        .collect();
    let prefix = prefix.trim_matches('-');
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// The jobs (`namespace/name`) a copy says it serves.
pub fn references(secret: &Secret) -> BTreeSet<String> {
    secret
        .annotations()
        .get(SECRET_REFERENCES)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn join(refs: &BTreeSet<String>) -> String {
    refs.iter().cloned().collect::<Vec<_>>().join(",")
}

fn source_key(secret: &Secret) -> String {
    format!(
        "{}/{}",
        secret.namespace().unwrap_or_default(),
        secret.name_any()
    )
}

/// What to do with the Secret found at a copy's name.
#[derive(Debug, PartialEq)]
pub(crate) enum CopyUpdate {
    /// It is the copy, current and serving the job.
    Current,
    /// It is the copy: write this (the job added, the source's data).
    Update(Box<Secret>),
    /// It is not a copy of this source (its source annotation names another, or none): leave
    /// it alone. `found` is what the annotation says.
    Conflict { found: Option<String> },
}

/// `copy` brought in line with `source` and serving `job`, if it is a copy of `source`.
/// `job` must be pinned to `source`'s uid. A copy of an earlier Secret of that name (its
/// source uid differs) serves only `job` from now on: the other jobs it listed were checked
/// against the earlier one. A copy without a source uid (made before uids were recorded)
/// keeps its jobs: each gives it up at its next claim unless pinned to this uid.
pub(crate) fn refresh_copy(copy: &Secret, source: &Secret, job: &str) -> CopyUpdate {
    let found = copy.annotations().get(SECRET_SOURCE_KEY);
    if found.map(String::as_str) != Some(source_key(source).as_str()) {
        return CopyUpdate::Conflict {
            found: found.cloned(),
        };
    }
    let uid = source.uid().unwrap_or_default();
    let copied_uid = copy.annotations().get(SECRET_SOURCE_UID);
    let mut refs = match copied_uid {
        Some(copied) if *copied != uid => BTreeSet::new(),
        _ => references(copy),
    };
    let mut updated = copy.clone();
    let mut changed = refs.insert(job.to_owned()) || copied_uid != Some(&uid);
    updated
        .annotations_mut()
        .insert(SECRET_SOURCE_UID.into(), uid);
    if copy.data != source.data
        || copy.string_data != source.string_data
        || copy.type_ != source.type_
    {
        updated.data = source.data.clone();
        updated.string_data = source.string_data.clone();
        updated.type_ = source.type_.clone();
        changed = true;
    }
    if !changed {
        return CopyUpdate::Current;
    }
    updated
        .annotations_mut()
        .insert(SECRET_REFERENCES.into(), join(&refs));
    CopyUpdate::Update(Box::new(updated))
}

/// A new copy of `source` in `namespace`, serving `job`.
pub(crate) fn new_copy(source: &Secret, namespace: &str, job: &str) -> Secret {
    let source_ns = source.namespace().unwrap_or_default();
    let source_name = source.name_any();
    Secret {
        metadata: ObjectMeta {
            name: Some(copy_name(&source_ns, &source_name)),
            namespace: Some(namespace.to_owned()),
            labels: source.metadata.labels.clone(),
            annotations: Some(BTreeMap::from([
                (SECRET_SOURCE_KEY.to_owned(), source_key(source)),
                (SECRET_REFERENCES.to_owned(), job.to_owned()),
                (SECRET_MODE.to_owned(), SECRET_MODE_BATCH.to_owned()),
                (
                    SECRET_SOURCE_UID.to_owned(),
                    source.uid().unwrap_or_default(),
                ),
            ])),
            ..Default::default()
        },
        data: source.data.clone(),
        string_data: source.string_data.clone(),
        type_: source.type_.clone(),
        ..Default::default()
    }
}

/// What releasing a job does to one Secret of the daemons' namespace.
#[derive(Debug, PartialEq)]
pub(crate) enum Release {
    /// The job was its last reference: delete it.
    Delete,
    /// Write it with the job dropped from its references.
    Update(Box<Secret>),
}

/// What releasing `job` (`namespace/name`, in `job_ns`) does to `secret`: `None` unless it is a
/// copy of a Secret in `job_ns` (its source annotation says so) that lists the job. Its name
/// does not matter: copies named by earlier versions go the same way.
pub(crate) fn release_action(secret: &Secret, job_ns: &str, job: &str) -> Option<Release> {
    let source = secret.annotations().get(SECRET_SOURCE_KEY)?;
    if source.split_once('/').map(|(ns, _)| ns) != Some(job_ns) {
        return None;
    }
    let mut refs = references(secret);
    if !refs.remove(job) {
        return None;
    }
    if refs.is_empty() {
        return Some(Release::Delete);
    }
    let mut updated = secret.clone();
    updated
        .annotations_mut()
        .insert(SECRET_REFERENCES.into(), join(&refs));
    Some(Release::Update(Box::new(updated)))
}

/// `namespace` and `name` of a reference (`namespace/name`); `None` if it names no job: the
/// parts must be a valid namespace and object name, as they go into the path of a GET.
pub(crate) fn parse_reference(reference: &str) -> Option<(&str, &str)> {
    let (ns, name) = reference.split_once('/')?;
    let valid = |part: &str, max: usize, dots: bool| {
        part.len() <= max
            && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && part.chars().all(|c| {
                c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.')
            })
    };
    (valid(ns, 63, false) && valid(name, MAX_NAME, true)).then_some((ns, name))
}

/// The references of `secret`, if it is a copy (it has a source annotation), that `exists`
/// cannot vouch for: the jobs the sweep must look up. References that name no job are never
/// candidates: nothing could release them, so nothing sweeps them either.
pub(crate) fn sweep_candidates(
    secret: &Secret,
    exists: impl Fn(&str, &str) -> bool,
) -> BTreeSet<String> {
    if !secret.annotations().contains_key(SECRET_SOURCE_KEY) {
        return BTreeSet::new();
    }
    references(secret)
        .into_iter()
        .filter(|r| parse_reference(r).is_some_and(|(ns, name)| !exists(ns, name)))
        .collect()
}

/// What the sweep does to `secret` given the jobs known to be `gone`: `None` unless it is a copy
/// that lists one of them; a copy whose references are all gone is deleted. A copy that lists no
/// job at all is left alone (no version of kruise-rs leaves one; whoever made it owns it).
pub(crate) fn sweep_action(secret: &Secret, gone: &BTreeSet<String>) -> Option<Release> {
    if !secret.annotations().contains_key(SECRET_SOURCE_KEY) {
        return None;
    }
    let mut refs = references(secret);
    let before = refs.len();
    refs.retain(|r| !gone.contains(r));
    if refs.len() == before {
        return None;
    }
    if refs.is_empty() {
        return Some(Release::Delete);
    }
    let mut updated = secret.clone();
    updated
        .annotations_mut()
        .insert(SECRET_REFERENCES.into(), join(&refs));
    Some(Release::Update(Box::new(updated)))
}

/// What the NodeImage lists for a copy.
pub(crate) fn reference_object(namespace: &str, copy: &str) -> ReferenceObject {
    ReferenceObject {
        namespace: Some(namespace.to_owned()),
        name: Some(copy.to_owned()),
        mode: Some(SECRET_MODE_BATCH.to_owned()),
    }
}

/// What [`claim`] gives the daemons, and what it could not.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    /// The references for the job's NodeImage entries, in `pullSecrets` order.
    pub refs: Vec<ReferenceObject>,
    /// The `pullSecrets` left out, and why.
    pub problems: Vec<Problem>,
    /// Whether a copy lists the job now that did not before: a job deleted meanwhile would be
    /// listed with nothing left to release it, so the caller checks it still exists.
    pub added_reference: bool,
}

/// The job's `pullSecrets` as found in its namespace now (`None`: no such Secret), in order.
pub(crate) async fn read_sources(
    client: &Client,
    job_ns: &str,
    secret_names: &[String],
) -> Result<Vec<(String, Option<Secret>)>, SecretsError> {
    let sources: Api<Secret> = Api::namespaced(client.clone(), job_ns);
    let mut found = Vec::with_capacity(secret_names.len());
    for name in secret_names {
        let source = sources
            .get_opt(name)
            .await
            .map_err(kube_err("reading", job_ns, name))?;
        found.push((name.clone(), source));
    }
    Ok(found)
}

/// `pins` with the uid of every Secret in `sources` that will be copied and is not pinned yet,
/// or `None` when nothing is to be added. These are pinned on the job before the first copy:
/// a copy is never made of a Secret the job does not pin.
pub(crate) fn pins_to_add(pins: &Pins, sources: &[(String, Option<Secret>)]) -> Option<Pins> {
    let mut added = pins.clone();
    for (name, source) in sources {
        let Some(source) = source else { continue };
        let Some(uid) = source.uid() else { continue };
        if check_type(source).is_ok() && !added.contains_key(name) {
            added.insert(name.clone(), uid);
        }
    }
    (added != *pins).then_some(added)
}

/// Gives the job's pull secrets (`sources`, from [`read_sources`]) to the daemons: copies them
/// into `daemon_ns` (creating the namespace if needed), or references them in place for a job
/// in `daemon_ns` itself. A Secret the job does not pin (`pins`), or whose uid is not the one
/// pinned, is not copied, and the job gives up any copy it holds of that name; so does a job
/// whose Secret is gone.
pub(crate) async fn claim(
    client: &Client,
    daemon_ns: &str,
    job_ns: &str,
    job: &str,
    sources: &[(String, Option<Secret>)],
    pins: &Pins,
) -> Result<Claimed, SecretsError> {
    let job_key = format!("{job_ns}/{job}");
    let copies: Api<Secret> = Api::namespaced(client.clone(), daemon_ns);
    let mut claimed = Claimed::default();
    let in_place = job_ns == daemon_ns;
    if !in_place {
        ensure_namespace(client, daemon_ns).await?;
    }
    for (name, source) in sources {
        let copy = copy_name(job_ns, name);
        let source = match source {
            Some(source) => source,
            None => {
                claimed.problems.push(Problem::NotFound {
                    namespace: job_ns.to_owned(),
                    name: name.clone(),
                });
                if !in_place {
                    // That Secret can never come back (a new one has a new uid): its
                    // credentials go with it.
                    give_up(&copies, daemon_ns, &copy, job_ns, &job_key).await?;
                }
                continue;
            }
        };
        if let Err(problem) = check_type(source) {
            claimed.problems.push(problem);
            continue;
        }
        if in_place {
            // The daemons read this namespace already.
            claimed.refs.push(ReferenceObject {
                namespace: Some(job_ns.into()),
                name: Some(name.clone()),
                mode: None,
            });
            continue;
        }
        let found = source.uid().unwrap_or_default();
        let pinned = match pull_secret_pins::check(pins, name, &found) {
            Pin::Matches => None,
            Pin::Unpinned => Some(None),
            Pin::Replaced { pinned } => Some(Some(pinned)),
        };
        if let Some(pinned) = pinned {
            claimed.problems.push(Problem::Replaced {
                namespace: job_ns.to_owned(),
                name: name.clone(),
                pinned,
                found,
            });
            give_up(&copies, daemon_ns, &copy, job_ns, &job_key).await?;
            continue;
        }
        let conflict = loop {
            let existing = copies
                .get_opt(&copy)
                .await
                .map_err(kube_err("reading", daemon_ns, &copy))?;
            let adds = existing
                .as_ref()
                .is_none_or(|e| !references(e).contains(&job_key));
            let result = match existing {
                None => copies
                    .create(
                        &PostParams::default(),
                        &new_copy(source, daemon_ns, &job_key),
                    )
                    .await
                    .map_err(|e| ("creating", e)),
                Some(existing) => match refresh_copy(&existing, source, &job_key) {
                    CopyUpdate::Current => break None,
                    CopyUpdate::Conflict { found } => break Some(found),
                    CopyUpdate::Update(updated) => copies
                        .replace(&copy, &PostParams::default(), &updated)
                        .await
                        .map_err(|e| ("updating", e)),
                },
            };
            match result {
                Ok(_) => {
                    claimed.added_reference |= adds;
                    break None;
                }
                // Created or changed by someone else just now: decide again on fresh data.
                Err((_, e)) if is_status(&e, 409) => continue,
                Err((action, e)) => return Err(kube_err(action, daemon_ns, &copy)(e)),
            }
        };
        match conflict {
            None => claimed.refs.push(reference_object(daemon_ns, &copy)),
            Some(found) => claimed.problems.push(Problem::CopyConflict {
                source: format!("{job_ns}/{name}"),
                copy_namespace: daemon_ns.to_owned(),
                copy,
                found,
            }),
        }
    }
    Ok(claimed)
}

/// Drops the job from the copy named `copy`, if that is a copy it holds (deleting it when the
/// job was its last).
async fn give_up(
    copies: &Api<Secret>,
    daemon_ns: &str,
    copy: &str,
    job_ns: &str,
    job_key: &str,
) -> Result<(), SecretsError> {
    match copies
        .get_opt(copy)
        .await
        .map_err(kube_err("reading", daemon_ns, copy))?
    {
        Some(secret) => {
            settle(copies, daemon_ns, secret, |s| {
                release_action(s, job_ns, job_key)
            })
            .await
        }
        None => Ok(()),
    }
}

/// Drops the job from every copy that lists it, deleting the copies nobody uses any more.
pub(crate) async fn release(
    client: &Client,
    daemon_ns: &str,
    job_ns: &str,
    job: &str,
) -> Result<(), SecretsError> {
    if job_ns == daemon_ns {
        return Ok(());
    }
    let job_key = format!("{job_ns}/{job}");
    let copies: Api<Secret> = Api::namespaced(client.clone(), daemon_ns);
    // A list, not a GET per name: copies named by earlier versions are found by their
    // annotations. A copy listed here and changed since is re-read on the write's 409.
    let listed = copies
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing", daemon_ns, ""))?;
    for secret in listed.items {
        settle(&copies, daemon_ns, secret, |s| {
            release_action(s, job_ns, &job_key)
        })
        .await?;
    }
    Ok(())
}

/// Drops the references to jobs that no longer exist from every copy in `daemon_ns`, deleting
/// the copies left serving none. `in_store`: whether the caller's job store holds the job
/// (`namespace`, `name`); any other is looked up, and only a 404 counts as gone, so jobs outside
/// the caller's watch, or not seen by it yet, keep their references. Returns how many copies
/// were updated or deleted.
pub(crate) async fn sweep(
    client: &Client,
    daemon_ns: &str,
    in_store: impl Fn(&str, &str) -> bool,
) -> Result<usize, SecretsError> {
    let copies: Api<Secret> = Api::namespaced(client.clone(), daemon_ns);
    let listed = copies
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing", daemon_ns, ""))?
        .items;
    let mut gone = BTreeSet::new();
    let mut present = BTreeSet::new();
    for secret in &listed {
        for reference in sweep_candidates(secret, &in_store) {
            if gone.contains(&reference) || present.contains(&reference) {
                continue;
            }
            let Some((namespace, name)) = parse_reference(&reference) else {
                continue;
            };
            let jobs: Api<ImagePullJob> = Api::namespaced(client.clone(), namespace);
            match jobs.get_metadata_opt(name).await {
                Ok(None) => gone.insert(reference),
                Ok(Some(_)) => present.insert(reference),
                Err(source) => {
                    return Err(SecretsError::ReadJob {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                        source,
                    });
                }
            };
        }
    }
    if gone.is_empty() {
        return Ok(0);
    }
    let mut settled = 0;
    for secret in listed {
        if sweep_action(&secret, &gone).is_some() {
            settle(&copies, daemon_ns, secret, |s| sweep_action(s, &gone)).await?;
            settled += 1;
        }
    }
    Ok(settled)
}

/// Applies `action` to `secret` until it has nothing more to do: each write is guarded by the
/// resourceVersion it was decided on, and a 409 decides again on the Secret as it is now.
async fn settle(
    copies: &Api<Secret>,
    daemon_ns: &str,
    mut secret: Secret,
    action: impl Fn(&Secret) -> Option<Release>,
) -> Result<(), SecretsError> {
    let name = secret.name_any();
    while let Some(action) = action(&secret) {
        let result = match action {
            Release::Delete => {
                let precondition = Preconditions {
                    resource_version: secret.resource_version(),
                    uid: secret.uid(),
                };
                let params = DeleteParams {
                    preconditions: Some(precondition),
                    ..Default::default()
                };
                copies.delete(&name, &params).await.map(|_| ())
            }
            Release::Update(updated) => copies
                .replace(&name, &PostParams::default(), &updated)
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => break,
            Err(e) if is_status(&e, 409) => {
                match copies
                    .get_opt(&name)
                    .await
                    .map_err(kube_err("reading", daemon_ns, &name))?
                {
                    Some(fresh) => secret = fresh,
                    None => break,
                }
            }
            Err(e) if is_status(&e, 404) => break,
            Err(e) => return Err(kube_err("releasing", daemon_ns, &name)(e)),
        }
    }
    Ok(())
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<(), SecretsError> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt(name)
        .await
        .map_err(kube_err("reading the namespace of", name, ""))?
        .is_some()
    {
        return Ok(());
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(kube_err("creating the namespace of", name, "")(e)),
    }
}

#[cfg(test)]
mod tests;
