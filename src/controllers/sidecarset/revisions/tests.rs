use super::*;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kruise_rs_api::sidecarset::SidecarSetStatus;
use kruise_rs_sidecar::revision::history::fixtures::{
    NS, minimal, name_of, rich, sidecarset, text_of,
};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

const PATH: &str = "/apis/apps/v1/namespaces/kruise-system/controllerrevisions";

/// One expected request and the reply to it.
struct Step {
    method: &'static str,
    path: String,
    status: u16,
    reply: Value,
}

fn step(method: &'static str, name: &str, status: u16, reply: Value) -> Step {
    let path = if name.is_empty() {
        PATH.to_owned()
    } else {
        format!("{PATH}/{name}")
    };
    Step {
        method,
        path,
        status,
        reply,
    }
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

/// Requests seen: method, path, body.
type Seen = Arc<Mutex<Vec<(String, String, String)>>>;

fn scripted(steps: Vec<Step>) -> (Api<ControllerRevision>, Seen) {
    let steps = Arc::new(Mutex::new(VecDeque::from(steps)));
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let steps = steps.clone();
        let log = log.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let body = req.into_body().collect_bytes().await.unwrap_or_default();
            let body = String::from_utf8_lossy(&body).into_owned();
            log.lock()
                .unwrap()
                .push((method.clone(), path.clone(), body));
            let next = steps.lock().unwrap().pop_front();
            let (code, reply) = match next {
                Some(s) if s.method == method && s.path == path => (s.status, s.reply),
                _ => (500, status(500, &format!("unexpected {method} {path}"))),
            };
            let response = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(kube::client::Body::from(
                    serde_json::to_vec(&reply).unwrap(),
                ))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let client = kube::Client::new(service, "default");
    (Api::namespaced(client, NS), seen)
}

fn json_of<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

fn stored(mut r: ControllerRevision, resource_version: &str) -> ControllerRevision {
    r.metadata.resource_version = Some(resource_version.into());
    r
}

#[tokio::test]
async fn creating_sends_upstreams_exact_bytes() {
    let set = sidecarset("rich", rich());
    let expected = new_revision(&set, NS, 1, 0);
    let (api, seen) = scripted(vec![step("POST", "", 201, json_of(&expected))]);
    let registered = register(&api, &set, &[], NS).await.expect("created");
    assert_eq!(registered.collision_count, 0);
    assert_eq!(name_of(&registered.latest), name_of(&expected));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    let body = &seen[0].2;
    assert!(
        body.contains(&format!("\"data\":{}", text_of(&set.spec))),
        "{body}"
    );
    let sent: ControllerRevision = serde_json::from_str(body).expect("a revision");
    assert_eq!(sent, expected);
}

#[tokio::test]
async fn a_name_taken_by_other_data_bumps_the_collision_count() {
    let set = sidecarset("s", minimal());
    let first = new_revision(&set, NS, 1, 0);
    let mut squatter = first.clone();
    squatter.data = Some(RawExtension(
        json!({"spec": {"$patch": "replace", "containers": [{"name": "x"}]}}),
    ));
    let second = new_revision(&set, NS, 1, 1);
    let (api, seen) = scripted(vec![
        step("POST", "", 409, status(409, "AlreadyExists")),
        step("GET", name_of(&first), 200, json_of(&squatter)),
        step("POST", "", 201, json_of(&second)),
    ]);
    let registered = register(&api, &set, &[], NS).await.expect("created");
    assert_eq!(registered.collision_count, 1);
    assert_eq!(name_of(&registered.latest), "s-65fd5cd67b");
    assert_eq!(seen.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_name_taken_by_an_equal_revision_is_used() {
    let mut set = sidecarset("s", minimal());
    set.status = Some(SidecarSetStatus {
        collision_count: Some(2),
        ..SidecarSetStatus::default()
    });
    let existing = stored(new_revision(&set, NS, 1, 2), "5");
    let (api, seen) = scripted(vec![
        step("POST", "", 409, status(409, "AlreadyExists")),
        step("GET", name_of(&existing), 200, json_of(&existing)),
    ]);
    let registered = register(&api, &set, &[], NS).await.expect("used");
    assert_eq!(registered.collision_count, 2);
    assert_eq!(registered.latest, existing);
    assert_eq!(seen.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn endless_collisions_give_up() {
    let set = sidecarset("s", minimal());
    let mut squatter = new_revision(&set, NS, 1, 0);
    squatter.data = Some(RawExtension(json!({"other": true})));
    let mut steps = Vec::new();
    for cc in 0..CREATE_ATTEMPTS {
        let name = name_of(&new_revision(&set, NS, 1, cc as i32)).to_owned();
        steps.push(step("POST", "", 409, status(409, "AlreadyExists")));
        steps.push(step("GET", &name, 200, json_of(&squatter)));
    }
    let (api, _) = scripted(steps);
    let err = register(&api, &set, &[], NS).await.expect_err("gives up");
    assert!(
        matches!(
            err,
            RevisionsError::Collisions {
                attempts: 10,
                collision_count: 10,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn an_unchanged_spec_writes_nothing() {
    let set = sidecarset("s", minimal());
    let current = stored(new_revision(&set, NS, 1, 0), "3");
    let (api, seen) = scripted(vec![]);
    let registered = register(&api, &set, std::slice::from_ref(&current), NS)
        .await
        .expect("kept");
    assert_eq!(registered.latest, current);
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_rollback_is_a_guarded_patch_retried_once_on_conflict() {
    let mut set = sidecarset("s", minimal());
    let old = stored(new_revision(&set, NS, 1, 0), "10");
    set.spec.custom_version = Some("v1".into());
    let newer = stored(
        new_revision(
            &sidecarset("s", json!({"containers": [{"name": "c", "image": "j"}]})),
            NS,
            2,
            0,
        ),
        "11",
    );
    let mut done = old.clone();
    done.revision = 3;
    let (api, seen) = scripted(vec![
        step("PATCH", name_of(&old), 409, status(409, "Conflict")),
        step(
            "GET",
            name_of(&old),
            200,
            json_of(&stored(old.clone(), "12")),
        ),
        step("PATCH", name_of(&old), 200, json_of(&done)),
    ]);
    let registered = register(&api, &set, &[old.clone(), newer], NS)
        .await
        .expect("rolled back");
    assert_eq!(registered.latest.revision, 3);
    let seen = seen.lock().unwrap();
    let patch = |i: usize| serde_json::from_str::<Value>(&seen[i].2).unwrap();
    let label = json!({SIDECARSET_CUSTOM_VERSION_LABEL: "v1"});
    assert_eq!(
        patch(0),
        json!({"metadata": {"resourceVersion": "10", "labels": label}, "revision": 3})
    );
    assert_eq!(
        patch(2),
        json!({"metadata": {"resourceVersion": "12", "labels": label}, "revision": 3})
    );
}

#[tokio::test]
async fn a_second_conflict_is_an_error_naming_both() {
    let mut set = sidecarset("s", minimal());
    set.spec.custom_version = Some("v1".into());
    let current = stored(new_revision(&set, NS, 1, 0), "1");
    let mut unlabelled = current.clone();
    unlabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(SIDECARSET_CUSTOM_VERSION_LABEL);
    let (api, _) = scripted(vec![
        step("PATCH", name_of(&current), 409, status(409, "Conflict")),
        step("GET", name_of(&current), 200, json_of(&unlabelled)),
        step("PATCH", name_of(&current), 409, status(409, "Conflict")),
    ]);
    let err = register(&api, &set, &[unlabelled], NS)
        .await
        .expect_err("conflict");
    let text = err.to_string();
    assert!(matches!(err, RevisionsError::Update { .. }), "{text}");
    assert!(
        text.contains(name_of(&current)) && text.contains("SidecarSet s"),
        "{text}"
    );
}

#[tokio::test]
async fn a_sidecarset_not_from_the_cluster_is_refused() {
    let mut set = sidecarset("s", minimal());
    set.metadata.uid = None;
    let (api, seen) = scripted(vec![]);
    let err = register(&api, &set, &[], NS).await.expect_err("no uid");
    assert!(matches!(err, RevisionsError::NotStored { .. }), "{err}");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn deleting_ignores_missing_revisions_and_tries_every_name() {
    let gone = status(404, "NotFound");
    let (api, seen) = scripted(vec![
        step("DELETE", "s-1", 404, gone),
        step("DELETE", "s-2", 500, status(500, "InternalError")),
        step(
            "DELETE",
            "s-3",
            200,
            json_of(&ControllerRevision::default()),
        ),
    ]);
    let names = ["s-1", "s-2", "s-3"].map(str::to_owned);
    let err = delete_revisions(&api, &names)
        .await
        .expect_err("s-2 failed");
    assert!(
        matches!(&err, RevisionsError::Delete { revision, .. } if revision == "s-2"),
        "{err}"
    );
    assert_eq!(seen.lock().unwrap().len(), 3);

    let (api, _) = scripted(vec![step("DELETE", "s-1", 404, status(404, "NotFound"))]);
    delete_revisions(&api, &names[..1])
        .await
        .expect("404 is fine");
}
