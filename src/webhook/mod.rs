//! The admission webhooks, served by the manager: sidecar injection into pods, and defaulting and
//! validation of SidecarSets, ImagePullJobs and NodeImages.
//!
//! [`run`] is their lifecycle:
//! 1. certificates: from `--webhook-cert-dir` (cert-manager or any other issuer), or
//!    self-managed: a CA and a serving certificate kept in a Secret ([`certs`]), created by
//!    whichever replica comes first;
//! 2. the HTTPS server ([`server`]) on `--webhook-addr`;
//! 3. the webhook configurations ([`configuration`]) applied with the CA as `caBundle`;
//! 4. until shutdown, self-managed: the Secret watched, and re-checked when a renewal or the end
//!    of a rotation's grace comes due; a new CA goes into `caBundle` beside the previous ones
//!    before this replica serves a certificate it signed (a deleted Secret is recreated by the
//!    replica whose create wins). From a directory: read again every five minutes.
//!
//! What each webhook decides lives in pure functions elsewhere (`kruise_rs_sidecar` for injection,
//! `kruise_rs_api::defaults` and `kruise_rs_api::validation`); [`handlers`] adapts them to requests.

pub mod admission_deadline;
pub mod certs;
pub mod configuration;
mod confirmed_sidecarsets;
pub mod dry_run;
pub mod handlers;
mod preserving_patch;
pub mod secret_access;
pub mod server;
pub mod unreadable_sidecarsets;
pub mod unsupported_events;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::oneshot;
use tracing::{info, warn};

use self::certs::{Certificates, Decision, Serve, ServingNames};
pub use self::configuration::{ConfigurationParams, Endpoint, FailurePolicy};
pub use self::confirmed_sidecarsets::SidecarSetCacheReads;
use self::server::{Admit, Server};
pub use self::unreadable_sidecarsets::UnreadableSidecarSetPolicy;
use kruise_rs_kube::{START_UP_PATIENCE, retry_while};

/// Field manager of the webhook configurations.
pub(crate) const FIELD_MANAGER: &str = "kruise-rs-webhook";
/// How long requests in flight may take once shutdown has begun.
const DRAIN: Duration = Duration::from_secs(5);
/// Longest pause between certificate checks without a Secret event.
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
    /// Sidecar containers are injected in name order (`--sidecarset-sort-containers-by-name`,
    /// upstream's feature gate `EnableSortSidecarContainerByName`; off by default, as upstream).
    pub sort_sidecar_containers_by_name: bool,
    /// What the pod webhook does with a pod an unreadable SidecarSet may select
    /// (`--unreadable-sidecarset-policy`, decision 0027).
    pub unreadable_sidecarset_policy: UnreadableSidecarSetPolicy,
    /// Whether the pod webhook confirms its SidecarSet cache before each admission
    /// (`--sidecarset-cache-fence`, decisions 0031, 0044 and 0046).
    pub sidecarset_cache_reads: SidecarSetCacheReads,
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
        matches!(self, WebhookError::Api { source, .. } if kruise_rs_kube::is_transient(source))
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

/// Makes sure the Secret holds usable certificates and returns them. A new CA keeps
/// `trusted_before` (the `caBundle` this replica published, if any) as its previous CAs; when the
/// Secret is there, its own bundle is what was trusted before.
async fn self_managed(
    client: &Client,
    opts: &WebhookOptions,
    secret: &str,
    trusted_before: Option<&str>,
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
            (Decision::DropPrevious, Some(existing)) => certs::drop_previous(&existing),
            (_, Some(existing)) => {
                // Both what the Secret's CA and what this replica published are trusted now.
                let mut before = certs::ca_bundle(&existing);
                before.push_str(trusted_before.unwrap_or_default());
                certs::new_ca(&names, now, Some(&before))?
            }
            (_, None) => certs::new_ca(&names, now, trusted_before)?,
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
                // Create is the arbiter: AlreadyExists means another replica won, and its
                // certificates are read and adopted on the next turn.
                secrets.create(&PostParams::default(), &object).await
            }
        };
        match written {
            Ok(_) => {
                info!(secret = %format!("{}/{secret}", opts.namespace), not_after = %fresh.not_after, previous_cas_until = ?fresh.previous.as_ref().map(|p| p.until), "webhook certificates written");
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

/// Certificates from `--webhook-cert-dir`: what to serve and the CA for `caBundle`.
struct FromDirectory {
    cert: String,
    key: String,
    ca: Option<String>,
}

/// How often `--webhook-cert-dir` is read again.
const DIRECTORY_RECHECK: Duration = Duration::from_secs(300);
/// When a check of the self-managed certificates failed, the next one.
const RETRY: Duration = Duration::from_secs(30);

fn read_directory(dir: &std::path::Path) -> Result<FromDirectory, WebhookError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| WebhookError::ReadCert { path, source })
    };
    Ok(FromDirectory {
        cert: read("tls.crt")?,
        key: read("tls.key")?,
        ca: read("ca.crt").ok(),
    })
}

