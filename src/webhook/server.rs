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
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use base64::Engine as _;
use futures::StreamExt;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde_json::{Value, json};
use tower::util::MapResponseLayer;
use tracing::Instrument;

use kruise_rs_controller::metrics::ManagerMetrics;

use super::admission_deadline::AdmissionDeadline;
use super::configuration::{
    MUTATE_IMAGELISTPULLJOB, MUTATE_IMAGEPULLJOB, MUTATE_NODEIMAGE, MUTATE_POD, MUTATE_SIDECARSET,
    VALIDATE_IMAGELISTPULLJOB, VALIDATE_IMAGEPULLJOB, VALIDATE_NODEIMAGE, VALIDATE_SIDECARSET,
};

/// The largest AdmissionReview the server reads, in bytes. kube-apiserver refuses a request body
/// over `--max-request-body-bytes` (3 MiB by default), so an object it admits is about that
/// size at most; an UPDATE's review carries two (`object` and `oldObject`) and an envelope
/// (kinds, user info with its groups and extras, options: kilobytes). 2 × 3 MiB + 1 MiB of
/// margin = 7 MiB. axum's default limit (2 MiB) answered 413 to the UPDATE of any object over
/// 1 MiB, which the apiserver reads as the webhook failing: with `failurePolicy: Ignore`, an
/// unvalidated admission.
pub(crate) const MAX_REVIEW_BYTES: usize = 7 * 1024 * 1024;

/// How much of a body over [`MAX_REVIEW_BYTES`] is kept to find its request's uid.
const HEAD_BYTES: usize = 4096;

/// Why a request body was not read.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    #[error(
        "the AdmissionReview ({}) is over the webhook's limit of {MAX_REVIEW_BYTES} bytes \
         (twice kube-apiserver's default 3 MiB request limit, and the envelope)",
        .declared.map_or_else(|| "more bytes".to_owned(), |n| format!("{n} bytes"))
    )]
    TooLarge {
        /// Its Content-Length, when it gave one.
        declared: Option<u64>,
        /// Its first bytes, where the apiserver writes the request's uid.
        head: Vec<u8>,
    },
    #[error("cannot read the request body")]
    Read(#[source] axum::Error),
}

/// Reads a body of at most `limit` bytes; one declared or found larger is not read further.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Vec<u8>, BodyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let declared_too_large = declared.is_some_and(|n| n > limit as u64);
    let mut stream = body.into_data_stream();
    let mut read = Vec::new();
    while let Some(chunk) = stream.next().await {
        read.extend_from_slice(&chunk.map_err(BodyError::Read)?);
        if read.len() > limit || (declared_too_large && read.len() >= HEAD_BYTES) {
            break;
        }
    }
    if read.len() > limit || declared_too_large {
        read.truncate(HEAD_BYTES);
        return Err(BodyError::TooLarge {
            declared,
            head: read,
        });
    }
    Ok(read)
}

/// The `request.uid` of an AdmissionReview from its first bytes. The apiserver encodes with Go's
/// encoder, fields in declaration order: `kind`, `apiVersion`, then `request`, whose first field
/// is `uid`. None for anything else.
fn uid_in_head(head: &[u8]) -> Option<String> {
    // The head may end inside a character.
    let text = match std::str::from_utf8(head) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
    };
    let (_, rest) = text.split_once("\"request\":")?;
    let rest = rest.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest
        .strip_prefix("\"uid\":")?
        .trim_start()
        .strip_prefix('"')?;
    let (uid, _) = rest.split_once('"')?;
    let plausible = !uid.is_empty()
        && uid.len() <= 128
        && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    plausible.then(|| uid.to_owned())
}

