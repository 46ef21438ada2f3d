//! The Mutating- and ValidatingWebhookConfigurations that route admission requests to the
//! manager, built as plain values.
//!
//! Two kinds of webhook, configured differently:
//!
//! - **The pod webhook** (sidecar injection) is the only one users may scope and relax. It skips
//!   `kube-system`, the manager's own namespace and namespaces labelled `control-plane`, so the
//!   system can always restart itself while the webhook is down (upstream #1521 could lock a
//!   cluster out of its own kruise-manager); `--webhook-namespace-selector` and
//!   `--webhook-pod-object-selector` narrow it further, and `--webhook-failure-policy` decides
//!   what a pod does while the webhook cannot answer: `Fail` refuses it, `Ignore` lets it start
//!   without its sidecars.
//! - **The kruise kinds' webhooks** (SidecarSet, ImagePullJob, ImageListPullJob, NodeImage,
//!   defaulting and validation) see every object, in every namespace, and always `Fail`, as
//!   upstream's. Their validation is a security control (an ImagePullJob's author must be able
//!   to read the pull Secrets the manager will copy to every node, decision 0009), so no option
//!   may route an object around it or let one through while the webhook cannot answer. Nothing
//!   the cluster needs to restart creates these objects, so failing closed (and not exempting
//!   `kube-system` or the manager's namespace) costs no availability. Defaulting fails closed
//!   too: an object that skipped it would be validated undefaulted (the validators accept unset
//!   fields that defaulting fills) and a SidecarSet stored without its hash annotations; the
//!   same server answers both, so while it is down the object is refused either way.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::api::ObjectMeta;

use kruise_rs_api::well_known::{GROUP, LEGACY_VERSION, NAMESPACE_NAME_LABEL, STORAGE_VERSION};

/// A namespace carrying this label (any value) is never sent to the pod webhook, as upstream.
pub(crate) const CONTROL_PLANE_LABEL: &str = "control-plane";

/// What the apiserver does with a request it cannot get an answer for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum FailurePolicy {
    /// Refuse the request.
    Fail,
    /// Let the request through unchanged.
    Ignore,
}

impl FailurePolicy {
    fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Ignore => "Ignore",
        }
    }
}

/// Where the apiserver reaches the webhook server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// A Service in front of the manager (in-cluster).
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// A base URL such as `https://127.0.0.1:9443` (local runs and tests).
    Url(String),
}

/// Everything the configurations depend on.
#[derive(Clone, Debug)]
pub struct ConfigurationParams {
    /// Prefix of both configuration names (`<prefix>-mutating-webhook-configuration`, …).
    pub name_prefix: String,
    pub endpoint: Endpoint,
    /// PEM of the CA that signed the serving certificate; `None` leaves `caBundle` unset (for
    /// cert-manager's CA injector to fill).
    pub ca_bundle: Option<String>,
    /// The pod webhook's `failurePolicy` (the kruise kinds' webhooks always `Fail`).
    pub pod_failure_policy: FailurePolicy,
    pub timeout_seconds: i32,
    /// Namespaces whose pods are never sent to the pod webhook, besides `kube-system`.
    pub excluded_namespaces: Vec<String>,
    /// Extra requirements on the namespaces of pods sent to the pod webhook. It never scopes the
    /// kruise kinds' webhooks: their validation must not be escapable by namespace.
    pub pod_namespace_selector: Option<LabelSelector>,
    /// The pod webhook's `objectSelector`: only pods it selects are sent (none: every pod).
    pub pod_object_selector: Option<LabelSelector>,
}

/// One webhook: its path on the server, and what it is for.
struct Route {
    name: &'static str,
    path: &'static str,
    group: &'static str,
    versions: &'static [&'static str],
    resource: &'static str,
    operations: &'static [&'static str],
    namespaced: bool,
}

const KRUISE_VERSIONS: &[&str] = &[STORAGE_VERSION, LEGACY_VERSION];
const CREATE_UPDATE: &[&str] = &["CREATE", "UPDATE"];