/// The next check of self-managed certificates when no Secret event comes first: their renewal,
/// or the end of the previous CAs' grace.
fn recheck_in(certs: &Certificates, now: Timestamp) -> Duration {
    let renew_at = certs
        .not_after
        .checked_sub(SignedDuration::from_hours(24 * certs::RENEW_BEFORE_DAYS))
        .unwrap_or(certs.not_after);
    let at = match &certs.previous {
        Some(previous) => renew_at.min(previous.until),
        None => renew_at,
    };
    Duration::try_from(now.duration_until(at))
        .unwrap_or(Duration::ZERO)
        .clamp(Duration::from_secs(1), RECHECK)
}

/// A replica's side of the self-managed certificates: what it serves and what `caBundle` it
/// published, moved along as the Secret changes.
struct Rotation {
    secret: String,
    /// What the TLS acceptor holds.
    served: Certificates,
    /// The `caBundle` this replica last applied, and since when it holds its newest CA.
    published: Option<String>,
    published_at: tokio::time::Instant,
}

impl Rotation {
    /// Reads (and if need be writes) the Secret, publishes its `caBundle`, then serves its
    /// certificate once [`certs::serve`] allows. Returns when to look again without an event.
    async fn step(
        &mut self,
        client: &Client,
        opts: &WebhookOptions,
        tls: &axum_server::tls_rustls::RustlsConfig,
    ) -> Duration {
        let certs = match self_managed(client, opts, &self.secret, self.published.as_deref()).await
        {
            Ok(certs) => certs,
            Err(err) => {
                warn!(error = %err, retry_in = ?RETRY, "cannot check the webhook certificates");
                return RETRY;
            }
        };
        let bundle = certs::ca_bundle(&certs);
        if self.published.as_deref() != Some(bundle.as_str()) {
            let params = configuration_params(opts, Some(bundle.clone()));
            if let Err(err) = apply_configurations(client, &params).await {
                // A CA not yet published is not served: keep the old certificate.
                warn!(error = %err, retry_in = ?RETRY, "cannot update the webhook configurations' caBundle");
                return RETRY;
            }
            let before = self
                .published
                .as_deref()
                .map(certs::pem_certificates)
                .unwrap_or_default();
            if certs::pem_certificates(&bundle)
                .iter()
                .any(|cert| !before.contains(cert))
            {
                self.published_at = tokio::time::Instant::now();
            }
            info!(
                cas = certs::pem_certificates(&bundle).len(),
                "webhook configurations' caBundle updated"
            );
            self.published = Some(bundle);
        }
        let mut next = recheck_in(&certs, Timestamp::now());
        if (certs.cert.as_str(), certs.key.as_str())
            != (self.served.cert.as_str(), self.served.key.as_str())
        {
            match certs::serve(
                &self.served.ca_cert,
                &certs.ca_cert,
                self.published.as_deref(),
                self.published_at.elapsed(),
            ) {
                Serve::Now => match tls
                    .reload_from_pem(
                        certs.cert.as_bytes().to_vec(),
                        certs.key.as_bytes().to_vec(),
                    )
                    .await
                {
                    Ok(()) => {
                        info!(not_after = %certs.not_after, "webhook serving certificate reloaded");
                        self.served = certs;
                    }
                    Err(err) => {
                        warn!(error = %err, "cannot reload the webhook certificate; serving the old one");
                        next = RETRY;
                    }
                },
                Serve::After(left) => {
                    info!(in_ = ?left, "a new webhook CA is published; serving its certificate once the apiservers use it");
                    next = next.min(left);
                }
                Serve::NotPublished => next = RETRY,
            }
        }
        next
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
    let (cert, key, ca, self_managed_certs) = match &opts.certs {
        CertSource::SelfManaged { secret } => {
            let certs = retry_while(
                "loading the webhook certificates",
                START_UP_PATIENCE,
                WebhookError::is_transient,
                || self_managed(&client, &opts, secret, None),
            )
            .await?;
            let bundle = certs::ca_bundle(&certs);
            (
                certs.cert.clone(),
                certs.key.clone(),
                Some(bundle),
                Some(certs),
            )
        }
        CertSource::Directory(dir) => {
            let found = read_directory(dir)?;
            (found.cert, found.key, found.ca, None)
        }
    };
    let tls = server::tls_config(&cert, &key)
        .await
        .map_err(WebhookError::Tls)?;
    let server = Server::start(opts.addr, tls.clone(), server::router(admit))
        .await
        .map_err(|source| WebhookError::Bind {
            addr: opts.addr,
            source,
        })?;
    let params = configuration_params(&opts, ca.clone());
    retry_while(
        "registering the webhooks",
        START_UP_PATIENCE,
        WebhookError::is_transient,
        || apply_configurations(&client, &params),
    )
    .await?;
    info!(
        addr = %server.addr,
        endpoint = ?opts.endpoint,
        sidecarset_cache = ?opts.sidecarset_cache_reads,
        "webhooks serving"
    );
    if let Some(on_ready) = on_ready {
        let _ = on_ready.send(server.addr);
    }
    match (&opts.certs, self_managed_certs) {
        (CertSource::SelfManaged { secret }, Some(served)) => {
            let rotation = Rotation {
                secret: secret.clone(),
                served,
                published: ca,
                published_at: tokio::time::Instant::now(),
            };
            follow_secret(&client, &opts, rotation, &tls, shutdown.as_mut()).await;
        }
        (CertSource::Directory(dir), _) => {
            follow_directory(
                &client,
                &opts,
                dir,
                (cert, key, ca),
                &tls,
                shutdown.as_mut(),
            )
            .await;
        }
        (CertSource::SelfManaged { .. }, None) => {}
    }
    if !opts.shutdown_grace.is_zero() {
        info!(grace = ?opts.shutdown_grace, "webhooks keep answering while the endpoints drop this replica");
        server.drain();
        tokio::time::sleep(opts.shutdown_grace).await;
    }
    server.stop(DRAIN).await;
    Ok(())
}

/// Until `shutdown`: the certificate Secret watched (by name), each change or deletion, and each
/// renewal or grace end that comes due, handled by [`Rotation::step`].
async fn follow_secret(
    client: &Client,
    opts: &WebhookOptions,
    mut rotation: Rotation,
    tls: &axum_server::tls_rustls::RustlsConfig,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) {
    let secrets = Api::<Secret>::namespaced(client.clone(), &opts.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", rotation.secret));
    let mut events = pin!(watcher(secrets, config).default_backoff());
    let mut next = recheck_in(&rotation.served, Timestamp::now());
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            Some(event) = events.next() => match event {
                // The listing's objects come with its end (InitDone).
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
                Ok(_) => {}
                Err(err) => {
                    warn!(error = %err, "the webhook certificate Secret's watch failed; retrying");
                    continue;
                }
            },
            () = tokio::time::sleep(next) => {}
        }
        next = rotation.step(client, opts, tls).await;
    }
}