/// The answer to a body over the limit: a denial when its uid can be read (so the request is
/// refused whatever the webhook's failurePolicy), else 413 (the apiserver applies the policy;
/// the kruise kinds' webhooks `Fail`).
fn oversized(path: &'static str, head: &[u8], message: String) -> Response {
    tracing::warn!(path, "{message}");
    match uid_in_head(head) {
        Some(uid) => axum::Json(response(&uid, &Verdict::Deny(message))).into_response(),
        None => (StatusCode::PAYLOAD_TOO_LARGE, message).into_response(),
    }
}

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
pub(crate) const PATHS: &[&str] = &[
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
pub(crate) fn kind_of(path: &str) -> &'static str {
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
pub(crate) struct Metered {
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
            let mut unanswered = Unanswered {
                metrics: &self.metrics,
                kind: kind_of(path),
                start: Instant::now(),
                answered: false,
            };
            let verdict = self.inner.admit(path, request).await;
            unanswered.answered = true;
            self.metrics.admitted(
                unanswered.kind,
                verdict.outcome(),
                unanswered.start.elapsed().as_secs_f64(),
            );
            verdict
        })
    }
}

/// Counts a decision dropped before it was made (its deadline passed, or the apiserver hung up)
/// as `abandoned`.
struct Unanswered<'a> {
    metrics: &'a ManagerMetrics,
    kind: &'static str,
    start: Instant,
    answered: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            let seconds = self.start.elapsed().as_secs_f64();
            self.metrics.admitted(self.kind, "abandoned", seconds);
        }
    }
}

/// The router: `POST <path>` for every path in [`PATHS`], bodies up to [`MAX_REVIEW_BYTES`],
/// each decided within the time its `timeout` parameter gives ([`AdmissionDeadline`]).
pub(crate) fn router(admit: Arc<dyn Admit>) -> Router {
    let mut router = Router::new();
    for path in PATHS {
        router = router.route(
            path,
            post(
                move |State(admit): State<Arc<dyn Admit>>,
                      uri: Uri,
                      headers: HeaderMap,
                      body: Body| async move {
                    // Counted from the arrival: reading the body is part of the call's time.
                    let deadline =
                        AdmissionDeadline::from_query(uri.query(), tokio::time::Instant::now());
                    match read_body(&headers, body, MAX_REVIEW_BYTES).await {
                        Ok(body) => review(admit.as_ref(), path, &body, &deadline).await,
                        Err(error) => match &error {
                            BodyError::TooLarge { head, .. } => {
                                oversized(path, head, error.to_string())
                            }
                            BodyError::Read(_) => {
                                (StatusCode::BAD_REQUEST, error.to_string()).into_response()
                            }
                        },
                    }
                },
            ),
        );
    }
    router.with_state(admit)
}

/// Decodes one AdmissionReview, decides by `deadline`, encodes the answer. A decision not made
/// by then is dropped and the request refused, while the apiserver still waits for the answer.
pub async fn review(
    admit: &dyn Admit,
    path: &'static str,
    body: &[u8],
    deadline: &AdmissionDeadline,
) -> Response {
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
    let decided = tokio::time::timeout_at(
        deadline.at,
        admit.admit(path, &request).instrument(span.clone()),
    );
    let verdict = match decided.await {
        Ok(verdict) => verdict,
        Err(_) => {
            let refusal = deadline.refusal();
            span.in_scope(|| tracing::warn!(%refusal, "admission refused: out of time"));
            Verdict::Deny(refusal)
        }
    };
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
pub(crate) struct Server {
    handle: Handle<SocketAddr>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    /// Set while shutting down: every answer closes its connection.
    draining: Arc<AtomicBool>,
    pub addr: SocketAddr,
}

impl Server {
    /// Serves `router` on `addr` with the PEM certificate and key in `tls`.
    pub(crate) async fn start(
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
    pub(crate) fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Stops accepting, lets requests in flight finish for up to `grace`.
    pub(crate) async fn stop(self, grace: Duration) {
        self.handle.graceful_shutdown(Some(grace));
        let _ = self.task.await;
    }
}

/// The TLS configuration from PEM text, with the ring provider installed first (the process
/// has a single default provider; kube's client uses ring too).
pub(crate) async fn tls_config(cert: &str, key: &str) -> std::io::Result<RustlsConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    RustlsConfig::from_pem(cert.as_bytes().to_vec(), key.as_bytes().to_vec()).await
}

#[cfg(test)]
mod tests;
