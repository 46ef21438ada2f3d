//! Whether the author of an ImagePullJob or SidecarSet may read the pull Secrets it names
//! ([decision 0009](../../docs/decisions/0009-pull-secrets-checked-for-the-author.md)).
//!
//! The manager reads any Secret by name and copies a job's pull Secrets into the daemon
//! namespace, where every node can read them. Without this check anyone who may create an
//! ImagePullJob (or a SidecarSet, whose pre-download jobs the manager creates for it) could make
//! the manager copy a Secret they cannot read: a confused deputy. So the validating webhooks ask
//! the apiserver, with a SubjectAccessReview for the requesting user, whether that user may `get`
//! each Secret named, and refuse the object when not.
//!
//! Which Secrets to ask about (`job_reads`, `sidecarset_reads`) and what the answers mean
//! (`verdict`) are pure; [`ask`] is the API call.

use std::collections::BTreeSet;

use futures::{StreamExt, stream};
use k8s_openapi::api::authentication::v1::UserInfo;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};

use kruise_rs_api::imagepulljob::ImagePullJob;
#[cfg(doc)]
use kruise_rs_api::limits::MAX_PULL_SECRETS;
use kruise_rs_api::pull_secret_pins;
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetSpec};
use kruise_rs_api::well_known::{NAMESPACE_NAME_LABEL, PULL_SECRET_UIDS};

/// Why a job is refused, after the per-Secret reasons.
pub(crate) const JOB_RULE: &str = "a job may only name Secrets its author can read";
/// Why a SidecarSet is refused, after the per-Secret reasons.
pub(crate) const SIDECARSET_RULE: &str = "a SidecarSet may only name Secrets its author can read in \
     every namespace it can select (spec.namespace, or a namespaceSelector on \
     kubernetes.io/metadata.name, narrows that)";

/// How many SubjectAccessReviews one admission sends at once.
pub const CONCURRENT_REVIEWS: usize = 8;

/// The most SubjectAccessReviews one admission sends: eight rounds of [`CONCURRENT_REVIEWS`].
/// A job names at most [`MAX_PULL_SECRETS`] Secrets, one review each; a SidecarSet's are
/// reviewed in every namespace it pins by name, so its count is Secrets × namespaces, which
/// nothing else bounds. Eight rounds fit the 5 s a SidecarSet admission has left after its
/// dry-run pod (of the 10 s timeout) as long as a round takes under 600 ms; on the local
/// control plane one takes 15 ms (p50; 44 ms at worst), so a cluster whose authorizers are
/// 14 times slower still fits (decision 0026).
pub const MAX_REVIEWS: usize = 8 * CONCURRENT_REVIEWS;

/// One Secret whose `get` the author must be allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRead {
    /// The field naming it, for the message: `spec.pullSecrets[0]`.
    pub field: String,
    /// Where: one namespace, or `""` for every namespace.
    pub namespace: String,
    pub name: String,
}

impl SecretRead {
    fn describe(&self) -> String {
        if self.namespace.is_empty() {
            format!("Secret {:?} in every namespace", self.name)
        } else {
            format!("Secret \"{}/{}\"", self.namespace, self.name)
        }
    }
}

/// The apiserver's answer for one [`SecretRead`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Allowed,
    Refused,
    /// The review itself failed.
    Unknown(String),
}

/// The Secrets the author of `job` (in `namespace`) must be able to read: each name in
/// `spec.pullSecrets` once (empty names name nothing and are skipped). On UPDATE only names the
/// old object did not already have: those were checked when they were added, for their author,
/// and re-checking them would require whoever edits the job later (a label, a finalizer) to have
/// the author's Secret access. (`pullSecrets` is immutable today, so an update adds none; the
/// rule still holds if that ever changes.) Also, on UPDATE, each name whose uid pin
/// (`kruise-rs.io/pull-secret-uids`) the update changes or removes: that re-arms the job for
/// the Secret found next, so whoever does it must be able to read it (decision 0029).
pub(crate) fn job_reads(
    job: &ImagePullJob,
    namespace: &str,
    old: Option<&ImagePullJob>,
) -> Vec<SecretRead> {
    let pull_secrets = &job.spec.template.pull_secrets;
    let mut reads = pull_secret_reads(
        pull_secrets,
        namespace,
        old.map(|old| old.spec.template.pull_secrets.as_slice()),
    );
    if let Some(old) = old {
        let pin = |job: &ImagePullJob| job.annotations().get(PULL_SECRET_UIDS).cloned();
        let rechecked =
            pull_secret_pins::rechecked(pin(old).as_deref(), pin(job).as_deref(), pull_secrets);
        for (i, name) in pull_secrets.iter().enumerate() {
            let already = reads.iter().any(|r| &r.name == name);
            if rechecked.contains(name) && !already {
                reads.push(SecretRead {
                    field: format!(
                        "metadata.annotations[{PULL_SECRET_UIDS}] for spec.pullSecrets[{i}]"
                    ),
                    namespace: namespace.to_owned(),
                    name: name.clone(),
                });
            }
        }
    }
    reads
}

