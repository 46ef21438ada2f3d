//! The admission webhooks, served by the manager: sidecar injection into pods, and defaulting and
//! validation of SidecarSets, ImagePullJobs and NodeImages.
//!
//! [`run`] is their lifecycle:
//! 1. certificates: from `--webhook-cert-dir` (cert-manager or any other issuer), or
//!    self-managed: a CA and a serving certificate kept in a Secret ([`certs`]), created by
//!    whichever replica comes first;
//! 2. the HTTPS server ([`server`]) on `--webhook-addr`;
//! 3. the webhook configurations ([`configuration`]) applied with the CA as `caBundle`;
//! 4. until shutdown, the certificates re-checked at the instant they need renewing, the server
//!    reloaded and the configurations re-applied when they change.
//!
//! What each webhook decides lives in pure functions elsewhere (`crate::sidecar` for injection,
//! `crate::apis::defaults` and `crate::apis::validation`); [`handlers`] adapts them to requests.

pub mod certs;
pub mod configuration;
mod confirmed_sidecarsets;
pub mod dry_run;
pub mod handlers;
pub mod secret_access;
pub mod server;
pub mod unreadable_sidecarsets;
pub mod unsupported_events;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;
use tracing::{info, warn};

use self::certs::{Certificates, Decision, ServingNames};
pub use self::configuration::{ConfigurationParams, Endpoint, FailurePolicy};
use self::server::{Admit, Server};
pub use self::unreadable_sidecarsets::UnreadableSidecarSetPolicy;
use crate::runtime::{self, START_UP_PATIENCE, retry_while};

/// Field manager of the webhook configurations.
pub const FIELD_MANAGER: &str = "kruise-rs-webhook";
/// How long requests in flight may take once shutdown has begun.
const DRAIN: Duration = Duration::from_secs(5);
/// Longest pause between certificate checks (a Secret edited by hand is noticed by then).
const RECHECK: Duration = Duration::from_secs(6 * 3600);

/// Where the certificates come from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// Generated and kept in this Secret of the manager's namespace.
    SelfManaged { secret: String },
    /// `tls.crt` and `tls.key` (and `ca.crt`, put into `caBundle` when present) in this
    /// directory, as cert-manager writes them.
    Directory(PathBuf),
}

