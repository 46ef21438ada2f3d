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
use crate::apis::well_known::{LEGACY_VERSION, STORAGE_VERSION};

/// The CRDs the manager needs; it refuses to start unless every one is usable ([`check_crds`]).
pub const REQUIRED_CRDS: [&str; 3] = [
    "sidecarsets.apps.kruise.io",
    "imagepulljobs.apps.kruise.io",
    "nodeimages.apps.kruise.io",
];

/// The versions that must be served: the controllers and the webhooks read and write `v1beta1`;
/// users' manifests (and upstream's documentation) use both, and the webhooks are registered for
/// both.
pub const SERVED_VERSIONS: [&str; 2] = [LEGACY_VERSION, STORAGE_VERSION];

/// The versions whose stored objects the manager can read: both have our one schema.
pub const READABLE_STORED_VERSIONS: [&str; 2] = [LEGACY_VERSION, STORAGE_VERSION];

/// The command that installs the CRDs, or switches them from upstream's.
pub const INSTALL_COMMAND: &str = "kruise-rs crds --install";

/// How to install the CRDs, as quoted in [`UnusableCrds`]'s message.
pub const INSTALL_HINT: &str = "install them with `kruise-rs crds --install` \
     (or `kruise-rs crds | kubectl apply --server-side -f -`)";

/// The merge patch that takes a CRD off a conversion webhook: strategy `None`, and the webhook
/// stanza removed (an apply alone cannot remove it: another field manager owns it).
pub fn conversion_reset_patch() -> serde_json::Value {
    serde_json::json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}})
}