pub(crate) const MUTATE_POD: &str = "/mutate-pod";
pub(crate) const MUTATE_SIDECARSET: &str = "/mutate-sidecarset";
pub(crate) const VALIDATE_SIDECARSET: &str = "/validate-sidecarset";
pub(crate) const MUTATE_IMAGEPULLJOB: &str = "/mutate-imagepulljob";
pub(crate) const VALIDATE_IMAGEPULLJOB: &str = "/validate-imagepulljob";
pub(crate) const MUTATE_IMAGELISTPULLJOB: &str = "/mutate-imagelistpulljob";
pub(crate) const VALIDATE_IMAGELISTPULLJOB: &str = "/validate-imagelistpulljob";
pub(crate) const MUTATE_NODEIMAGE: &str = "/mutate-nodeimage";
pub(crate) const VALIDATE_NODEIMAGE: &str = "/validate-nodeimage";

const MUTATING: &[Route] = &[
    Route {
        name: "mutate-pods.kruise-rs.io",
        path: MUTATE_POD,
        group: "",
        versions: &["v1"],
        resource: "pods",
        operations: &["CREATE"],
        namespaced: true,
    },
    Route {
        name: "mutate-sidecarsets.kruise-rs.io",
        path: MUTATE_SIDECARSET,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "sidecarsets",
        operations: CREATE_UPDATE,
        namespaced: false,
    },
    Route {
        name: "mutate-imagepulljobs.kruise-rs.io",
        path: MUTATE_IMAGEPULLJOB,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "imagepulljobs",
        operations: CREATE_UPDATE,
        namespaced: true,
    },
    Route {
        name: "mutate-imagelistpulljobs.kruise-rs.io",
        path: MUTATE_IMAGELISTPULLJOB,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "imagelistpulljobs",
        operations: CREATE_UPDATE,
        namespaced: true,
    },
    Route {
        name: "mutate-nodeimages.kruise-rs.io",
        path: MUTATE_NODEIMAGE,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "nodeimages",
        operations: CREATE_UPDATE,
        namespaced: false,
    },
];

const VALIDATING: &[Route] = &[
    Route {
        name: "validate-sidecarsets.kruise-rs.io",
        path: VALIDATE_SIDECARSET,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "sidecarsets",
        operations: CREATE_UPDATE,
        namespaced: false,
    },
    Route {
        name: "validate-imagepulljobs.kruise-rs.io",
        path: VALIDATE_IMAGEPULLJOB,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "imagepulljobs",
        operations: CREATE_UPDATE,
        namespaced: true,
    },
    Route {
        name: "validate-imagelistpulljobs.kruise-rs.io",
        path: VALIDATE_IMAGELISTPULLJOB,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "imagelistpulljobs",
        operations: CREATE_UPDATE,
        namespaced: true,
    },
    Route {
        name: "validate-nodeimages.kruise-rs.io",
        path: VALIDATE_NODEIMAGE,
        group: GROUP,
        versions: KRUISE_VERSIONS,
        resource: "nodeimages",
        operations: CREATE_UPDATE,
        namespaced: false,
    },
];

impl ConfigurationParams {
    pub fn mutating_name(&self) -> String {
        format!("{}-mutating-webhook-configuration", self.name_prefix)
    }

    pub fn validating_name(&self) -> String {
        format!("{}-validating-webhook-configuration", self.name_prefix)
    }

