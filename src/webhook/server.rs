//! The HTTPS server the apiserver sends AdmissionReviews to: one route per webhook path, each
//! handing the decoded request to [`Admit`] and encoding its [`Verdict`].
//!
//! The response is written here rather than with kube's `AdmissionResponse`, which serializes
//! the patch as an array of numbers; the API documents a base64 string, which is what Go writes
//! and what every apiserver version reads.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use base64::Engine as _;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde_json::{Value, json};
use tower::util::MapResponseLayer;
use tracing::Instrument;

use crate::runtime::ManagerMetrics;

use super::configuration::{
    MUTATE_IMAGELISTPULLJOB, MUTATE_IMAGEPULLJOB, MUTATE_NODEIMAGE, MUTATE_POD, MUTATE_SIDECARSET,
    VALIDATE_IMAGELISTPULLJOB, VALIDATE_IMAGEPULLJOB, VALIDATE_NODEIMAGE, VALIDATE_SIDECARSET,
};

/// What a webhook decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Allow,
    /// Allow, changed by this JSON Patch (mutating webhooks only), with warnings for the user;
    /// with an empty patch, how a validating webhook allows with warnings.
    Patch(json_patch::Patch, Vec<String>),
    /// Refuse, with the reason the user sees.
    Deny(String),
}

/// Every webhook path this server answers.
pub const PATHS: &[&str] = &[
    MUTATE_POD,
    MUTATE_SIDECARSET,
    VALIDATE_SIDECARSET,
    MUTATE_IMAGEPULLJOB,
    VALIDATE_IMAGEPULLJOB,
    MUTATE_IMAGELISTPULLJOB,
    VALIDATE_IMAGELISTPULLJOB,
    MUTATE_NODEIMAGE,
    VALIDATE_NODEIMAGE,
];

pub type AdmitFuture<'a> = Pin<Box<dyn Future<Output = Verdict> + Send + 'a>>;

/// Decides admission requests, by webhook path.
pub trait Admit: Send + Sync + 'static {
    fn admit<'a>(
        &'a self,
        path: &'static str,
        request: &'a AdmissionRequest<DynamicObject>,
    ) -> AdmitFuture<'a>;
}

/// The resource kind a webhook path admits (a label of the admission metrics).
pub fn kind_of(path: &str) -> &'static str {
    match path {
        MUTATE_POD => "pods",
        MUTATE_SIDECARSET | VALIDATE_SIDECARSET => "sidecarsets",
        MUTATE_IMAGEPULLJOB | VALIDATE_IMAGEPULLJOB => "imagepulljobs",
        MUTATE_IMAGELISTPULLJOB | VALIDATE_IMAGELISTPULLJOB => "imagelistpulljobs",
        MUTATE_NODEIMAGE | VALIDATE_NODEIMAGE => "nodeimages",
        _ => "unknown",
    }
}

impl Verdict {
    /// `allowed`, `patched` (a non-empty patch) or `denied` (a label of the admission metrics).
    pub fn outcome(&self) -> &'static str {
        match self {
            Verdict::Patch(patch, _) if !patch.0.is_empty() => "patched",
            Verdict::Allow | Verdict::Patch(..) => "allowed",
            Verdict::Deny(_) => "denied",
        }
    }
}

/// An [`Admit`] that records each decision's kind, verdict and duration in [`ManagerMetrics`].
pub struct Metered {
    pub inner: Arc<dyn Admit>,
    pub metrics: ManagerMetrics,
}

impl Admit for Metered {
    fn admit<'a>(
        &'a self,
        path: &'static str,
        request: &'a AdmissionRequest<DynamicObject>,
    ) -> AdmitFuture<'a> {
        Box::pin(async move {
            let start = Instant::now();
            let verdict = self.inner.admit(path, request).await;
            self.metrics.admitted(
                kind_of(path),
                verdict.outcome(),
                start.elapsed().as_secs_f64(),
            );
            verdict
        })
    }
}

/// The router: `POST <path>` for every path in [`PATHS`].
pub fn router(admit: Arc<dyn Admit>) -> Router {
    let mut router = Router::new();
    for path in PATHS {
        router = router.route(
            path,
            post(
                move |State(admit): State<Arc<dyn Admit>>, body: Bytes| async move {
                    review(admit.as_ref(), path, &body).await
                },
            ),
        );
    }
    router.with_state(admit)
}

