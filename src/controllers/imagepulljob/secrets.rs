//! Pull secrets for the node daemons. A daemon may read Secrets only in one namespace
//! (`--daemon-config-namespace`, upstream's `kruise-daemon-config`), so a job's secrets are
//! copied there, one shared copy per source Secret, as upstream's "batch mode" does: the copy
//! names its source (`imagepulljobs.kruise.io/source-key`) and the jobs using it
//! (`imagepulljobs.kruise.io/references`); the last job to let go deletes it.
//!
//! Copies have deterministic names (source name plus a hash of `namespace/name`), so finding one
//! is a GET rather than a list of every Secret in the namespace. Reference updates carry the
//! Secret's resourceVersion: two jobs updating one copy never drop each other.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

use crate::apis::nodeimage::ReferenceObject;
use crate::apis::well_known::{
    SECRET_MODE, SECRET_MODE_BATCH, SECRET_REFERENCES, SECRET_SOURCE_KEY,
};

#[derive(Debug, thiserror::Error)]
pub enum SecretsError {
    #[error("{action} Secret {namespace}/{name}")]
    Kube {
        action: &'static str,
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

/// Name of the shared copy of `namespace/name`: readable, unique, at most 253 characters.
pub fn copy_name(namespace: &str, name: &str) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (namespace, name).hash(&mut h);
    let suffix = format!("{:08x}", h.finish() as u32);
    let keep = 253 - suffix.len() - 1;
    let base: String = name.chars().take(keep).collect();
    format!("{}-{suffix}", base.trim_end_matches(['-', '.']))
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

/// `copy` brought in line with `source` and serving `job`; `None` if it already is.
pub fn refreshed_copy(copy: &Secret, source: &Secret, job: &str) -> Option<Secret> {
    let mut refs = references(copy);
    let mut updated = copy.clone();
    let mut changed = refs.insert(job.to_owned());
    if copy.data != source.data
        || copy.string_data != source.string_data
        || copy.type_ != source.type_
    {
        updated.data = source.data.clone();
        updated.string_data = source.string_data.clone();
        updated.type_ = source.type_.clone();
        changed = true;
    }
    updated
        .annotations_mut()
        .insert(SECRET_REFERENCES.into(), join(&refs));
    changed.then_some(updated)
}

/// A new copy of `source` in `namespace`, serving `job`.
pub fn new_copy(source: &Secret, namespace: &str, job: &str) -> Secret {
    let source_ns = source.namespace().unwrap_or_default();
    let source_name = source.name_any();
    Secret {
        metadata: ObjectMeta {
            name: Some(copy_name(&source_ns, &source_name)),
            namespace: Some(namespace.to_owned()),
            labels: source.metadata.labels.clone(),
            annotations: Some(BTreeMap::from([
                (
                    SECRET_SOURCE_KEY.to_owned(),
                    format!("{source_ns}/{source_name}"),
                ),
                (SECRET_REFERENCES.to_owned(), job.to_owned()),
                (SECRET_MODE.to_owned(), SECRET_MODE_BATCH.to_owned()),
            ])),
            ..Default::default()
        },
        data: source.data.clone(),
        string_data: source.string_data.clone(),
        type_: source.type_.clone(),
        ..Default::default()
    }
}

/// What the NodeImage lists for a copy.
pub fn reference_object(namespace: &str, copy: &str) -> ReferenceObject {
    ReferenceObject {
        namespace: Some(namespace.to_owned()),
        name: Some(copy.to_owned()),
        mode: Some(SECRET_MODE_BATCH.to_owned()),
    }
}

/// Copies the job's secrets into `daemon_ns` (creating the namespace if needed) and returns the
/// references for its NodeImage entries, plus the names of source Secrets that do not exist.
pub async fn claim(
    client: &Client,
    daemon_ns: &str,
    job_ns: &str,
    job: &str,
    secret_names: &[String],
) -> Result<(Vec<ReferenceObject>, Vec<String>), SecretsError> {
    let job_key = format!("{job_ns}/{job}");
    if job_ns == daemon_ns {
        // The daemons read this namespace already.
        let refs = secret_names.iter().map(|s| ReferenceObject {
            namespace: Some(job_ns.into()),
            name: Some(s.clone()),
            mode: None,
        });
        return Ok((refs.collect(), Vec::new()));
    }
    ensure_namespace(client, daemon_ns).await?;
    let sources: Api<Secret> = Api::namespaced(client.clone(), job_ns);
    let copies: Api<Secret> = Api::namespaced(client.clone(), daemon_ns);
    let (mut refs, mut missing) = (Vec::new(), Vec::new());
    for name in secret_names {
        let source = match sources
            .get_opt(name)
            .await
            .map_err(kube_err("reading", job_ns, name))?
        {
            Some(source) => source,
            None => {
                missing.push(name.clone());
                continue;
            }
        };
        let copy = copy_name(job_ns, name);
        loop {
            match copies
                .get_opt(&copy)
                .await
                .map_err(kube_err("reading", daemon_ns, &copy))?
            {
                None => match copies
                    .create(
                        &PostParams::default(),
                        &new_copy(&source, daemon_ns, &job_key),
                    )
                    .await
                {
                    Ok(_) => break,
                    Err(e) if is_status(&e, 409) => continue, // another job created it just now
                    Err(e) => return Err(kube_err("creating", daemon_ns, &copy)(e)),
                },
                Some(existing) => match refreshed_copy(&existing, &source, &job_key) {
                    None => break,
                    Some(updated) => match copies
                        .replace(&copy, &PostParams::default(), &updated)
                        .await
                    {
                        Ok(_) => break,
                        Err(e) if is_status(&e, 409) => continue, // someone else updated it: redo on fresh data
                        Err(e) => return Err(kube_err("updating", daemon_ns, &copy)(e)),
                    },
                },
            }
        }
        refs.push(reference_object(daemon_ns, &copy));
    }
    Ok((refs, missing))
}

/// Drops the job from the copies of its secrets, deleting copies nobody uses any more.
pub async fn release(
    client: &Client,
    daemon_ns: &str,
    job_ns: &str,
    job: &str,
    secret_names: &[String],
) -> Result<(), SecretsError> {
    if job_ns == daemon_ns {
        return Ok(());
    }
    let job_key = format!("{job_ns}/{job}");
    let copies: Api<Secret> = Api::namespaced(client.clone(), daemon_ns);
    for name in secret_names {
        let copy = copy_name(job_ns, name);
        loop {
            let Some(existing) = copies
                .get_opt(&copy)
                .await
                .map_err(kube_err("reading", daemon_ns, &copy))?
            else {
                break;
            };
            let mut refs = references(&existing);
            if !refs.remove(&job_key) {
                break;
            }
            let result = if refs.is_empty() {
                let precondition = kube::api::Preconditions {
                    resource_version: existing.resource_version(),
                    uid: existing.uid(),
                };
                copies
                    .delete(
                        &copy,
                        &DeleteParams {
                            preconditions: Some(precondition),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|_| ())
            } else {
                let mut updated = existing.clone();
                updated
                    .annotations_mut()
                    .insert(SECRET_REFERENCES.into(), join(&refs));
                copies
                    .replace(&copy, &PostParams::default(), &updated)
                    .await
                    .map(|_| ())
            };
            match result {
                Ok(()) => break,
                Err(e) if is_status(&e, 409) => continue,
                Err(e) if is_status(&e, 404) => break,
                Err(e) => return Err(kube_err("releasing", daemon_ns, &copy)(e)),
            }
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
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    fn secret(ns: &str, name: &str, data: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                ".dockerconfigjson".to_owned(),
                ByteString(data.as_bytes().to_vec()),
            )])),
            type_: Some("kubernetes.io/dockerconfigjson".into()),
            ..Default::default()
        }
    }

