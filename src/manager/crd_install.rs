//! `kruise-rs crds --install`: installs our CustomResourceDefinitions, or switches the ones
//! upstream OpenKruise left behind, so that [`check_crds`](super::crds::check_crds) passes.
//!
//! For each CRD, in [`crd::crds`] order:
//! 1. read it; if it exists and converts otherwise than with strategy `None` (upstream 1.9's
//!    SidecarSet CRD has a conversion webhook pointing at kruise-manager), merge-patch
//!    `spec.conversion` to `{strategy: None, webhook: null}` ([`conversion_reset_patch`]): an
//!    apply alone cannot remove the webhook stanza, which kubectl or Helm owns;
//! 2. server-side apply ours, as field manager `FIELD_MANAGER`, forcing conflicts (upstream's
//!    kubectl or Helm own the fields we take over);
//! 3. wait until it is Established;
//! 4. read one existing object back by name in every served version, until that works: a
//!    changed conversion takes a moment to reach the apiserver's handlers, and a LIST can answer
//!    from the watch cache while a GET would still fail.
//!
//! Running it again changes nothing and says so. The decisions (`needs_conversion_reset`,
//! [`Applied::of`], `established`) are pure functions.

use std::fmt;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use tokio::time::Instant;

use super::crds::{Conversion, CrdState, conversion_reset_patch};
use kruise_rs_api::crd;
use kruise_rs_kube::backoff::jittered;

/// The field manager of everything `crds --install` writes.
pub(crate) const FIELD_MANAGER: &str = "kruise-rs";

/// How often the CRD and the objects are read again while waiting.
const POLL: Duration = Duration::from_millis(200);

/// Why `crds --install` stopped; the CRDs before the failing one are done.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot read the CustomResourceDefinition {name}")]
    Read {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "cannot remove the conversion webhook of the CustomResourceDefinition {name} (merge patch \
         of spec.conversion; needs `patch` on customresourcedefinitions)"
    )]
    ResetConversion {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot apply the CustomResourceDefinition {name}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the CustomResourceDefinition {name} has no name in the generated CRDs")]
    Unnamed { name: String },
    #[error("the apiserver rejected the CustomResourceDefinition {name}: {reason}")]
    Rejected { name: String, reason: String },
    #[error(
        "the CustomResourceDefinition {name} is not Established after {timeout:?} (conditions: \
         {conditions})"
    )]
    NotEstablished {
        name: String,
        timeout: Duration,
        conditions: String,
    },
    #[error(
        "{kind} {object} does not read back as {version} after {timeout:?}; the apiserver \
         answered: {last_error}"
    )]
    ReadBack {
        kind: String,
        object: String,
        version: String,
        timeout: Duration,
        last_error: String,
    },
}

/// What applying our CRD did to the one on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
    Unchanged,
}

impl Applied {
    /// From the `resourceVersion` before the apply (`None`: there was no CRD) and after it.
    pub fn of(before: Option<&str>, after: Option<&str>) -> Self {
        match before {
            None => Applied::Created,
            Some(before) if Some(before) == after => Applied::Unchanged,
            Some(_) => Applied::Updated,
        }
    }
}

/// What `crds --install` did to one CRD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdOutcome {
    pub name: String,
    /// The conversion the CRD had and that was removed, if any.
    pub conversion_removed: Option<Conversion>,
    pub applied: Applied,
    /// The object read back in every served version, if the kind has any objects.
    pub read_back: Option<String>,
    /// The served versions.
    pub versions: Vec<String>,
}

impl fmt::Display for CrdOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "customresourcedefinition/{}: ", self.name)?;
        if let Some(conversion) = &self.conversion_removed {
            write!(f, "removed {conversion}; ")?;
        }
        let applied = match self.applied {
            Applied::Created => "created",
            Applied::Updated => "updated",
            Applied::Unchanged => "unchanged",
        };
        write!(f, "{applied}, Established")?;
        match &self.read_back {
            Some(object) => write!(f, "; {object} reads as {}", self.versions.join(" and ")),
            None => write!(f, "; no objects yet"),
        }
    }
}

/// The conversion to remove from `existing` before our CRD is applied over it: anything but
/// strategy `None` (kruise-rs serves no conversion webhook, see
/// `docs/decisions/0001-no-conversion-webhook.md`). `None` for a CRD that does not exist yet.
pub(crate) fn needs_conversion_reset(
    existing: Option<&CustomResourceDefinition>,
) -> Option<Conversion> {
    let conversion = Conversion::of(existing?.spec.conversion.as_ref());
    (conversion != Conversion::None).then_some(conversion)
}

/// Whether `crd` is Established; `Err` with the reason when the apiserver refused its names.
pub(crate) fn established(crd: &CustomResourceDefinition) -> Result<bool, String> {
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    if let Some(c) = conditions
        .iter()
        .find(|c| c.type_ == "NamesAccepted" && c.status == "False")
    {
        return Err(format!(
            "{}: {}",
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default()
        ));
    }
    Ok(CrdState::from_crd(crd).established)
}

