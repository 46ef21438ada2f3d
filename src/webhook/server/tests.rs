use super::*;
use json_patch::{AddOperation, PatchOperation};
use kruise_rs_controller::metrics::ADMISSION_KINDS;

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

/// An AdmissionReview of a pod's creation, encoded.
fn pod_review(uid: &str, namespace: Option<&str>, name: &str) -> Vec<u8> {
    let mut request = json!({
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "name": name,
        "userInfo": {},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}},
    });
    if let Some(namespace) = namespace {
        request["namespace"] = json!(namespace);
    }
    let review = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    });
    serde_json::to_vec(&review).unwrap()
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
    let body = pod_review("u3", Some("shop"), "web-0");
    let answer = review(&LogsAndAllows, MUTATE_POD, &body, &no_timeout()).await;
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
    let registry = kruise_rs_kube::Metrics::with(|r| metrics.register(r));
    let metered = Metered {
        inner: Arc::new(Refuse),
        metrics: metrics.clone(),
    };
    let body = pod_review("u4", None, "p");
    let response = super::review(&metered, MUTATE_POD, &body, &no_timeout()).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = registry.encode().unwrap();
    assert!(
        text.contains("kruise_rs_manager_admissions_total{kind=\"pods\",verdict=\"denied\"} 1\n"),
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

/// An ImagePullJob UPDATE review as the apiserver writes it (Go's field order, compact), its
/// object and old object each padded with an annotation of `padding` bytes.
fn job_update_review(uid: &str, padding: usize) -> Vec<u8> {
    let object = format!(
        r#"{{"apiVersion":"apps.kruise.io/v1beta1","kind":"ImagePullJob","metadata":{{"name":"j","namespace":"ns","annotations":{{"big":"{}"}}}},"spec":{{"image":"busybox:1.36"}}}}"#,
        "x".repeat(padding)
    );
    format!(
        r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"{uid}","kind":{{"group":"apps.kruise.io","version":"v1beta1","kind":"ImagePullJob"}},"resource":{{"group":"apps.kruise.io","version":"v1beta1","resource":"imagepulljobs"}},"name":"j","namespace":"ns","operation":"UPDATE","userInfo":{{"username":"alice"}},"object":{object},"oldObject":{object},"dryRun":false}}}}"#
    )
    .into_bytes()
}

/// POSTs `body` to `path` of a router over [`Refuse`], with a Content-Length when `declared`.
async fn post_to_router(path: &str, body: Vec<u8>, declared: bool) -> (StatusCode, Value, String) {
    post(router(Arc::new(Refuse)), path, body, declared).await
}

/// POSTs `body` to `path` (and query) of `router`, with a Content-Length when `declared`.
async fn post(
    router: axum::Router,
    path: &str,
    body: Vec<u8>,
    declared: bool,
) -> (StatusCode, Value, String) {
    use tower::ServiceExt as _;
    let mut request =
        axum::http::Request::post(path).header(header::CONTENT_TYPE, "application/json");
    if declared {
        request = request.header(header::CONTENT_LENGTH, body.len());
    }
    let request = request.body(Body::from(body)).unwrap();
    let answer = router.oneshot(request).await.unwrap();
    let status = answer.status();
    let bytes = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        text,
    )
}

/// Issue 42: an UPDATE carries the object twice; over axum's default body limit (2 MiB) the
/// server answered 413, which `failurePolicy: Ignore` turns into an admission. Such a review is
/// now decided: the denial denies.
#[tokio::test]
async fn an_update_review_over_two_mib_is_decided() {
    let body = job_update_review("u-big", 1_200 * 1024);
    assert!(body.len() > 2 * 1024 * 1024, "{}", body.len());
    let (status, answer, text) = post_to_router(VALIDATE_IMAGEPULLJOB, body, true).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(answer["response"]["uid"], "u-big");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["message"], "no");
}

/// Both objects at the apiserver's default request limit (3 MiB each) still fit.
#[tokio::test]
async fn an_update_review_of_two_three_mib_objects_is_decided() {
    let body = job_update_review("u-3mib", 3 * 1024 * 1024 - 512);
    assert!(body.len() <= MAX_REVIEW_BYTES, "{}", body.len());
    let (status, answer, text) = post_to_router(VALIDATE_IMAGEPULLJOB, body, false).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(answer["response"]["status"]["message"], "no");
}

/// Over the limit the body is not decided, but refused: a denial for its uid (whatever the
/// failurePolicy), whether the apiserver declared its length or not.
#[tokio::test]
async fn a_review_over_the_limit_is_denied_for_its_uid() {
    for declared in [true, false] {
        let body = job_update_review("u-huge", MAX_REVIEW_BYTES / 2);
        assert!(body.len() > MAX_REVIEW_BYTES);
        let (status, answer, text) = post_to_router(VALIDATE_IMAGEPULLJOB, body, declared).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(answer["response"]["uid"], "u-huge");
        assert_eq!(answer["response"]["allowed"], false);
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(
            message.contains(&format!("limit of {MAX_REVIEW_BYTES} bytes")),
            "{message}"
        );
    }
}