/// Decodes one AdmissionReview, decides, encodes the answer.
pub async fn review(admit: &dyn Admit, path: &'static str, body: &[u8]) -> Response {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(err) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not an AdmissionReview: {err}"),
            )
                .into_response();
        }
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(request) => request,
        Err(err) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("no request in the AdmissionReview: {err}"),
            )
                .into_response();
        }
    };
    // Every line logged while deciding carries the object's key, so they group by object.
    let span = tracing::info_span!(
        "admission",
        path,
        kind = %request.kind.kind,
        operation = ?request.operation,
        object = %object_key(&request),
        uid = %request.uid,
    );
    let verdict = admit.admit(path, &request).instrument(span).await;
    axum::Json(response(&request.uid, &verdict)).into_response()
}

/// `namespace/name` of the request's object (`name` alone when cluster-scoped); a pod created
/// from `generateName` has no name yet, so its key ends in `/`.
fn object_key(request: &AdmissionRequest<DynamicObject>) -> String {
    match request.namespace.as_deref() {
        Some(namespace) if !namespace.is_empty() => format!("{namespace}/{}", request.name),
        _ => request.name.clone(),
    }
}

/// The AdmissionReview answering request `uid` with `verdict`.
pub fn response(uid: &str, verdict: &Verdict) -> Value {
    let mut answer = json!({"uid": uid, "allowed": true});
    match verdict {
        Verdict::Allow => {}
        Verdict::Patch(patch, warnings) => {
            if !patch.0.is_empty() {
                let bytes = serde_json::to_vec(patch).unwrap_or_default();
                answer["patchType"] = json!("JSONPatch");
                answer["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
            if !warnings.is_empty() {
                answer["warnings"] = json!(warnings);
            }
        }
        Verdict::Deny(message) => {
            answer["allowed"] = json!(false);
            answer["status"] = json!({"code": 403, "reason": "Forbidden", "message": message});
        }
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer})
}

/// A running HTTPS server.
pub struct Server {
    handle: Handle<SocketAddr>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Set while shutting down: every answer closes its connection.
    draining: Arc<AtomicBool>,
    pub addr: SocketAddr,
}

impl Server {
    /// Serves `router` on `addr` with the PEM certificate and key in `tls`.
    pub async fn start(
        addr: SocketAddr,
        tls: RustlsConfig,
        router: Router,
    ) -> std::io::Result<Self> {
        let handle = Handle::new();
        let draining = Arc::new(AtomicBool::new(false));
        let closing = draining.clone();
        // The apiserver keeps HTTP/1.1 connections to a webhook open and reuses them. While the
        // server drains, each answer closes its connection, so the next request dials again and
        // reaches a replica that stays; none is left idle to be cut under a request at the end.
        let router = router.layer(MapResponseLayer::new(move |mut response: Response| {
            if closing.load(Ordering::Relaxed) {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            response
        }));
        let server = axum_server::bind_rustls(addr, tls)
            .handle(handle.clone())
            .serve(router.into_make_service());
        let task = tokio::spawn(server);
        let Some(addr) = handle.listening().await else {
            return Err(match task.await {
                Ok(Err(err)) => err,
                _ => std::io::Error::other("the webhook server stopped before listening"),
            });
        };
        Ok(Self {
            handle,
            task,
            draining,
            addr,
        })
    }

    /// Keeps serving, closing each connection after its answer (see [`Server::start`]).
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Stops accepting, lets requests in flight finish for up to `grace`.
    pub async fn stop(self, grace: Duration) {
        self.handle.graceful_shutdown(Some(grace));
        let _ = self.task.await;
    }
}

/// The TLS configuration from PEM text, with the ring provider installed first (the process
/// has a single default provider; kube's client uses ring too).
pub async fn tls_config(cert: &str, key: &str) -> std::io::Result<RustlsConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    RustlsConfig::from_pem(cert.as_bytes().to_vec(), key.as_bytes().to_vec()).await
}

#[cfg(test)]
mod tests;