    fn client_config(&self, path: &str) -> WebhookClientConfig {
        let ca_bundle = self
            .ca_bundle
            .as_ref()
            .map(|pem| ByteString(pem.as_bytes().to_vec()));
        match &self.endpoint {
            Endpoint::Service {
                namespace,
                name,
                port,
            } => WebhookClientConfig {
                ca_bundle,
                service: Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(path.to_owned()),
                    port: Some(*port),
                }),
                url: None,
            },
            Endpoint::Url(base) => WebhookClientConfig {
                ca_bundle,
                service: None,
                url: Some(format!("{}{path}", base.trim_end_matches('/'))),
            },
        }
    }

    /// The pod webhook's namespaces: [`Self::pod_namespace_selector`] less `kube-system`, the
    /// [`Self::excluded_namespaces`] and namespaces labelled [`CONTROL_PLANE_LABEL`] (upstream's
    /// opt-out: the system's own namespaces can start pods while the webhook is down).
    fn pod_namespaces(&self) -> LabelSelector {
        let mut excluded = vec!["kube-system".to_owned()];
        for ns in &self.excluded_namespaces {
            if !excluded.contains(ns) {
                excluded.push(ns.clone());
            }
        }
        let mut selector = self.pod_namespace_selector.clone().unwrap_or_default();
        let requirements = selector.match_expressions.get_or_insert_with(Vec::new);
        requirements.push(LabelSelectorRequirement {
            key: NAMESPACE_NAME_LABEL.to_owned(),
            operator: "NotIn".to_owned(),
            values: Some(excluded),
        });
        requirements.push(LabelSelectorRequirement {
            key: CONTROL_PLANE_LABEL.to_owned(),
            operator: "DoesNotExist".to_owned(),
            values: None,
        });
        selector
    }

    /// `Fail` for the kruise kinds, whatever the pod webhook's policy (see the module docs).
    fn failure_policy(&self, path: &str) -> FailurePolicy {
        if path == MUTATE_POD {
            self.pod_failure_policy
        } else {
            FailurePolicy::Fail
        }
    }

    fn rules(route: &Route) -> Vec<RuleWithOperations> {
        vec![RuleWithOperations {
            api_groups: Some(vec![route.group.to_owned()]),
            api_versions: Some(route.versions.iter().map(|v| (*v).to_owned()).collect()),
            operations: Some(route.operations.iter().map(|o| (*o).to_owned()).collect()),
            resources: Some(vec![route.resource.to_owned()]),
            scope: Some(
                if route.namespaced {
                    "Namespaced"
                } else {
                    "Cluster"
                }
                .to_owned(),
            ),
        }]
    }

    pub fn mutating(&self) -> MutatingWebhookConfiguration {
        MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(self.mutating_name()),
                ..ObjectMeta::default()
            },
            webhooks: Some(
                MUTATING
                    .iter()
                    .map(|route| MutatingWebhook {
                        name: route.name.to_owned(),
                        admission_review_versions: vec!["v1".to_owned()],
                        client_config: self.client_config(route.path),
                        failure_policy: Some(self.failure_policy(route.path).as_str().to_owned()),
                        match_policy: Some("Equivalent".to_owned()),
                        // None: every namespace (the kruise kinds: see the module docs).
                        namespace_selector: (route.path == MUTATE_POD)
                            .then(|| self.pod_namespaces()),
                        object_selector: (route.path == MUTATE_POD)
                            .then(|| self.pod_object_selector.clone())
                            .flatten(),
                        reinvocation_policy: Some("Never".to_owned()),
                        rules: Some(Self::rules(route)),
                        // The pod webhook records events (a SidecarSet left out for an
                        // unsupported feature), never on a dry run.
                        side_effects: if route.path == MUTATE_POD {
                            "NoneOnDryRun"
                        } else {
                            "None"
                        }
                        .to_owned(),
                        timeout_seconds: Some(self.timeout_seconds),
                        ..MutatingWebhook::default()
                    })
                    .collect(),
            ),
        }
    }

    pub fn validating(&self) -> ValidatingWebhookConfiguration {
        ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(self.validating_name()),
                ..ObjectMeta::default()
            },
            webhooks: Some(
                VALIDATING
                    .iter()
                    .map(|route| ValidatingWebhook {
                        name: route.name.to_owned(),
                        admission_review_versions: vec!["v1".to_owned()],
                        client_config: self.client_config(route.path),
                        failure_policy: Some(self.failure_policy(route.path).as_str().to_owned()),
                        match_policy: Some("Equivalent".to_owned()),
                        // Every namespace: validation is not escapable by namespace.
                        namespace_selector: None,
                        rules: Some(Self::rules(route)),
                        side_effects: "None".to_owned(),
                        timeout_seconds: Some(self.timeout_seconds),
                        ..ValidatingWebhook::default()
                    })
                    .collect(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(endpoint: Endpoint) -> ConfigurationParams {
        ConfigurationParams {
            name_prefix: "kruise-rs".into(),
            endpoint,
            ca_bundle: Some("PEM".into()),
            pod_failure_policy: FailurePolicy::Fail,
            timeout_seconds: 10,
            excluded_namespaces: vec!["kruise-system".into()],
            pod_namespace_selector: None,
            pod_object_selector: None,
        }
    }

    #[test]
    fn pods_are_mutated_on_create_outside_kube_system_and_the_managers_namespace() {
        let config = params(Endpoint::Url("https://127.0.0.1:9443/".into())).mutating();
        let webhooks = config.webhooks.unwrap();
        let pods = webhooks
            .iter()
            .find(|w| w.name == "mutate-pods.kruise-rs.io")
            .unwrap();
        assert_eq!(
            pods.client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/mutate-pod")
        );
        let rule = &pods.rules.as_ref().unwrap()[0];
        assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_owned()][..]));
        assert_eq!(rule.resources.as_deref(), Some(&["pods".to_owned()][..]));
        let selector = pods.namespace_selector.as_ref().unwrap();
        let requirement = &selector.match_expressions.as_ref().unwrap()[0];
        assert_eq!(requirement.operator, "NotIn");
        assert_eq!(
            requirement.values.as_deref(),
            Some(&["kube-system".to_owned(), "kruise-system".to_owned()][..])
        );
        assert_eq!(pods.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(pods.side_effects, "NoneOnDryRun");
        assert_eq!(
            pods.client_config
                .ca_bundle
                .as_ref()
                .map(|b| b.0.as_slice()),
            Some(&b"PEM"[..])
        );
    }

    #[test]
    fn namespaces_labelled_control_plane_opt_out_of_the_pod_webhook_only() {
        let p = params(Endpoint::Url("https://x".into()));
        let opted_out = |selector: &LabelSelector| {
            selector.match_expressions.iter().flatten().any(|r| {
                r.key == CONTROL_PLANE_LABEL && r.operator == "DoesNotExist" && r.values.is_none()
            })
        };
        for webhook in p.mutating().webhooks.unwrap() {
            let selector = webhook.namespace_selector.unwrap_or_default();
            assert_eq!(
                opted_out(&selector),
                webhook.name == "mutate-pods.kruise-rs.io",
                "{}",
                webhook.name
            );
        }
    }

    #[test]
    fn the_object_selector_applies_to_the_pod_webhook_only() {
        let mut p = params(Endpoint::Url("https://x".into()));
        let selector = LabelSelector {
            match_labels: Some([("inject".to_owned(), "yes".to_owned())].into()),
            ..LabelSelector::default()
        };
        p.pod_object_selector = Some(selector.clone());
        for webhook in p.mutating().webhooks.unwrap() {
            let expected = (webhook.name == "mutate-pods.kruise-rs.io").then(|| selector.clone());
            assert_eq!(webhook.object_selector, expected, "{}", webhook.name);
        }
    }

    /// Issue 42: a user's namespace selector (or the exclusions) must not route a job around
    /// its validation: the kruise kinds' webhooks carry no namespace selector at all, which the
    /// apiserver reads as every namespace.
    #[test]
    fn only_the_pod_webhook_is_scoped_by_namespace() {
        let mut p = params(Endpoint::Url("https://x".into()));
        p.pod_namespace_selector = Some(LabelSelector {
            match_labels: Some([("team".to_owned(), "a".to_owned())].into()),
            ..LabelSelector::default()
        });
        let mutating = p.mutating().webhooks.unwrap();
        let validating = p.validating().webhooks.unwrap();
        assert_eq!(mutating.len() + validating.len(), 9);
        for webhook in &mutating {
            let scoped = webhook.namespace_selector.as_ref();
            if webhook.name == "mutate-pods.kruise-rs.io" {
                let labels = scoped.and_then(|s| s.match_labels.as_ref());
                assert_eq!(labels.map(|l| l["team"].as_str()), Some("a"));
            } else {
                assert_eq!(scoped, None, "{}", webhook.name);
            }
        }
        for webhook in &validating {
            assert_eq!(webhook.namespace_selector, None, "{}", webhook.name);
        }
    }

    /// Issue 42: `--webhook-failure-policy Ignore` relaxes the pod webhook only; the kruise
    /// kinds' webhooks, defaulting and validation, stay `Fail` so that an unreachable webhook
    /// admits no unchecked job.
    #[test]
    fn the_kruise_kinds_fail_closed_whatever_the_pod_webhooks_policy() {
        for pod_policy in [FailurePolicy::Fail, FailurePolicy::Ignore] {
            let mut p = params(Endpoint::Url("https://x".into()));
            p.pod_failure_policy = pod_policy;
            let mutating = p.mutating().webhooks.unwrap();
            let validating = p.validating().webhooks.unwrap();
            assert_eq!(validating.len(), 4);
            for webhook in &validating {
                assert_eq!(
                    webhook.failure_policy.as_deref(),
                    Some("Fail"),
                    "{}",
                    webhook.name
                );
            }
            for webhook in &mutating {
                let expected = if webhook.name == "mutate-pods.kruise-rs.io" {
                    pod_policy.as_str()
                } else {
                    "Fail"
                };
                assert_eq!(
                    webhook.failure_policy.as_deref(),
                    Some(expected),
                    "{}",
                    webhook.name
                );
            }
        }
    }

    #[test]
    fn a_service_endpoint_names_the_service_and_path() {
        let config = params(Endpoint::Service {
            namespace: "kruise-system".into(),
            name: "kruise-rs-webhook".into(),
            port: 443,
        })
        .validating();
        let webhook = &config.webhooks.unwrap()[0];
        let service = webhook.client_config.service.as_ref().unwrap();
        assert_eq!(
            (service.name.as_str(), service.path.as_deref(), service.port),
            ("kruise-rs-webhook", Some(VALIDATE_SIDECARSET), Some(443))
        );
        assert!(webhook.client_config.url.is_none());
    }

    #[test]
    fn both_kruise_versions_are_routed() {
        let config = params(Endpoint::Url("https://x".into())).validating();
        for webhook in config.webhooks.unwrap() {
            let versions = webhook.rules.as_ref().unwrap()[0]
                .api_versions
                .clone()
                .unwrap();
            assert_eq!(versions, ["v1beta1", "v1alpha1"], "{}", webhook.name);
        }
    }

    #[test]
    fn an_extra_namespace_selector_is_kept_beside_the_exclusions() {
        let mut p = params(Endpoint::Url("https://x".into()));
        p.pod_namespace_selector = Some(LabelSelector {
            match_labels: Some([("webhook-test".to_owned(), "true".to_owned())].into()),
            ..LabelSelector::default()
        });
        p.pod_failure_policy = FailurePolicy::Ignore;
        let config = p.mutating();
        let pods = &config.webhooks.unwrap()[0];
        let selector = pods.namespace_selector.as_ref().unwrap();
        assert_eq!(
            selector.match_labels.as_ref().unwrap()["webhook-test"],
            "true"
        );
        // The exclusions and the control-plane opt-out.
        assert_eq!(selector.match_expressions.as_ref().unwrap().len(), 2);
        assert_eq!(pods.failure_policy.as_deref(), Some("Ignore"));
    }
}
