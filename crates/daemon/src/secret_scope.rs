//! Which pull secrets may serve one tag: the daemon's half of keeping a job's credentials with
//! that job (decision 0024).
//!
//! A NodeImage lists pull secrets per image, as upstream's shape has them, and several tenants'
//! jobs may own tags of one image. So the list alone does not say whose a secret is: pulling
//! every tag with all of them would let a job without credentials have a private tag pulled with
//! another namespace's (and then run it with `IfNotPresent`). The copy itself says whose it
//! is: the manager copies a job's Secret into the daemons' namespace only after checking that
//! the job's author may read it, and names the jobs it serves in its references annotation. A
//! tag is pulled only with the copies that name one of the tag's owners; a Secret that is not a
//! copy (a job living in the daemons' namespace names its own) serves only owners of that
//! namespace. A tag without owners (written by hand, by whoever may write NodeImage specs) is
//! pulled with every Secret its image lists.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;

use kruise_rs_api::well_known::{SECRET_REFERENCES, SECRET_SOURCE_KEY};

/// The jobs (`namespace/name`) a copy's references annotation names.
fn copy_references(annotations: &BTreeMap<String, String>) -> impl Iterator<Item = &str> {
    annotations
        .get(SECRET_REFERENCES)
        .map_or("", String::as_str)
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// Whether the Secret `namespace/…` with `annotations` may be used to pull a tag whose owners
/// are `owners`.
///
/// A tag without owners was written by hand: only whoever may write NodeImage specs (the
/// manager, which never writes one, and cluster admins) can, so every Secret listed on its
/// image serves it, as upstream's daemon does.
pub(crate) fn serves<'a>(
    namespace: &str,
    annotations: &BTreeMap<String, String>,
    owners: impl IntoIterator<Item = &'a ObjectReference>,
) -> bool {
    let is_copy = annotations.contains_key(SECRET_SOURCE_KEY);
    let mut owners = owners.into_iter().peekable();
    if owners.peek().is_none() {
        return true;
    }
    owners.any(|owner| {
        let (Some(owner_ns), Some(owner_name)) = (&owner.namespace, &owner.name) else {
            return false;
        };
        if is_copy {
            copy_references(annotations).any(|job| {
                job.split_once('/')
                    .is_some_and(|(ns, name)| ns == owner_ns && name == owner_name)
            })
        } else {
            owner_ns == namespace
        }
    })
}

#[cfg(test)]
mod tests;
