//! The CustomResourceDefinitions the manager serves, and the start-up check that they are installed
//! and Established. The decision is [`check_crds`], a pure function; [`ensure_installed`] only
//! reads the CRDs from the API server and hands them to it.

use std::fmt;

use futures::future::try_join_all;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use super::ManagerError;

/// The CRDs the manager needs; it refuses to start unless every one is installed and Established.
pub const REQUIRED_CRDS: [&str; 3] = [
    "sidecarsets.apps.kruise.io",
    "imagepulljobs.apps.kruise.io",
    "nodeimages.apps.kruise.io",
];

/// How to install the CRDs, as quoted in [`MissingCrds`]'s message.
pub const INSTALL_HINT: &str = "install them with `kruise-rs crds | kubectl apply --server-side -f -` \
     (or `kubectl apply --server-side -f crds/`)";

/// A CRD found on the API server, reduced to what the check needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdState {
    /// `metadata.name`, e.g. `sidecarsets.apps.kruise.io`.
    pub name: String,
    /// Whether its `Established` condition is `True` (the API server serves the kind).
    pub established: bool,
}

impl CrdState {
    /// Reads the name and the `Established` condition of a CRD as the API server returned it.
    pub fn from_crd(crd: &CustomResourceDefinition) -> Self {
        let established = crd
            .status
            .as_ref()
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        Self {
            name: crd.metadata.name.clone().unwrap_or_default(),
            established,
        }
    }
}

/// Some of [`REQUIRED_CRDS`] are not usable; the message says which and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingCrds {
    /// Required CRDs that do not exist, in [`REQUIRED_CRDS`] order.
    pub missing: Vec<String>,
    /// Required CRDs that exist but are not Established (yet), in [`REQUIRED_CRDS`] order.
    pub not_established: Vec<String>,
}

impl fmt::Display for MissingCrds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.missing.is_empty() {
            write!(
                f,
                "required CustomResourceDefinitions are not installed: {}; {INSTALL_HINT}",
                self.missing.join(", ")
            )?;
        }
        if !self.not_established.is_empty() {
            if !self.missing.is_empty() {
                f.write_str("; ")?;
            }
            let crds: Vec<String> = self
                .not_established
                .iter()
                .map(|name| format!("crd/{name}"))
                .collect();
            write!(
                f,
                "required CustomResourceDefinitions are installed but not Established: {}; \
                 check their status conditions, or wait with \
                 `kubectl wait --for condition=established {}` and start again",
                self.not_established.join(", "),
                crds.join(" ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for MissingCrds {}

/// Decides whether the CRDs found on the API server are enough to start: every one of
/// [`REQUIRED_CRDS`] must be present and Established. Other CRDs in `found` are ignored.
pub fn check_crds(found: &[CrdState]) -> Result<(), MissingCrds> {
    let mut missing = Vec::new();
    let mut not_established = Vec::new();
    for name in REQUIRED_CRDS {
        let mut same_name = found.iter().filter(|crd| crd.name == name).peekable();
        if same_name.peek().is_none() {
            missing.push(name.to_owned());
        } else if !same_name.any(|crd| crd.established) {
            not_established.push(name.to_owned());
        }
    }
    if missing.is_empty() && not_established.is_empty() {
        Ok(())
    } else {
        Err(MissingCrds {
            missing,
            not_established,
        })
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
    };
    use kube::api::ObjectMeta;

    use super::*;

    fn state(name: &str, established: bool) -> CrdState {
        CrdState {
            name: name.to_owned(),
            established,
        }
    }

    fn all_established() -> Vec<CrdState> {
        REQUIRED_CRDS.iter().map(|name| state(name, true)).collect()
    }

    #[test]
    fn all_required_and_established_is_ok() {
        assert_eq!(check_crds(&all_established()), Ok(()));
    }

    #[test]
    fn unrelated_crds_are_ignored() {
        let mut found = all_established();
        found.push(state("clonesets.apps.kruise.io", false));
        found.insert(0, state("certificates.cert-manager.io", true));
        assert_eq!(check_crds(&found), Ok(()));
    }

    #[test]
    fn nothing_installed_lists_every_crd_in_order() {
        let err = check_crds(&[]).unwrap_err();
        assert_eq!(err.missing, REQUIRED_CRDS.map(String::from).to_vec());
        assert!(err.not_established.is_empty());
        let message = err.to_string();
        for name in REQUIRED_CRDS {
            assert!(message.contains(name), "{message}");
        }
        assert!(
            message.contains("kruise-rs crds | kubectl apply --server-side -f -"),
            "{message}"
        );
    }

    #[test]
    fn one_missing_names_only_that_one() {
        let found: Vec<CrdState> = all_established()
            .into_iter()
            .filter(|crd| crd.name != "imagepulljobs.apps.kruise.io")
            .collect();
        let err = check_crds(&found).unwrap_err();
        assert_eq!(err.missing, vec!["imagepulljobs.apps.kruise.io".to_owned()]);
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
        assert_eq!(
            err.not_established,
            vec!["nodeimages.apps.kruise.io".to_owned()]
        );
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
        let found = vec![state("sidecarsets.apps.kruise.io", false)];
        let err = check_crds(&found).unwrap_err();
        assert_eq!(
            err.missing,
            vec![
                "imagepulljobs.apps.kruise.io".to_owned(),
                "nodeimages.apps.kruise.io".to_owned()
            ]
        );
        assert_eq!(
            err.not_established,
            vec!["sidecarsets.apps.kruise.io".to_owned()]
        );
        let message = err.to_string();
        assert!(message.contains("not installed"), "{message}");
        assert!(message.contains("not Established"), "{message}");
    }

    #[test]
    fn a_duplicate_entry_counts_if_any_copy_is_established() {
        let mut found = all_established();
        found.push(state("sidecarsets.apps.kruise.io", false));
        assert_eq!(check_crds(&found), Ok(()));
    }

    fn crd(conditions: Option<Vec<(&str, &str)>>) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some("nodeimages.apps.kruise.io".to_owned()),
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
        assert_eq!(
            CrdState::from_crd(&established),
            state("nodeimages.apps.kruise.io", true)
        );
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
        assert!(!CrdState::from_crd(&no_status).established);
    }
}
