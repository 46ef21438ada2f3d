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
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum_server::Handle;
use axum_server::tls_rustls::RustlsConfig;
use base64::Engine as _;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use serde_json::{Value, json};
use tracing::Instrument;

use crate::runtime::ManagerMetrics;

use super::configuration::{
    MUTATE_IMAGEPULLJOB, MUTATE_NODEIMAGE, MUTATE_POD, MUTATE_SIDECARSET, VALIDATE_IMAGEPULLJOB,
    VALIDATE_NODEIMAGE, VALIDATE_SIDECARSET,
};

/// What a webhook decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Allow,
    /// Allow, changed by this JSON Patch (mutating webhooks only), with warnings for the user.
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
        Ok(Self { handle, task, addr })
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
mod tests {
    use super::*;
    use crate::runtime::ADMISSION_KINDS;
    use json_patch::{AddOperation, PatchOperation};

    #[test]
    fn a_patch_goes_out_base64_encoded() {
        let patch = json_patch::Patch(vec![PatchOperation::Add(AddOperation {
            path: jsonptr::PointerBuf::parse("/metadata/labels/a").unwrap(),
            value: json!("b"),
        })]);
        let out = response("u1", &Verdict::Patch(patch.clone(), vec!["w".into()]));
        let response = &out["response"];
        assert_eq!(response["uid"], "u1");
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(response["patch"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<json_patch::Patch>(&decoded).unwrap(),
            patch
        );
        assert_eq!(response["warnings"], json!(["w"]));
    }

    /// A log sink the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs one line while deciding, as the handlers do when something goes wrong.
    struct LogsAndAllows;

    impl Admit for LogsAndAllows {
        fn admit<'a>(
            &'a self,
            _path: &'static str,
            _request: &'a AdmissionRequest<DynamicObject>,
        ) -> AdmitFuture<'a> {
            Box::pin(async {
                tracing::warn!("deciding");
                Verdict::Allow
            })
        }
    }

    #[tokio::test]
    async fn lines_logged_while_deciding_name_the_object() {
        let logs = Captured::default();
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || sink.clone())
            .finish();
        let _default = tracing::subscriber::set_default(subscriber);
        let body = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u3",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "shop",
                "name": "web-0",
                "userInfo": {},
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0"}},
            },
        });
        let answer = review(&LogsAndAllows, PATHS[0], body.to_string().as_bytes()).await;
        assert_eq!(answer.status(), StatusCode::OK);
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.lines().next().expect("a line")).unwrap();
        assert_eq!(line["fields"]["message"], "deciding", "{line}");
        let span = &line["span"];
        assert_eq!(span["name"], "admission", "{line}");
        assert_eq!(span["object"], "shop/web-0", "{line}");
        assert_eq!(span["kind"], "Pod", "{line}");
        assert_eq!(span["uid"], "u3", "{line}");
    }

    #[test]
    fn a_denial_carries_the_message_and_403() {
        let out = response("u2", &Verdict::Deny("spec.x: Required value".into()));
        assert_eq!(out["response"]["allowed"], false);
        assert_eq!(out["response"]["status"]["code"], 403);
        assert_eq!(
            out["response"]["status"]["message"],
            "spec.x: Required value"
        );
    }

    #[test]
    fn every_path_has_a_kind_and_verdicts_their_outcome() {
        for path in PATHS {
            assert!(ADMISSION_KINDS.contains(&kind_of(path)), "{path}");
        }
        assert_eq!(kind_of(MUTATE_POD), "pods");
        assert_eq!(kind_of(VALIDATE_NODEIMAGE), "nodeimages");
        assert_eq!(kind_of("/elsewhere"), "unknown");
        assert_eq!(Verdict::Allow.outcome(), "allowed");
        assert_eq!(
            Verdict::Patch(json_patch::Patch(vec![]), vec![]).outcome(),
            "allowed"
        );
        assert_eq!(Verdict::Deny("no".into()).outcome(), "denied");
        let patch = json_patch::Patch(vec![PatchOperation::Add(AddOperation {
            path: jsonptr::PointerBuf::parse("/a").unwrap(),
            value: json!(1),
        })]);
        assert_eq!(Verdict::Patch(patch, vec![]).outcome(), "patched");
    }

    struct Refuse;

    impl Admit for Refuse {
        fn admit<'a>(
            &'a self,
            _path: &'static str,
            _request: &'a AdmissionRequest<DynamicObject>,
        ) -> AdmitFuture<'a> {
            Box::pin(async { Verdict::Deny("no".into()) })
        }
    }

    #[tokio::test]
    async fn metered_counts_each_decision_by_kind_and_verdict() {
        let metrics = ManagerMetrics::new();
        let registry = crate::runtime::Metrics::with(|r| metrics.register(r));
        let metered = Metered {
            inner: Arc::new(Refuse),
            metrics: metrics.clone(),
        };
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u4",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "userInfo": {},
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
            }
        });
        let body = serde_json::to_vec(&review).unwrap();
        let response = super::review(&metered, MUTATE_POD, &body).await;
        assert_eq!(response.status(), StatusCode::OK);
        let text = registry.encode().unwrap();
        assert!(
            text.contains(
                "kruise_rs_manager_admissions_total{kind=\"pods\",verdict=\"denied\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("kruise_rs_manager_admission_seconds_count{kind=\"pods\"} 1\n"),
            "{text}"
        );
    }

    #[test]
    fn an_empty_patch_is_a_plain_allow() {
        let out = response("u3", &Verdict::Patch(json_patch::Patch(vec![]), vec![]));
        assert!(out["response"].get("patch").is_none());
        assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    }
}
