//! The CustomResourceDefinitions the manager serves, and the start-up check that they are usable:
//! installed, Established, serving the versions we use, converting the way we do. The decision is
//! [`check_crds`], a pure function; [`ensure_installed`] only reads the CRDs from the API server
//! and hands them to it.
//!
//! A cluster that ran upstream's kruise-manager 1.9 has a SidecarSet CRD whose versions convert
//! through upstream's conversion webhook. kruise-rs does not serve one
//! (`docs/decisions/0001-no-conversion-webhook.md`): once upstream's manager is gone every read
//! of the version that is not stored fails. So the manager refuses to start on such a CRD and
//! names the command that switches it (`kruise-rs crds --install`, see
//! [`super::crd_install`]). Every replica runs this check, followers included.

use std::fmt;

use futures::future::try_join_all;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig,
};
use kube::{Api, Client};

use super::ManagerError;
use kruise_rs_api::well_known::{LEGACY_VERSION, STORAGE_VERSION};
use kruise_rs_kube::{START_UP_PATIENCE, retry_transient};

/// The CRDs the manager needs; it refuses to start unless every one is usable ([`check_crds`]).
pub const REQUIRED_CRDS: [&str; 4] = [
    "sidecarsets.apps.kruise.io",
    "imagepulljobs.apps.kruise.io",
    "nodeimages.apps.kruise.io",
    "imagelistpulljobs.apps.kruise.io",
];

/// The versions that must be served: the controllers and the webhooks read and write `v1beta1`;
/// users' manifests (and upstream's documentation) use both, and the webhooks are registered for
/// both.
pub(crate) const SERVED_VERSIONS: [&str; 2] = [LEGACY_VERSION, STORAGE_VERSION];

/// The versions whose stored objects the manager can read: both have our one schema.
pub(crate) const READABLE_STORED_VERSIONS: [&str; 2] = [LEGACY_VERSION, STORAGE_VERSION];

/// The command that installs the CRDs, or switches them from upstream's.
pub(crate) const INSTALL_COMMAND: &str = "kruise-rs crds --install";

/// How to install the CRDs, as quoted in [`UnusableCrds`]'s message.
pub(crate) const INSTALL_HINT: &str = "install them with `kruise-rs crds --install` \
     (or `kruise-rs crds | kubectl apply --server-side -f -`)";

/// The merge patch that takes a CRD off a conversion webhook: strategy `None`, and the webhook
/// stanza removed (an apply alone cannot remove it: another field manager owns it).
pub fn conversion_reset_patch() -> serde_json::Value {
    serde_json::json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}})
}

/// The `kubectl` command equivalent to [`conversion_reset_patch`] for CRD `name`.
pub(crate) fn kubectl_conversion_reset(name: &str) -> String {
    format!(
        "kubectl patch crd {name} --type=merge -p '{}'",
        conversion_reset_patch()
    )
}

/// How a CRD converts objects between its versions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Conversion {
    /// The apiserver rewrites `apiVersion` only: what kruise-rs needs.
    #[default]
    None,
    /// Through a webhook, at `endpoint` (a Service or a URL, as `describe_client_config` says).
    Webhook { endpoint: String },
    /// A strategy this version of kruise-rs does not know.
    Other(String),
}

impl Conversion {
    /// Reads `spec.conversion` (absent means `None`, the apiserver's default).
    pub fn of(conversion: Option<&CustomResourceConversion>) -> Self {
        let Some(conversion) = conversion else {
            return Conversion::None;
        };
        match conversion.strategy.as_str() {
            "None" | "" => Conversion::None,
            "Webhook" => Conversion::Webhook {
                endpoint: conversion
                    .webhook
                    .as_ref()
                    .and_then(|w| w.client_config.as_ref())
                    .map_or_else(|| "no client config".to_owned(), describe_client_config),
            },
            other => Conversion::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for Conversion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conversion::None => f.write_str("strategy None"),
            Conversion::Webhook { endpoint } => write!(f, "a conversion webhook ({endpoint})"),
            Conversion::Other(strategy) => write!(f, "conversion strategy {strategy:?}"),
        }
    }
}

