use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinitionCondition, CustomResourceDefinitionStatus,
    ServiceReference, WebhookClientConfig, WebhookConversion,
};

use super::*;

fn with_conversion(conversion: Option<CustomResourceConversion>) -> CustomResourceDefinition {
    let mut crd = crd::crds().remove(0);
    crd.spec.conversion = conversion;
    crd
}

fn upstream_conversion() -> CustomResourceConversion {
    CustomResourceConversion {
        strategy: "Webhook".into(),
        webhook: Some(WebhookConversion {
            client_config: Some(WebhookClientConfig {
                service: Some(ServiceReference {
                    namespace: "kruise-system".into(),
                    name: "kruise-webhook-service".into(),
                    path: Some("/convert".into()),
                    port: Some(443),
                }),
                ..WebhookClientConfig::default()
            }),
            conversion_review_versions: vec!["v1".into(), "v1beta1".into()],
        }),
    }
}

#[test]
fn only_a_crd_that_converts_otherwise_is_reset() {
    assert_eq!(needs_conversion_reset(None), None);
    assert_eq!(needs_conversion_reset(Some(&with_conversion(None))), None);
    let none = with_conversion(Some(CustomResourceConversion {
        strategy: "None".into(),
        webhook: None,
    }));
    assert_eq!(needs_conversion_reset(Some(&none)), None);
    assert_eq!(needs_conversion_reset(crd::crds().first()), None);
    let upstream = with_conversion(Some(upstream_conversion()));
    assert_eq!(
        needs_conversion_reset(Some(&upstream)),
        Some(Conversion::Webhook {
            endpoint: "service kruise-system/kruise-webhook-service:443 path /convert".into()
        })
    );
    let odd = with_conversion(Some(CustomResourceConversion {
        strategy: "Magic".into(),
        webhook: None,
    }));
    assert_eq!(
        needs_conversion_reset(Some(&odd)),
        Some(Conversion::Other("Magic".into()))
    );
}

#[test]
fn applied_compares_resource_versions() {
    assert_eq!(Applied::of(None, Some("5")), Applied::Created);
    assert_eq!(Applied::of(Some("5"), Some("5")), Applied::Unchanged);
    assert_eq!(Applied::of(Some("5"), Some("9")), Applied::Updated);
    assert_eq!(Applied::of(Some(""), Some("9")), Applied::Updated);
    assert_eq!(Applied::of(Some("5"), None), Applied::Updated);
}

fn with_conditions(conditions: &[(&str, &str, &str)]) -> CustomResourceDefinition {
    let mut crd = crd::crds().remove(0);
    crd.status = Some(CustomResourceDefinitionStatus {
        conditions: Some(
            conditions
                .iter()
                .map(
                    |(type_, status, message)| CustomResourceDefinitionCondition {
                        type_: (*type_).into(),
                        status: (*status).into(),
                        reason: Some("Why".into()),
                        message: Some((*message).into()),
                        ..CustomResourceDefinitionCondition::default()
                    },
                )
                .collect(),
        ),
        ..CustomResourceDefinitionStatus::default()
    });
    crd
}

#[test]
fn established_reads_the_conditions_and_reports_a_refusal() {
    assert_eq!(established(&crd::crds().remove(0)), Ok(false));
    assert_eq!(established(&with_conditions(&[])), Ok(false));
    assert_eq!(
        established(&with_conditions(&[("NamesAccepted", "True", "")])),
        Ok(false)
    );
    assert_eq!(
        established(&with_conditions(&[
            ("NamesAccepted", "True", ""),
            ("Established", "True", "")
        ])),
        Ok(true)
    );
    assert_eq!(
        established(&with_conditions(&[(
            "NamesAccepted",
            "False",
            "plural is taken"
        )])),
        Err("Why: plural is taken".to_owned())
    );
    assert_eq!(
        describe_conditions(&with_conditions(&[
            ("NamesAccepted", "True", "no conflicts"),
            ("Established", "False", "")
        ])),
        "NamesAccepted=True no conflicts, Established=False"
    );
    assert_eq!(describe_conditions(&crd::crds().remove(0)), "none");
}

#[test]
fn outcomes_say_what_was_done() {
    let switched = CrdOutcome {
        name: "sidecarsets.apps.kruise.io".into(),
        conversion_removed: Some(Conversion::Webhook {
            endpoint: "service kruise-system/kruise-webhook-service:443 path /convert".into(),
        }),
        applied: Applied::Updated,
        read_back: Some("SidecarSet sidecar-a".into()),
        versions: vec!["v1alpha1".into(), "v1beta1".into()],
    };
    assert_eq!(
        switched.to_string(),
        "customresourcedefinition/sidecarsets.apps.kruise.io: removed a conversion webhook \
             (service kruise-system/kruise-webhook-service:443 path /convert); updated, \
             Established; SidecarSet sidecar-a reads as v1alpha1 and v1beta1"
    );
    let fresh = CrdOutcome {
        name: "nodeimages.apps.kruise.io".into(),
        conversion_removed: None,
        applied: Applied::Created,
        read_back: None,
        versions: vec!["v1alpha1".into(), "v1beta1".into()],
    };
    assert_eq!(
        fresh.to_string(),
        "customresourcedefinition/nodeimages.apps.kruise.io: created, Established; no objects yet"
    );
    let again = CrdOutcome {
        applied: Applied::Unchanged,
        ..fresh
    };
    assert!(again.to_string().contains(": unchanged, Established"));
}

#[test]
fn resources_name_each_version() {
    let crd = crd::crds().remove(1);
    let legacy = resource(&crd, "v1alpha1");
    assert_eq!(legacy.api_version, "apps.kruise.io/v1alpha1");
    assert_eq!(legacy.kind, "ImagePullJob");
    assert_eq!(legacy.plural, "imagepulljobs");
}
