use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
    CustomResourceDefinitionVersion, ServiceReference, WebhookConversion,
};
use kube::api::ObjectMeta;

use super::*;

const SIDECARSETS: &str = "sidecarsets.apps.kruise.io";
const IMAGEPULLJOBS: &str = "imagepulljobs.apps.kruise.io";
const IMAGELISTPULLJOBS: &str = "imagelistpulljobs.apps.kruise.io";
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
        message.contains("kubectl wait --for condition=established crd/nodeimages.apps.kruise.io"),
        "{message}"
    );
    assert!(!message.contains("not installed"), "{message}");
}

#[test]
fn missing_and_not_established_both_reported() {
    let found = vec![state(SIDECARSETS, false)];
    let err = check_crds(&found).unwrap_err();
    assert_eq!(
        err.missing,
        strings(&[IMAGEPULLJOBS, NODEIMAGES, IMAGELISTPULLJOBS])
    );
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
    for generated in kruise_rs_api::crd::crds() {
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