    #[test]
    fn copy_names_are_stable_distinct_and_valid() {
        assert_eq!(copy_name("a", "reg"), copy_name("a", "reg"));
        assert_ne!(copy_name("a", "reg"), copy_name("b", "reg"));
        assert!(copy_name("a", "reg").starts_with("reg-"));
        let long = "x".repeat(253);
        assert!(copy_name("a", &long).len() <= 253);
    }

    #[test]
    fn a_new_copy_names_its_source_and_first_job() {
        let copy = new_copy(
            &secret("team", "reg", "{}"),
            "kruise-daemon-config",
            "team/job1",
        );
        let a = copy.annotations();
        assert_eq!(a[SECRET_SOURCE_KEY], "team/reg");
        assert_eq!(a[SECRET_REFERENCES], "team/job1");
        assert_eq!(a[SECRET_MODE], "batch");
        assert_eq!(copy.namespace().as_deref(), Some("kruise-daemon-config"));
        assert_eq!(copy.data, secret("team", "reg", "{}").data);
    }

    #[test]
    fn refreshing_adds_the_job_and_new_data_once() {
        let source = secret("team", "reg", "{}");
        let copy = new_copy(&source, "d", "team/job1");
        assert!(
            refreshed_copy(&copy, &source, "team/job1").is_none(),
            "nothing to do"
        );
        let both = refreshed_copy(&copy, &source, "team/job2").expect("job2 added");
        assert_eq!(
            references(&both),
            BTreeSet::from(["team/job1".to_owned(), "team/job2".to_owned()])
        );
        let rotated = secret("team", "reg", "{\"auths\":{}}");
        let updated = refreshed_copy(&both, &rotated, "team/job2").expect("data refreshed");
        assert_eq!(updated.data, rotated.data);
    }

    #[test]
    fn references_tolerate_spaces_and_empty_entries() {
        let mut s = secret("d", "c", "");
        s.annotations_mut()
            .insert(SECRET_REFERENCES.into(), " a/x, ,b/y,".into());
        assert_eq!(
            references(&s),
            BTreeSet::from(["a/x".to_owned(), "b/y".to_owned()])
        );
    }
}