/// [`job_reads`] for any object whose `spec.pullSecrets` the manager will copy (an
/// ImageListPullJob's go into the ImagePullJob of each of its images): `pull_secrets` now,
/// `old` on UPDATE.
pub(crate) fn pull_secret_reads(
    pull_secrets: &[String],
    namespace: &str,
    old: Option<&[String]>,
) -> Vec<SecretRead> {
    let before: BTreeSet<&str> = old.into_iter().flatten().map(String::as_str).collect();
    let mut seen = BTreeSet::new();
    let mut reads = Vec::new();
    for (i, name) in pull_secrets.iter().enumerate() {
        if name.is_empty() || before.contains(name.as_str()) || !seen.insert(name.as_str()) {
            continue;
        }
        reads.push(SecretRead {
            field: format!("spec.pullSecrets[{i}]"),
            namespace: namespace.to_owned(),
            name: name.clone(),
        });
    }
    reads
}

/// The namespaces a SidecarSet can select, as far as admission can know them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Scope {
    /// At most these: the selector requires `kubernetes.io/metadata.name`, which the apiserver
    /// sets to the namespace's name and keeps there, so no namespace outside can ever match.
    Namespaces(BTreeSet<String>),
    /// Any namespace: other labels can be added to any namespace after admission.
    Cluster,
}

impl Scope {
    /// Whether a read in `namespace` (`""`: every namespace) falls within this scope.
    fn covers(&self, namespace: &str) -> bool {
        match self {
            Self::Cluster => true,
            Self::Namespaces(names) => !namespace.is_empty() && names.contains(namespace),
        }
    }
}

/// Where the pre-download jobs of a SidecarSet with this spec can be created (one per pod
/// namespace): v1alpha1's `spec.namespace` (which wins over `namespaceSelector`), or the
/// namespaces a `namespaceSelector` pins by name; every namespace otherwise.
pub(crate) fn sidecarset_scope(spec: &SidecarSetSpec) -> Scope {
    match spec.effective_namespace_selector() {
        Some(selector) => pinned_namespaces(&selector).map_or(Scope::Cluster, Scope::Namespaces),
        None => Scope::Cluster,
    }
}

/// The names a selector's `kubernetes.io/metadata.name` requirements allow (the intersection of
/// each `matchLabels` value and `In` list: requirements are ANDed), or None when it has none.
fn pinned_namespaces(selector: &LabelSelector) -> Option<BTreeSet<String>> {
    let mut allowed: Option<BTreeSet<String>> = None;
    let mut narrow = |names: BTreeSet<String>| {
        allowed = Some(match allowed.take() {
            Some(before) => before.intersection(&names).cloned().collect(),
            None => names,
        });
    };
    if let Some(value) = selector
        .match_labels
        .as_ref()
        .and_then(|labels| labels.get(NAMESPACE_NAME_LABEL))
    {
        narrow(BTreeSet::from([value.clone()]));
    }
    for requirement in selector.match_expressions.iter().flatten() {
        if requirement.key == NAMESPACE_NAME_LABEL && requirement.operator == "In" {
            narrow(requirement.values.iter().flatten().cloned().collect());
        }
    }
    // No namespace is named "": such a value selects nothing (and must not read as "every").
    if let Some(names) = &mut allowed {
        names.remove("");
    }
    allowed
}