/// What the webhooks need to start.
#[derive(Clone, Debug)]
pub struct WebhookOptions {
    /// Where the HTTPS server listens.
    pub addr: SocketAddr,
    /// The manager's own namespace: holds the certificate Secret, and is never sent to the
    /// webhook (nor is `kube-system`).
    pub namespace: String,
    pub certs: CertSource,
    /// How the apiserver reaches the server.
    pub endpoint: Endpoint,
    /// The pod webhook's `failurePolicy`; the kruise kinds' webhooks always `Fail`.
    pub pod_failure_policy: FailurePolicy,
    pub timeout_seconds: i32,
    /// Prefix of the configuration names.
    pub configuration_prefix: String,
    /// Extra requirements on the namespaces of pods sent to the pod webhook (the exclusions
    /// always apply). The kruise kinds' webhooks see every namespace whatever it says.
    pub pod_namespace_selector: Option<LabelSelector>,
    /// The pod webhook's `objectSelector` (none: every pod).
    pub pod_object_selector: Option<LabelSelector>,
    /// Allow SidecarSet `patchPodMetadata` that no rule of the whitelist ConfigMap covers
    /// (`--sidecarset-patch-pod-metadata-defaults-allowed`, upstream's feature gate
    /// `SidecarSetPatchPodMetadataDefaultsAllowed`; off by default, as upstream).
    pub patch_pod_metadata_defaults_allowed: bool,
    /// What the pod webhook does with a pod an unreadable SidecarSet may select
    /// (`--unreadable-sidecarset-policy`, decision 0027).
    pub unreadable_sidecarset_policy: UnreadableSidecarSetPolicy,
    /// How long the server keeps answering once shutdown has begun (`/readyz` already failing),
    /// so the apiserver stops sending requests before they can find it gone.
    pub shutdown_grace: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("cannot read the webhook certificate {path}")]
    ReadCert {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    #[error("cannot {what} (the manager needs that permission for its webhooks)")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("the Secret {secret} kept changing while the webhook certificates were written")]
    SecretContention { secret: String },
    #[error("the webhook's SidecarSet and Namespace caches stopped")]
    CachesStopped,
    #[error("cannot load the webhook certificate and key")]
    Tls(#[source] std::io::Error),
    #[error("cannot listen on {addr} for the webhooks; choose another --webhook-addr")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl WebhookError {
    /// Whether the API server refused for a moment (429, 5xx, unreachable): start-up asks again.
    fn is_transient(&self) -> bool {
        matches!(self, WebhookError::Api { source, .. } if runtime::is_transient(source))
    }
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> WebhookError {
    let what = what.into();
    move |source| WebhookError::Api { what, source }
}

/// The names the serving certificate covers: the Service's DNS names (or the URL's host) and
/// loopback.
fn serving_names(opts: &WebhookOptions) -> ServingNames {
    match &opts.endpoint {
        Endpoint::Service {
            namespace, name, ..
        } => ServingNames::for_service(name, namespace),
        Endpoint::Url(url) => {
            let mut names = ServingNames::for_service("kruise-rs-webhook", &opts.namespace);
            let host = url
                .trim_start_matches("https://")
                .split(['/', ':'])
                .next()
                .unwrap_or_default();
            match host.parse() {
                Ok(ip) if !names.ips.contains(&ip) => names.ips.push(ip),
                Ok(_) => {}
                Err(_) if !host.is_empty() && !names.dns.iter().any(|n| n == host) => {
                    names.dns.push(host.to_owned())
                }
                Err(_) => {}
            }
            names
        }
    }
}

/// Makes sure the Secret holds usable certificates and returns them.
async fn self_managed(
    client: &Client,
    opts: &WebhookOptions,
    secret: &str,
) -> Result<Certificates, WebhookError> {
    let names = serving_names(opts);
    let secrets = Api::<Secret>::namespaced(client.clone(), &opts.namespace);
    for _ in 0..5 {
        let current = secrets.get_opt(secret).await.map_err(api_error(format!(
            "read the Secret {}/{secret}",
            opts.namespace
        )))?;
        let found = current.as_ref().and_then(certs::from_secret);
        let now = Timestamp::now();
        let fresh = match (certs::decide(found.as_ref(), &names, now), found) {
            (Decision::Keep, Some(found)) => return Ok(found),
            (Decision::RenewServing, Some(existing)) => {
                certs::renew_serving(&existing, &names, now)?
            }
            _ => certs::new_ca(&names, now)?,
        };
        let mut object = certs::to_secret(&fresh, secret, &opts.namespace);
        let written = match current {
            Some(current) => {
                // Replace only what was read: another replica writing first wins.
                object.metadata.resource_version = current.metadata.resource_version;
                secrets
                    .replace(secret, &PostParams::default(), &object)
                    .await
            }
            None => {
                ensure_namespace(client, &opts.namespace).await?;
                secrets.create(&PostParams::default(), &object).await
            }
        };
        match written {
            Ok(_) => {
                info!(secret = %format!("{}/{secret}", opts.namespace), not_after = %fresh.not_after, "webhook certificates written");
                return Ok(fresh);
            }
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(err) => {
                return Err(api_error(format!(
                    "write the Secret {}/{secret}",
                    opts.namespace
                ))(err));
            }
        }
    }
    Err(WebhookError::SecretContention {
        secret: format!("{}/{secret}", opts.namespace),
    })
}

async fn ensure_namespace(client: &Client, name: &str) -> Result<(), WebhookError> {
    let namespaces = Api::<Namespace>::all(client.clone());
    // Read first: an installation that ships the namespace gives the manager no `create`.
    match namespaces.get_opt(name).await {
        Ok(Some(_)) => return Ok(()),
        Ok(None) => {}
        Err(err) => return Err(api_error(format!("read the namespace {name}"))(err)),
    }
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match namespaces.create(&PostParams::default(), &namespace).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(api_error(format!("create the namespace {name}"))(err)),
    }
}

/// The certificate and key to serve, the CA for `caBundle`, and when to look again.
struct Loaded {
    cert: String,
    key: String,
    ca: Option<String>,
    next_check: Duration,
}

async fn load(client: &Client, opts: &WebhookOptions) -> Result<Loaded, WebhookError> {
    match &opts.certs {
        CertSource::SelfManaged { secret } => {
            let certs = self_managed(client, opts, secret).await?;
            let renew_at = certs
                .not_after
                .checked_sub(SignedDuration::from_hours(24 * 30))
                .unwrap_or(certs.not_after);
            let until = Timestamp::now().duration_until(renew_at);
            let next_check = Duration::try_from(until)
                .unwrap_or(Duration::ZERO)
                .min(RECHECK);
            Ok(Loaded {
                cert: certs.cert,
                key: certs.key,
                ca: Some(certs.ca_cert),
                next_check: next_check.max(Duration::from_secs(60)),
            })
        }
        CertSource::Directory(dir) => {
            let read = |name: &str| {
                let path = dir.join(name);
                std::fs::read_to_string(&path)
                    .map_err(|source| WebhookError::ReadCert { path, source })
            };
            Ok(Loaded {
                cert: read("tls.crt")?,
                key: read("tls.key")?,
                ca: read("ca.crt").ok(),
                next_check: Duration::from_secs(300),
            })
        }
    }
}

fn configuration_params(opts: &WebhookOptions, ca: Option<String>) -> ConfigurationParams {
    ConfigurationParams {
        name_prefix: opts.configuration_prefix.clone(),
        endpoint: opts.endpoint.clone(),
        ca_bundle: ca,
        pod_failure_policy: opts.pod_failure_policy,
        timeout_seconds: opts.timeout_seconds,
        excluded_namespaces: vec![opts.namespace.clone()],
        pod_namespace_selector: opts.pod_namespace_selector.clone(),
        pod_object_selector: opts.pod_object_selector.clone(),
    }
}

/// Applies both configurations (server-side apply, forced: they are ours).
async fn apply_configurations(
    client: &Client,
    params: &ConfigurationParams,
) -> Result<(), WebhookError> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    let mutating = params.mutating();
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(
            &params.mutating_name(),
            &apply,
            &Patch::Apply(&with_type(&mutating, "MutatingWebhookConfiguration")),
        )
        .await
        .map_err(api_error(format!(
            "apply the MutatingWebhookConfiguration {}",
            params.mutating_name()
        )))?;
    let validating = params.validating();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(
            &params.validating_name(),
            &apply,
            &Patch::Apply(&with_type(&validating, "ValidatingWebhookConfiguration")),
        )
        .await
        .map_err(api_error(format!(
            "apply the ValidatingWebhookConfiguration {}",
            params.validating_name()
        )))?;
    Ok(())
}