/// Until `shutdown`: `--webhook-cert-dir` read again every [`DIRECTORY_RECHECK`], the server
/// reloaded and the configurations re-applied when it changed.
async fn follow_directory(
    client: &Client,
    opts: &WebhookOptions,
    dir: &std::path::Path,
    (cert, key, mut ca): (String, String, Option<String>),
    tls: &axum_server::tls_rustls::RustlsConfig,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) {
    let mut served = (cert, key);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(DIRECTORY_RECHECK) => {}
        }
        let found = match read_directory(dir) {
            Ok(found) => found,
            Err(err) => {
                warn!(error = %err, "cannot read the webhook certificates; serving the old ones");
                continue;
            }
        };
        if (found.cert.as_str(), found.key.as_str()) != (served.0.as_str(), served.1.as_str()) {
            match tls
                .reload_from_pem(
                    found.cert.as_bytes().to_vec(),
                    found.key.as_bytes().to_vec(),
                )
                .await
            {
                Ok(()) => info!("webhook serving certificate reloaded"),
                Err(err) => {
                    warn!(error = %err, "cannot reload the webhook certificate; serving the old one")
                }
            }
            served = (found.cert, found.key);
        }
        if found.ca != ca {
            ca = found.ca;
            if let Err(err) =
                apply_configurations(client, &configuration_params(opts, ca.clone())).await
            {
                warn!(error = %err, "cannot update the webhook configurations' caBundle");
            }
        }
    }
}