fn describe_conditions(crd: &CustomResourceDefinition) -> String {
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    if conditions.is_empty() {
        return "none".to_owned();
    }
    conditions
        .iter()
        .map(|c| {
            format!(
                "{}={} {}",
                c.type_,
                c.status,
                c.message.as_deref().unwrap_or_default()
            )
            .trim_end()
            .to_owned()
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Installs or switches every CRD (see the module documentation), waiting at most `timeout` for
/// each to be Established and its objects to read back. Returns what it did, in order.
pub async fn install(client: &Client, timeout: Duration) -> Result<Vec<CrdOutcome>, InstallError> {
    let mut outcomes = Vec::new();
    for ours in crd::crds() {
        outcomes.push(install_one(client, &ours, timeout).await?);
    }
    Ok(outcomes)
}

async fn install_one(
    client: &Client,
    ours: &CustomResourceDefinition,
    timeout: Duration,
) -> Result<CrdOutcome, InstallError> {
    let name = ours
        .metadata
        .name
        .clone()
        .ok_or_else(|| InstallError::Unnamed {
            name: ours.spec.names.plural.clone(),
        })?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let existing = api
        .get_opt(&name)
        .await
        .map_err(|source| InstallError::Read {
            name: name.clone(),
            source,
        })?;
    let conversion_removed = needs_conversion_reset(existing.as_ref());
    let before = existing
        .as_ref()
        .and_then(|c| c.metadata.resource_version.clone());
    if conversion_removed.is_some() {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        api.patch(&name, &params, &Patch::Merge(conversion_reset_patch()))
            .await
            .map_err(|source| InstallError::ResetConversion {
                name: name.clone(),
                source,
            })?;
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = api
        .patch(&name, &params, &Patch::Apply(ours))
        .await
        .map_err(|source| InstallError::Apply {
            name: name.clone(),
            source,
        })?;
    let applied = Applied::of(
        before.as_deref(),
        applied.metadata.resource_version.as_deref(),
    );

    let deadline = Instant::now() + timeout;
    loop {
        let crd = api.get(&name).await.map_err(|source| InstallError::Read {
            name: name.clone(),
            source,
        })?;
        match established(&crd) {
            Ok(true) => break,
            Ok(false) if Instant::now() < deadline => tokio::time::sleep(jittered(POLL, 0.5)).await,
            Ok(false) => {
                return Err(InstallError::NotEstablished {
                    name,
                    timeout,
                    conditions: describe_conditions(&crd),
                });
            }
            Err(reason) => return Err(InstallError::Rejected { name, reason }),
        }
    }

    let versions = CrdState::from_crd(ours).served;
    let read_back = read_back(client, ours, &versions, deadline, timeout).await?;
    Ok(CrdOutcome {
        name,
        conversion_removed,
        applied,
        read_back,
        versions,
    })
}

fn resource(crd: &CustomResourceDefinition, version: &str) -> ApiResource {
    let group = &crd.spec.group;
    ApiResource {
        group: group.clone(),
        version: version.to_owned(),
        api_version: format!("{group}/{version}"),
        kind: crd.spec.names.kind.clone(),
        plural: crd.spec.names.plural.clone(),
    }
}

/// Reads one object of the kind by name in every served version until all answer (or the
/// deadline passes). `None` when the kind has no objects.
async fn read_back(
    client: &Client,
    crd: &CustomResourceDefinition,
    versions: &[String],
    deadline: Instant,
    timeout: Duration,
) -> Result<Option<String>, InstallError> {
    let kind = crd.spec.names.kind.clone();
    let storage = crd.spec.versions.iter().find(|v| v.storage).map_or_else(
        || versions.first().cloned().unwrap_or_default(),
        |v| v.name.clone(),
    );
    // Listing in the storage version needs no conversion.
    let listed: Api<DynamicObject> = Api::all_with(client.clone(), &resource(crd, &storage));
    loop {
        let (object, version, last_error) = match listed.list(&ListParams::default().limit(1)).await
        {
            Err(err) => ("(any)".to_owned(), storage.clone(), err.to_string()),
            Ok(list) => {
                let Some(first) = list.items.into_iter().next() else {
                    return Ok(None);
                };
                let name = first.metadata.name.clone().unwrap_or_default();
                let namespace = first.metadata.namespace.clone();
                let shown = match &namespace {
                    Some(ns) => format!("{kind} {ns}/{name}"),
                    None => format!("{kind} {name}"),
                };
                match get_in_every_version(client, crd, versions, namespace.as_deref(), &name).await
                {
                    Ok(()) => return Ok(Some(shown)),
                    Err((version, err)) => (shown, version, err.to_string()),
                }
            }
        };
        if Instant::now() >= deadline {
            return Err(InstallError::ReadBack {
                kind,
                object,
                version,
                timeout,
                last_error,
            });
        }
        tokio::time::sleep(jittered(POLL, 0.5)).await;
    }
}

/// GETs the object by name in each version; the first version that fails, and how.
async fn get_in_every_version(
    client: &Client,
    crd: &CustomResourceDefinition,
    versions: &[String],
    namespace: Option<&str>,
    name: &str,
) -> Result<(), (String, kube::Error)> {
    for version in versions {
        let resource = resource(crd, version);
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.get(name).await.map_err(|err| (version.clone(), err))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