/// The Secrets the author of `set` must be able to read: each `spec.imagePullSecrets` name in
/// each namespace of its [`Scope`] (cluster-wide as one review with namespace `""`). On UPDATE,
/// a name the old object had is skipped where the old scope already covered the namespace (it
/// was checked then); a name in a wider scope than before is checked again.
pub(crate) fn sidecarset_reads(set: &SidecarSet, old: Option<&SidecarSet>) -> Vec<SecretRead> {
    let scope = sidecarset_scope(&set.spec);
    let old_scope = old.map(|old| sidecarset_scope(&old.spec));
    let before: BTreeSet<&str> = old
        .map(|old| {
            old.spec
                .image_pull_secrets
                .iter()
                .map(|r| r.name.as_str())
                .collect()
        })
        .unwrap_or_default();
    let namespaces: Vec<String> = match &scope {
        Scope::Cluster => vec![String::new()],
        Scope::Namespaces(names) => names.iter().cloned().collect(),
    };
    let mut seen = BTreeSet::new();
    let mut reads = Vec::new();
    for (i, secret) in set.spec.image_pull_secrets.iter().enumerate() {
        let name = secret.name.as_str();
        if name.is_empty() || !seen.insert(name) {
            continue;
        }
        for namespace in &namespaces {
            let checked_before = before.contains(name)
                && old_scope.as_ref().is_some_and(|old| old.covers(namespace));
            if !checked_before {
                reads.push(SecretRead {
                    field: format!("spec.imagePullSecrets[{i}]"),
                    namespace: namespace.clone(),
                    name: name.to_owned(),
                });
            }
        }
    }
    reads
}

/// Refuses `reads` when they are more than [`MAX_REVIEWS`]: asking them all could outlast the
/// webhook's timeout. The message names the field, and how many Secrets in how many namespaces.
pub(crate) fn within_budget(reads: &[SecretRead]) -> Result<(), String> {
    if reads.len() <= MAX_REVIEWS {
        return Ok(());
    }
    let secrets: BTreeSet<&str> = reads.iter().map(|r| r.name.as_str()).collect();
    let namespaces: BTreeSet<&str> = reads.iter().map(|r| r.namespace.as_str()).collect();
    let field = reads
        .first()
        .and_then(|r| r.field.split('[').next())
        .unwrap_or("the pull Secrets");
    Err(format!(
        "{field}: checking that the author may read {} Secret(s) in {} namespace(s) takes {} \
         access reviews, more than the {MAX_REVIEWS} the webhook can ask within its timeout; \
         name fewer Secrets, or pin fewer namespaces",
        secrets.len(),
        namespaces.len(),
        reads.len()
    ))
}

/// The admission answer from the reviews' answers (`answers[i]` for `reads[i]`): Ok when every
/// read is allowed, else a message naming each Secret refused or not checked, the user, and
/// `rule`. A review that failed refuses too (fail closed): admitting unchecked would hand the
/// Secret to every node, and the author can simply retry.
pub(crate) fn verdict(
    user: &str,
    reads: &[SecretRead],
    answers: &[Answer],
    rule: &str,
) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut refused = false;
    for (i, read) in reads.iter().enumerate() {
        match answers.get(i) {
            Some(Answer::Allowed) => {}
            Some(Answer::Refused) => {
                refused = true;
                problems.push(format!(
                    "{}: user {user:?} may not get {}",
                    read.field,
                    read.describe()
                ));
            }
            Some(Answer::Unknown(error)) => problems.push(format!(
                "{}: cannot check whether user {user:?} may get {}: {error}",
                read.field,
                read.describe()
            )),
            None => problems.push(format!(
                "{}: cannot check whether user {user:?} may get {}: no answer",
                read.field,
                read.describe()
            )),
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    if refused {
        problems.push(rule.to_owned());
    }
    Err(problems.join("; "))
}

/// The SubjectAccessReview asking whether `user` may `get` the Secret of `read`.
pub fn review(user: &UserInfo, read: &SecretRead) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(read.namespace.clone()),
                verb: Some("get".to_owned()),
                group: Some(String::new()),
                version: Some("v1".to_owned()),
                resource: Some("secrets".to_owned()),
                name: Some(read.name.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    }
}

/// Asks the apiserver about each read, a few at a time; the answers are in `reads`' order.
pub async fn ask(client: &Client, user: &UserInfo, reads: &[SecretRead]) -> Vec<Answer> {
    let api = Api::<SubjectAccessReview>::all(client.clone());
    // The futures are built first (not in a `map` closure over borrowed reads): a closure
    // returning a borrowing future makes the handler's future not provably `Send`.
    let reviews: Vec<_> = reads
        .iter()
        .map(|read| ask_one(api.clone(), review(user, read)))
        .collect();
    stream::iter(reviews)
        .buffered(CONCURRENT_REVIEWS)
        .collect()
        .await
}

async fn ask_one(api: Api<SubjectAccessReview>, review: SubjectAccessReview) -> Answer {
    match api.create(&PostParams::default(), &review).await {
        Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => Answer::Allowed,
        Ok(_) => Answer::Refused,
        Err(e) => Answer::Unknown(e.to_string()),
    }
}

#[cfg(test)]
mod tests;