/// Without a uid to answer, the server still refuses (413): the apiserver applies the policy.
#[tokio::test]
async fn an_oversized_body_without_a_uid_is_413() {
    let body = vec![b' '; MAX_REVIEW_BYTES + 1];
    let (status, _, text) = post_to_router(VALIDATE_IMAGEPULLJOB, body, true).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
    assert!(text.contains("over the webhook's limit"), "{text}");
}

#[test]
fn the_uid_is_read_from_the_head_of_a_go_encoded_review() {
    let body = job_update_review("0f2b5a7c-1d2e-4f00-9a1b-123456789abc", 10);
    assert_eq!(
        uid_in_head(&body[..200]).as_deref(),
        Some("0f2b5a7c-1d2e-4f00-9a1b-123456789abc")
    );
    // Cut inside a character: the valid prefix is read.
    let mut cut = body[..120].to_vec();
    cut.extend_from_slice(&"é".as_bytes()[..1]);
    assert!(uid_in_head(&cut).is_some());
    // uid not first in the request, an odd uid, no request: nothing to answer.
    for head in [
        r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"dryRun":false,"uid":"u1"}}"#,
        r#"{"kind":"AdmissionReview","request":{"uid":"u1\"x"}}"#,
        r#"{"kind":"AdmissionReview","request":{"uid":""}}"#,
        r#"{"kind":"AdmissionReview"}"#,
    ] {
        assert_eq!(uid_in_head(head.as_bytes()), None, "{head}");
    }
}

/// The deadline of a request that gave no `timeout`.
fn no_timeout() -> AdmissionDeadline {
    AdmissionDeadline::from_query(None, tokio::time::Instant::now())
}

/// Never decides: every read it makes of the apiserver hangs.
struct NeverDecides;

impl Admit for NeverDecides {
    fn admit<'a>(
        &'a self,
        _path: &'static str,
        _request: &'a AdmissionRequest<DynamicObject>,
    ) -> AdmitFuture<'a> {
        Box::pin(std::future::pending())
    }
}

/// An admission still undecided when the apiserver's `timeout` (less the margin) has passed is
/// refused by the webhook itself, saying why: left to the apiserver's timeout, `failurePolicy:
/// Ignore` would admit the pod without its sidecars. The metrics count it as abandoned.
#[tokio::test(start_paused = true)]
async fn an_admission_out_of_time_is_refused_before_the_apiserver_gives_up() {
    let metrics = ManagerMetrics::new();
    let registry = kruise_rs_kube::Metrics::with(|r| metrics.register(r));
    let metered = Metered {
        inner: Arc::new(NeverDecides),
        metrics: metrics.clone(),
    };
    let started = tokio::time::Instant::now();
    let path = format!("{MUTATE_POD}?timeout=4s");
    let body = pod_review("u5", Some("shop"), "web-0");
    // Past the apiserver's timeout (virtual time), an answer is of no use: the apiserver has
    // applied the failurePolicy.
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(4),
        post(router(Arc::new(metered)), &path, body, true),
    );
    let (status, answer, text) = answered
        .await
        .expect("no answer within the apiserver's 4 s: left to the failurePolicy");
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(answer["response"]["uid"], "u5");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(
        answer["response"]["status"]["message"],
        "kruise-rs could not decide within 2.5 s of the 4 s the apiserver waits for this \
         webhook: its calls to the apiserver were too slow; retry"
    );
    assert_eq!(took, std::time::Duration::from_millis(2_500));
    let text = registry.encode().unwrap();
    assert!(
        text.contains(
            "kruise_rs_manager_admissions_total{kind=\"pods\",verdict=\"abandoned\"} 1\n"
        ),
        "{text}"
    );
}

/// A decision made in time is the answer, with or without a `timeout`.
#[tokio::test(start_paused = true)]
async fn an_admission_in_time_is_answered_as_decided() {
    for path in [
        format!("{VALIDATE_IMAGEPULLJOB}?timeout=1s"),
        VALIDATE_IMAGEPULLJOB.to_owned(),
    ] {
        let body = job_update_review("u6", 10);
        let (status, answer, text) = post(router(Arc::new(Refuse)), &path, body, true).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert_eq!(answer["response"]["status"]["message"], "no", "{path}");
    }
}

/// A `timeout` past the clock's range (anyone who reaches the port can send one) is answered,
/// not a panic that drops the connection.
#[tokio::test]
async fn a_huge_timeout_is_answered() {
    let path = format!("{VALIDATE_IMAGEPULLJOB}?timeout=4000000000000000h");
    let body = job_update_review("u7", 10);
    let (status, answer, text) = post(router(Arc::new(Refuse)), &path, body, true).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(answer["response"]["status"]["message"], "no");
}