/// `service kruise-system/kruise-webhook-service:443 path /convert`, or `url https://...`.
pub(crate) fn describe_client_config(config: &WebhookClientConfig) -> String {
    if let Some(service) = &config.service {
        let port = service.port.map(|p| format!(":{p}")).unwrap_or_default();
        let path = service
            .path
            .as_deref()
            .map(|p| format!(" path {p}"))
            .unwrap_or_default();
        return format!("service {}/{}{port}{path}", service.namespace, service.name);
    }
    match &config.url {
        Some(url) => format!("url {url}"),
        None => "no service or url".to_owned(),
    }
}

/// A CRD found on the API server, reduced to what the check needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrdState {
    /// `metadata.name`, e.g. `sidecarsets.apps.kruise.io`.
    pub name: String,
    /// Whether its `Established` condition is `True` (the API server serves the kind).
    pub established: bool,
    /// `spec.conversion`.
    pub conversion: Conversion,
    /// The versions with `served: true`, in `spec.versions` order.
    pub served: Vec<String>,
    /// `status.storedVersions`: every version objects may be stored in.
    pub stored: Vec<String>,
}

impl CrdState {
    /// Reads what the check needs from a CRD as the API server returned it.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Self {
        let status = crd.status.as_ref();
        let established = status
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        Self {
            name: crd.metadata.name.clone().unwrap_or_default(),
            established,
            conversion: Conversion::of(crd.spec.conversion.as_ref()),
            served: crd
                .spec
                .versions
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.clone())
                .collect(),
            stored: status
                .and_then(|s| s.stored_versions.clone())
                .unwrap_or_default(),
        }
    }

    /// What [`crds::crds`](kruise_rs_api::crd::crds) installs: Established, conversion `None`,
    /// both versions served, only `v1beta1` stored.
    pub fn ours(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            established: true,
            conversion: Conversion::None,
            served: SERVED_VERSIONS.map(String::from).to_vec(),
            stored: vec![STORAGE_VERSION.to_owned()],
        }
    }
}

/// Why some of [`REQUIRED_CRDS`] are not usable; the message says which and what to do. Each
/// list is in [`REQUIRED_CRDS`] order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnusableCrds {
    /// Required CRDs that do not exist.
    pub missing: Vec<String>,
    /// Required CRDs that exist but are not Established (yet).
    pub not_established: Vec<String>,
    /// Required CRDs that convert otherwise than with strategy `None`, and how they do.
    pub conversion: Vec<(String, Conversion)>,
    /// Required CRDs that do not serve some of `SERVED_VERSIONS`, and which.
    pub unserved: Vec<(String, Vec<String>)>,
    /// Required CRDs with objects stored in versions not in `READABLE_STORED_VERSIONS`, and
    /// which.
    pub unreadable_stored: Vec<(String, Vec<String>)>,
}

impl UnusableCrds {
    fn is_empty(&self) -> bool {
        self.missing.is_empty()
            && self.not_established.is_empty()
            && self.conversion.is_empty()
            && self.unserved.is_empty()
            && self.unreadable_stored.is_empty()
    }
}