/// The `kubectl` command equivalent to [`conversion_reset_patch`] for CRD `name`.
pub fn kubectl_conversion_reset(name: &str) -> String {
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
    /// Through a webhook, at `endpoint` (a Service or a URL, as [`describe_client_config`] says).
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
pub fn describe_client_config(config: &WebhookClientConfig) -> String {
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

    /// What [`crds::crds`](crate::apis::crd::crds) installs: Established, conversion `None`,
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
    /// Required CRDs that do not serve some of [`SERVED_VERSIONS`], and which.
    pub unserved: Vec<(String, Vec<String>)>,
    /// Required CRDs with objects stored in versions not in [`READABLE_STORED_VERSIONS`], and
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
/// present, Established, conversion `None`, every one of [`SERVED_VERSIONS`] served, and only
/// [`READABLE_STORED_VERSIONS`] in `status.storedVersions`. Other CRDs in `found` are ignored;
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
            api.get_opt(name)
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
mod tests {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
        CustomResourceDefinitionVersion, ServiceReference, WebhookConversion,
    };
    use kube::api::ObjectMeta;

    use super::*;

    const SIDECARSETS: &str = "sidecarsets.apps.kruise.io";
    const IMAGEPULLJOBS: &str = "imagepulljobs.apps.kruise.io";
    const NODEIMAGES: &str = "nodeimages.apps.kruise.io";

    fn state(name: &str, established: bool) -> CrdState {
        CrdState {
            established,
            ..CrdState::ours(name)
        }
    }

    fn all_established() -> Vec<CrdState> {
        REQUIRED_CRDS
            .iter()
            .map(|name| CrdState::ours(name))
            .collect()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Upstream 1.9's conversion webhook, as its config/default installs it.
    fn upstream_webhook() -> Conversion {
        Conversion::Webhook {
            endpoint: "service kruise-system/kruise-webhook-service:443 path /convert".to_owned(),
        }
    }

    fn with(name: &str, change: impl FnOnce(&mut CrdState)) -> Vec<CrdState> {
        let mut found = all_established();
        if let Some(crd) = found.iter_mut().find(|crd| crd.name == name) {
            change(crd);
        }
        found
    }

    #[test]
    fn all_required_and_established_is_ok() {
        assert_eq!(check_crds(&all_established()), Ok(()));
    }

    #[test]
    fn unrelated_crds_are_ignored() {
        let mut found = all_established();
        found.push(state("clonesets.apps.kruise.io", false));
        found.push(CrdState {
            conversion: upstream_webhook(),
            ..CrdState::ours("statefulsets.apps.kruise.io")
        });
        found.insert(0, state("certificates.cert-manager.io", true));
        assert_eq!(check_crds(&found), Ok(()));
    }

    #[test]
    fn nothing_installed_lists_every_crd_in_order() {
        let err = check_crds(&[]).unwrap_err();
        assert_eq!(err.missing, REQUIRED_CRDS.map(String::from).to_vec());
        assert!(err.not_established.is_empty());
        assert!(err.conversion.is_empty() && err.unserved.is_empty());
        let message = err.to_string();
        for name in REQUIRED_CRDS {
            assert!(message.contains(name), "{message}");
        }
        assert!(message.contains("`kruise-rs crds --install`"), "{message}");
        assert!(
            message.contains("kruise-rs crds | kubectl apply --server-side -f -"),
            "{message}"
        );
    }

    #[test]
    fn one_missing_names_only_that_one() {
        let found: Vec<CrdState> = all_established()
            .into_iter()
            .filter(|crd| crd.name != IMAGEPULLJOBS)
            .collect();
        let err = check_crds(&found).unwrap_err();
        assert_eq!(err.missing, strings(&[IMAGEPULLJOBS]));
        assert!(err.not_established.is_empty());
        let message = err.to_string();
        assert!(!message.contains("sidecarsets"), "{message}");
        assert!(!message.contains("not Established"), "{message}");
    }

    #[test]
    fn not_established_is_reported_separately_with_a_wait_hint() {
        let mut found = all_established();
        found[2].established = false;
        let err = check_crds(&found).unwrap_err();
        assert!(err.missing.is_empty());
        assert_eq!(err.not_established, strings(&[NODEIMAGES]));
        let message = err.to_string();
        assert!(
            message
                .contains("kubectl wait --for condition=established crd/nodeimages.apps.kruise.io"),
            "{message}"
        );
        assert!(!message.contains("not installed"), "{message}");
    }

    #[test]
    fn missing_and_not_established_both_reported() {
        let found = vec![state(SIDECARSETS, false)];
        let err = check_crds(&found).unwrap_err();
        assert_eq!(err.missing, strings(&[IMAGEPULLJOBS, NODEIMAGES]));
        assert_eq!(err.not_established, strings(&[SIDECARSETS]));
        let message = err.to_string();
        assert!(message.contains("not installed"), "{message}");
        assert!(message.contains("not Established"), "{message}");
    }

    #[test]
    fn a_duplicate_entry_counts_if_any_copy_is_established() {
        let mut found = all_established();
        found.push(state(SIDECARSETS, false));
        assert_eq!(check_crds(&found), Ok(()));
        // The established copy is the one judged.
        let mut found = all_established();
        found.insert(
            0,
            CrdState {
                established: false,
                conversion: upstream_webhook(),
                ..CrdState::ours(SIDECARSETS)
            },
        );
        assert_eq!(check_crds(&found), Ok(()));
    }

    #[test]
    fn a_conversion_webhook_refuses_and_names_the_commands() {
        let found = with(SIDECARSETS, |crd| crd.conversion = upstream_webhook());
        let err = check_crds(&found).unwrap_err();
        assert_eq!(
            err,
            UnusableCrds {
                conversion: vec![(SIDECARSETS.to_owned(), upstream_webhook())],
                ..UnusableCrds::default()
            }
        );
        let message = err.to_string();
        for needle in [
            "sidecarsets.apps.kruise.io has a conversion webhook (service kruise-system/kruise-webhook-service:443 path /convert)",
            "`kruise-rs crds --install`",
            r#"`kubectl patch crd sidecarsets.apps.kruise.io --type=merge -p '{"spec":{"conversion":{"strategy":"None","webhook":null}}}'`"#,
            "`kruise-rs crds | kubectl apply --server-side --force-conflicts -f -`",
        ] {
            assert!(message.contains(needle), "{needle:?} not in: {message}");
        }
        assert!(!message.contains("imagepulljobs"), "{message}");
    }

    #[test]
    fn every_crd_with_a_webhook_is_named_with_its_own_patch() {
        let mut found = all_established();
        for crd in &mut found {
            crd.conversion = upstream_webhook();
        }
        let err = check_crds(&found).unwrap_err();
        let names: Vec<&str> = err.conversion.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, REQUIRED_CRDS);
        let message = err.to_string();
        for name in REQUIRED_CRDS {
            assert!(
                message.contains(&format!("kubectl patch crd {name} --type=merge")),
                "{message}"
            );
        }
    }

    #[test]
    fn an_unknown_conversion_strategy_refuses_too() {
        let found = with(NODEIMAGES, |crd| {
            crd.conversion = Conversion::Other("Magic".into())
        });
        let err = check_crds(&found).unwrap_err();
        assert_eq!(
            err.conversion,
            vec![(NODEIMAGES.to_owned(), Conversion::Other("Magic".into()))]
        );
        assert!(
            err.to_string()
                .contains("nodeimages.apps.kruise.io has conversion strategy \"Magic\""),
            "{err}"
        );
    }

    #[test]
    fn an_unserved_version_refuses_naming_it() {
        for (served, missing) in [
            (vec![STORAGE_VERSION], vec![LEGACY_VERSION]),
            (vec![LEGACY_VERSION], vec![STORAGE_VERSION]),
            (vec![], vec![LEGACY_VERSION, STORAGE_VERSION]),
        ] {
            let found = with(IMAGEPULLJOBS, |crd| crd.served = strings(&served));
            let err = check_crds(&found).unwrap_err();
            assert_eq!(
                err,
                UnusableCrds {
                    unserved: vec![(IMAGEPULLJOBS.to_owned(), strings(&missing))],
                    ..UnusableCrds::default()
                },
                "served {served:?}"
            );
            let message = err.to_string();
            assert!(
                message.contains(&format!(
                    "imagepulljobs.apps.kruise.io does not serve {}",
                    missing.join(", ")
                )),
                "{message}"
            );
            assert!(message.contains("`kruise-rs crds --install`"), "{message}");
        }
    }

    #[test]
    fn extra_served_versions_are_fine() {
        let found = with(SIDECARSETS, |crd| crd.served.push("v1".into()));
        assert_eq!(check_crds(&found), Ok(()));
    }

    #[test]
    fn stored_versions_we_read_are_fine_in_any_mix() {
        for stored in [
            vec![],
            vec![LEGACY_VERSION],
            vec![STORAGE_VERSION],
            vec![LEGACY_VERSION, STORAGE_VERSION],
            vec![STORAGE_VERSION, LEGACY_VERSION],
        ] {
            let found = with(SIDECARSETS, |crd| crd.stored = strings(&stored));
            assert_eq!(check_crds(&found), Ok(()), "stored {stored:?}");
        }
    }

    #[test]
    fn a_stored_version_we_cannot_read_refuses_with_the_migration() {
        let found = with(NODEIMAGES, |crd| {
            crd.stored = strings(&["v1alpha1", "v1", "v1beta1", "v1"])
        });
        let err = check_crds(&found).unwrap_err();
        assert_eq!(
            err,
            UnusableCrds {
                unreadable_stored: vec![(NODEIMAGES.to_owned(), strings(&["v1"]))],
                ..UnusableCrds::default()
            }
        );
        let message = err.to_string();
        for needle in [
            "nodeimages.apps.kruise.io has objects stored as v1",
            "kubectl replace -f -",
            r#"--subresource=status --type=merge -p '{"status":{"storedVersions":["v1beta1"]}}'"#,
        ] {
            assert!(message.contains(needle), "{needle:?} not in: {message}");
        }
    }

    #[test]
    fn several_problems_of_one_crd_are_all_reported() {
        let found = with(SIDECARSETS, |crd| {
            crd.conversion = upstream_webhook();
            crd.served = strings(&[STORAGE_VERSION]);
            crd.stored = strings(&["v2"]);
        });
        let err = check_crds(&found).unwrap_err();
        assert_eq!(err.conversion.len(), 1);
        assert_eq!(err.unserved.len(), 1);
        assert_eq!(err.unreadable_stored.len(), 1);
        let message = err.to_string();
        assert_eq!(message.matches("sidecarsets.apps.kruise.io").count(), 4);
    }

    #[test]
    fn an_unestablished_crd_also_reports_its_conversion() {
        let found = with(SIDECARSETS, |crd| {
            crd.established = false;
            crd.conversion = upstream_webhook();
        });
        let err = check_crds(&found).unwrap_err();
        assert_eq!(err.not_established, strings(&[SIDECARSETS]));
        assert_eq!(err.conversion.len(), 1);
    }

    fn crd(conditions: Option<Vec<(&str, &str)>>) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some(NODEIMAGES.to_owned()),
                ..ObjectMeta::default()
            },
            status: Some(CustomResourceDefinitionStatus {
                conditions: conditions.map(|conditions| {
                    conditions
                        .into_iter()
                        .map(|(type_, status)| CustomResourceDefinitionCondition {
                            type_: type_.to_owned(),
                            status: status.to_owned(),
                            ..CustomResourceDefinitionCondition::default()
                        })
                        .collect()
                }),
                ..CustomResourceDefinitionStatus::default()
            }),
            ..CustomResourceDefinition::default()
        }
    }

    #[test]
    fn established_condition_is_read_from_status() {
        let established = crd(Some(vec![
            ("NamesAccepted", "True"),
            ("Established", "True"),
        ]));
        assert!(CrdState::from_crd(&established).established);
        for conditions in [
            None,
            Some(vec![]),
            Some(vec![("NamesAccepted", "True")]),
            Some(vec![("Established", "False")]),
            Some(vec![("Established", "Unknown")]),
        ] {
            assert!(
                !CrdState::from_crd(&crd(conditions.clone())).established,
                "{conditions:?}"
            );
        }
        let no_status = CustomResourceDefinition {
            status: None,
            ..crd(None)
        };
        let state = CrdState::from_crd(&no_status);
        assert!(!state.established);
        assert!(state.stored.is_empty());
    }

    #[test]
    fn our_generated_crds_read_as_ours() {
        for generated in crate::apis::crd::crds() {
            let mut generated = generated;
            generated.status = Some(CustomResourceDefinitionStatus {
                stored_versions: Some(vec![STORAGE_VERSION.to_owned()]),
                conditions: Some(vec![CustomResourceDefinitionCondition {
                    type_: "Established".into(),
                    status: "True".into(),
                    ..CustomResourceDefinitionCondition::default()
                }]),
                ..CustomResourceDefinitionStatus::default()
            });
            let state = CrdState::from_crd(&generated);
            assert_eq!(state, CrdState::ours(&state.name));
        }
    }

    #[test]
    fn served_and_stored_versions_are_read_from_spec_and_status() {
        let mut upstream = crd(Some(vec![("Established", "True")]));
        upstream.spec.versions = vec![
            CustomResourceDefinitionVersion {
                name: "v1alpha1".into(),
                served: false,
                ..CustomResourceDefinitionVersion::default()
            },
            CustomResourceDefinitionVersion {
                name: "v1beta1".into(),
                served: true,
                storage: true,
                ..CustomResourceDefinitionVersion::default()
            },
        ];
        if let Some(status) = upstream.status.as_mut() {
            status.stored_versions = Some(strings(&["v1alpha1", "v1beta1"]));
        }
        let state = CrdState::from_crd(&upstream);
        assert_eq!(state.served, strings(&["v1beta1"]));
        assert_eq!(state.stored, strings(&["v1alpha1", "v1beta1"]));
        assert_eq!(state.conversion, Conversion::None);
    }

    fn webhook(config: WebhookClientConfig) -> CustomResourceConversion {
        CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: Some(WebhookConversion {
                client_config: Some(config),
                conversion_review_versions: strings(&["v1", "v1beta1"]),
            }),
        }
    }

    #[test]
    fn conversion_is_read_from_spec() {
        assert_eq!(Conversion::of(None), Conversion::None);
        let none = CustomResourceConversion {
            strategy: "None".into(),
            webhook: None,
        };
        assert_eq!(Conversion::of(Some(&none)), Conversion::None);
        let service = webhook(WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: "kruise-system".into(),
                name: "kruise-webhook-service".into(),
                path: Some("/convert".into()),
                port: Some(443),
            }),
            ..WebhookClientConfig::default()
        });
        assert_eq!(Conversion::of(Some(&service)), upstream_webhook());
        let bare_service = webhook(WebhookClientConfig {
            service: Some(ServiceReference {
                namespace: "system".into(),
                name: "webhook-service".into(),
                path: None,
                port: None,
            }),
            ..WebhookClientConfig::default()
        });
        assert_eq!(
            Conversion::of(Some(&bare_service)),
            Conversion::Webhook {
                endpoint: "service system/webhook-service".into()
            }
        );
        let url = webhook(WebhookClientConfig {
            url: Some("https://10.0.0.1:9876/convert".into()),
            ..WebhookClientConfig::default()
        });
        assert_eq!(
            Conversion::of(Some(&url)),
            Conversion::Webhook {
                endpoint: "url https://10.0.0.1:9876/convert".into()
            }
        );
        let nothing = CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: None,
        };
        assert_eq!(
            Conversion::of(Some(&nothing)),
            Conversion::Webhook {
                endpoint: "no client config".into()
            }
        );
        let odd = CustomResourceConversion {
            strategy: "Magic".into(),
            webhook: None,
        };
        assert_eq!(
            Conversion::of(Some(&odd)),
            Conversion::Other("Magic".into())
        );
    }

    #[test]
    fn the_reset_patch_and_its_kubectl_spelling() {
        assert_eq!(
            conversion_reset_patch(),
            serde_json::json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}})
        );
        assert_eq!(
            kubectl_conversion_reset(SIDECARSETS),
            r#"kubectl patch crd sidecarsets.apps.kruise.io --type=merge -p '{"spec":{"conversion":{"strategy":"None","webhook":null}}}'"#
        );
    }
}
