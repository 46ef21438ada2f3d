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
    let answer = review(&LogsAndAllows, MUTATE_POD, &body).await;
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
    let body = pod_review("u4", None, "p");
    let response = super::review(&metered, MUTATE_POD, &body).await;
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