impl fmt::Display for UnusableCrds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!(
                "required CustomResourceDefinitions are not installed: {}; {INSTALL_HINT}",
                self.missing.join(", ")
            ));
        }
        if !self.not_established.is_empty() {
            let crds: Vec<String> = self
                .not_established
                .iter()
                .map(|name| format!("crd/{name}"))
                .collect();
            parts.push(format!(
                "required CustomResourceDefinitions are installed but not Established: {}; \
                 check their status conditions, or wait with \
                 `kubectl wait --for condition=established {}` and start again",
                self.not_established.join(", "),
                crds.join(" ")
            ));
        }
        if !self.conversion.is_empty() {
            let found: Vec<String> = self
                .conversion
                .iter()
                .map(|(name, conversion)| format!("{name} has {conversion}"))
                .collect();
            let patches: Vec<String> = self
                .conversion
                .iter()
                .map(|(name, _)| format!("`{}`", kubectl_conversion_reset(name)))
                .collect();
            parts.push(format!(
                "{}; kruise-rs serves no conversion webhook (both versions share one schema, \
                 the apiserver converts them), so reads of the version that is not stored would \
                 fail; switch the CRDs with `{INSTALL_COMMAND}` (or run {}, then \
                 `kruise-rs crds | kubectl apply --server-side --force-conflicts -f -`) and \
                 start again",
                found.join(", "),
                patches.join(" and ")
            ));
        }
        if !self.unserved.is_empty() {
            let found: Vec<String> = self
                .unserved
                .iter()
                .map(|(name, versions)| format!("{name} does not serve {}", versions.join(", ")))
                .collect();
            parts.push(format!(
                "{}; kruise-rs needs {} served ({STORAGE_VERSION} by its controllers and \
                 webhooks, {LEGACY_VERSION} by users' manifests); install its CRDs with \
                 `{INSTALL_COMMAND}` and start again",
                found.join(", "),
                SERVED_VERSIONS.join(" and ")
            ));
        }
        if !self.unreadable_stored.is_empty() {
            let found: Vec<String> = self
                .unreadable_stored
                .iter()
                .map(|(name, versions)| {
                    format!("{name} has objects stored as {}", versions.join(", "))
                })
                .collect();
            parts.push(format!(
                "{}, which kruise-rs cannot read (it reads {}); with the version that wrote them \
                 still served, rewrite them in {STORAGE_VERSION} (`kubectl get <kind> -A -o json \
                 | kubectl replace -f -`), then set `status.storedVersions` to \
                 [\"{STORAGE_VERSION}\"] (`kubectl patch crd <name> --subresource=status \
                 --type=merge -p '{{\"status\":{{\"storedVersions\":[\"{STORAGE_VERSION}\"]}}}}'`) \
                 and start again",
                found.join("; "),
                READABLE_STORED_VERSIONS.join(" and ")
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

impl std::error::Error for UnusableCrds {}

/// Decides whether the CRDs found on the API server are usable, for each of [`REQUIRED_CRDS`]:
/// present, Established, conversion `None`, every one of `SERVED_VERSIONS` served, and only
/// `READABLE_STORED_VERSIONS` in `status.storedVersions`. Other CRDs in `found` are ignored;
/// of several entries with one name, the first Established one counts.
pub fn check_crds(found: &[CrdState]) -> Result<(), UnusableCrds> {
    let mut problems = UnusableCrds::default();
    for name in REQUIRED_CRDS {
        let same_name: Vec<&CrdState> = found.iter().filter(|crd| crd.name == name).collect();
        let Some(first) = same_name.first() else {
            problems.missing.push(name.to_owned());
            continue;
        };
        let Some(crd) = same_name.iter().find(|crd| crd.established) else {
            problems.not_established.push(name.to_owned());
            // An unestablished CRD's spec can still be wrong in ways worth saying now.
            check_spec(first, &mut problems);
            continue;
        };
        check_spec(crd, &mut problems);
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

fn check_spec(crd: &CrdState, problems: &mut UnusableCrds) {
    if crd.conversion != Conversion::None {
        problems
            .conversion
            .push((crd.name.clone(), crd.conversion.clone()));
    }
    let unserved: Vec<String> = SERVED_VERSIONS
        .iter()
        .filter(|v| !crd.served.iter().any(|s| s == *v))
        .map(|v| (*v).to_owned())
        .collect();
    if !unserved.is_empty() {
        problems.unserved.push((crd.name.clone(), unserved));
    }
    let mut unreadable: Vec<String> = Vec::new();
    for version in &crd.stored {
        if !READABLE_STORED_VERSIONS.contains(&version.as_str()) && !unreadable.contains(version) {
            unreadable.push(version.clone());
        }
    }
    if !unreadable.is_empty() {
        problems
            .unreadable_stored
            .push((crd.name.clone(), unreadable));
    }
}

/// Reads each of [`REQUIRED_CRDS`] from the API server (needs `get` on
/// `customresourcedefinitions.apiextensions.k8s.io`) and runs [`check_crds`] on them.
pub async fn ensure_installed(client: &Client) -> Result<(), ManagerError> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let found = try_join_all(REQUIRED_CRDS.iter().map(|&name| {
        let api = &api;
        async move {
            let what = format!("reading the CustomResourceDefinition {name}");
            retry_transient(&what, START_UP_PATIENCE, || api.get_opt(name))
                .await
                .map_err(|source| ManagerError::ReadCrd { name, source })
        }
    }))
    .await?;
    let states: Vec<CrdState> = found.iter().flatten().map(CrdState::from_crd).collect();
    check_crds(&states)?;
    Ok(())
}

#[cfg(test)]
mod tests;