/// An apply body needs apiVersion and kind, which the typed structs do not serialize.
fn with_type(object: &impl serde::Serialize, kind: &str) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    value["apiVersion"] = "admissionregistration.k8s.io/v1".into();
    value["kind"] = kind.into();
    value
}

/// Serves the webhooks until `shutdown` resolves. `on_ready` receives the bound address once the
/// server answers and the configurations point at it.
pub async fn run(
    client: Client,
    opts: WebhookOptions,
    admit: Arc<dyn Admit>,
    shutdown: impl Future<Output = ()>,
    on_ready: Option<oneshot::Sender<SocketAddr>>,
) -> Result<(), WebhookError> {
    let mut shutdown = pin!(shutdown);
    let loaded = retry_while(
        "loading the webhook certificates",
        START_UP_PATIENCE,
        WebhookError::is_transient,
        || load(&client, &opts),
    )
    .await?;
    let tls = server::tls_config(&loaded.cert, &loaded.key)
        .await
        .map_err(WebhookError::Tls)?;
    let server = Server::start(opts.addr, tls.clone(), server::router(admit))
        .await
        .map_err(|source| WebhookError::Bind {
            addr: opts.addr,
            source,
        })?;
    let mut ca = loaded.ca.clone();
    let params = configuration_params(&opts, ca.clone());
    retry_while(
        "registering the webhooks",
        START_UP_PATIENCE,
        WebhookError::is_transient,
        || apply_configurations(&client, &params),
    )
    .await?;
    info!(addr = %server.addr, endpoint = ?opts.endpoint, "webhooks serving");
    if let Some(on_ready) = on_ready {
        let _ = on_ready.send(server.addr);
    }
    let mut next_check = loaded.next_check;
    let mut served = (loaded.cert, loaded.key);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(next_check) => {}
        }
        match load(&client, &opts).await {
            Ok(loaded) => {
                next_check = loaded.next_check;
                if (loaded.cert.as_str(), loaded.key.as_str())
                    != (served.0.as_str(), served.1.as_str())
                {
                    match tls
                        .reload_from_pem(
                            loaded.cert.as_bytes().to_vec(),
                            loaded.key.as_bytes().to_vec(),
                        )
                        .await
                    {
                        Ok(()) => info!("webhook serving certificate reloaded"),
                        Err(err) => {
                            warn!(error = %err, "cannot reload the webhook certificate; serving the old one")
                        }
                    }
                    served = (loaded.cert, loaded.key);
                }
                if loaded.ca != ca {
                    ca = loaded.ca;
                    if let Err(err) =
                        apply_configurations(&client, &configuration_params(&opts, ca.clone()))
                            .await
                    {
                        warn!(error = %err, "cannot update the webhook configurations' caBundle");
                    }
                }
            }
            Err(err) => {
                warn!(error = %err, "cannot check the webhook certificates; retrying in a minute");
                next_check = Duration::from_secs(60);
            }
        }
    }
    if !opts.shutdown_grace.is_zero() {
        info!(grace = ?opts.shutdown_grace, "webhooks keep answering while the endpoints drop this replica");
        server.drain();
        tokio::time::sleep(opts.shutdown_grace).await;
    }
    server.stop(DRAIN).await;
    Ok(())
}
