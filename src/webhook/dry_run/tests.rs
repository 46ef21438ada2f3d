use super::*;

fn set(spec: Value) -> Value {
    json!({"apiVersion": "apps.kruise.io/v1beta1", "kind": "SidecarSet", "metadata": {"name": "s"}, "spec": spec})
}

#[test]
fn the_pod_holds_the_sidecars_as_written_then_a_placeholder() {
    let raw = set(json!({
        "selector": {"matchLabels": {"app": "x"}},
        "containers": [{
            "name": "proxy", "image": "envoy", "podInjectPolicy": "AfterAppContainer",
            "shareVolumePolicy": {"type": "enabled"}, "transferEnv": [{"sourceContainerName": "a"}],
            "upgradeStrategy": {"upgradeType": "ColdUpgrade"},
            "resources": {"limits": {"cpu": "lots"}}, "aFieldFromTheFuture": {"x": 1}
        }],
        "initContainers": [{"name": "native", "image": "i", "restartPolicy": "Always"}],
        "volumes": [{"name": "v", "emptyDir": {}}],
        "imagePullSecrets": [{"name": "regcred"}],
        "updateStrategy": {"type": "NotUpdate"}
    }));
    let pod = synthetic_pod(&raw, "kruise-system");
    assert_eq!(pod["metadata"]["namespace"], "kruise-system");
    assert_eq!(pod["metadata"]["generateName"], GENERATE_NAME);
    let spec = &pod["spec"];
    assert_eq!(
        spec["containers"][0],
        json!({"name": "proxy", "image": "envoy", "resources": {"limits": {"cpu": "lots"}}, "aFieldFromTheFuture": {"x": 1}})
    );
    assert_eq!(spec["containers"][1]["name"], PLACEHOLDER);
    assert_eq!(spec["containers"].as_array().map(Vec::len), Some(2));
    assert_eq!(spec["initContainers"][0]["restartPolicy"], "Always");
    assert_eq!(spec["volumes"], json!([{"name": "v", "emptyDir": {}}]));
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "regcred"}]));
    assert_eq!(spec["serviceAccountName"], "default");
    assert!(spec.get("updateStrategy").is_none() && spec.get("selector").is_none());
}

#[test]
fn init_containers_only_still_make_a_pod_with_one_container() {
    let pod = synthetic_pod(
        &set(json!({"initContainers": [{"name": "init", "image": "i"}]})),
        "ns",
    );
    assert_eq!(
        pod["spec"]["containers"],
        json!([{"name": PLACEHOLDER, "image": "placeholder"}])
    );
    assert!(pod["spec"].get("volumes").is_none());
    assert!(pod["spec"].get("imagePullSecrets").is_none());
}

#[test]
fn the_placeholder_never_takes_a_sidecars_name() {
    let pod = synthetic_pod(
        &set(json!({
            "containers": [{"name": PLACEHOLDER, "image": "i"}],
            "initContainers": [{"name": format!("{PLACEHOLDER}x"), "image": "i"}]
        })),
        "ns",
    );
    assert_eq!(
        pod["spec"]["containers"][1]["name"],
        format!("{PLACEHOLDER}xx")
    );
}

#[test]
fn odd_shapes_do_not_panic() {
    for spec in [
        json!(null),
        json!({"containers": "x"}),
        json!({"containers": [1, null]}),
        json!({"volumes": null}),
    ] {
        let pod = synthetic_pod(&set(spec), "ns");
        assert!(pod["spec"]["containers"].is_array());
    }
}

#[test]
fn field_errors_name_the_sidecarsets_paths() {
    assert_eq!(
        map_field("spec.containers[0].resources.limits[cpu]", 2),
        "spec.containers[0].resources.limits[cpu]"
    );
    assert_eq!(
        map_field("spec.initContainers[1].securityContext.runAsUser", 0),
        "spec.initContainers[1].securityContext.runAsUser"
    );
    assert_eq!(map_field("spec.volumes[0].name", 1), "spec.volumes[0].name");
    assert_eq!(
        map_field("spec.imagePullSecrets[0].name", 1),
        "spec.imagePullSecrets[0].name"
    );
    assert_eq!(
        map_field("spec.containers[2].name", 2),
        "(the dry-run pod's app container) spec.containers[2].name"
    );
    assert_eq!(
        map_field("metadata.name", 2),
        "(the dry-run pod) metadata.name"
    );
    assert_eq!(
        map_field("spec.containersX", 2),
        "(the dry-run pod) spec.containersX"
    );
}

#[test]
fn an_invalid_status_becomes_one_line_per_cause() {
    let status: kube::core::Status = serde_json::from_value(json!({
        "status": "Failure", "code": 422, "reason": "Invalid",
        "message": "Pod \"x\" is invalid: ...",
        "details": {"kind": "Pod", "causes": [
            {"reason": "FieldValueInvalid", "field": "spec.containers[0].securityContext.runAsUser",
             "message": "Invalid value: -1: must be between 0 and 2147483647, inclusive"},
            {"reason": "FieldValueForbidden", "message": "no field"}
        ]}
    }))
    .unwrap();
    assert_eq!(
        map_causes(&status, 1),
        [
            "spec.containers[0].securityContext.runAsUser: Invalid value: -1: must be between 0 and 2147483647, inclusive",
            "no field"
        ]
    );
    let bare: kube::core::Status =
        serde_json::from_value(json!({"code": 422, "message": "bad"})).unwrap();
    assert_eq!(map_causes(&bare, 0), ["bad"]);
}

#[test]
fn verdicts_are_remembered_per_name_and_pod() {
    let verdicts = Verdicts::default();
    let pod = json!({"spec": {"containers": [{"name": "a"}]}});
    let other = json!({"spec": {"containers": [{"name": "b"}]}});
    assert_eq!(verdicts.get("s", &pod), None);
    verdicts.put("s", &pod, &Outcome::Invalid(vec!["e".into()]));
    assert_eq!(
        verdicts.get("s", &pod),
        Some(Outcome::Invalid(vec!["e".into()]))
    );
    assert_eq!(
        verdicts.get("s", &other),
        None,
        "another spec is judged again"
    );
    assert_eq!(verdicts.get("t", &pod), None);
    verdicts.put("s", &other, &Outcome::Valid);
    assert_eq!(verdicts.get("s", &pod), None, "one verdict per name");
    verdicts.put("u", &pod, &Outcome::Unknown("timeout".into()));
    assert_eq!(
        verdicts.get("u", &pod),
        None,
        "no verdict is not remembered"
    );
}

#[test]
fn the_memory_is_bounded() {
    let verdicts = Verdicts::default();
    let pod = json!({});
    for i in 0..=CACHE_LIMIT {
        verdicts.put(&i.to_string(), &pod, &Outcome::Valid);
    }
    let len = verdicts.by_name.lock().unwrap().len();
    assert!(len <= CACHE_LIMIT, "{len}");
}

#[test]
fn quantities_that_do_not_parse_are_named() {
    let pod = synthetic_pod(
        &set(json!({
            "containers": [
                {"name": "a", "image": "i", "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}},
                {"name": "b", "image": "i", "resources": {"limits": {"cpu": "lots"}, "requests": {"memory": 5}}},
            ],
            "initContainers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": true}}}],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1.5.5Gi"}}, {"name": "w", "emptyDir": {}}]
        })),
        "ns",
    );
    let errors = unparseable_quantities(&pod);
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[0].starts_with("spec.containers[1].resources.limits[cpu]: Invalid value: \"lots\"")
    );
    assert!(
        errors[1]
            .starts_with("spec.initContainers[0].resources.requests[cpu]: Invalid value: \"true\"")
    );
    assert!(
        errors[2].starts_with("spec.volumes[0].emptyDir.sizeLimit: Invalid value: \"1.5.5Gi\"")
    );
}

fn api_error(code: u16, reason: &str) -> kube::Error {
    status_error(json!({
        "status": "Failure", "code": code, "reason": reason, "message": format!("a {reason}")
    }))
}

fn status_error(body: Value) -> kube::Error {
    kube::Error::Api(
        serde_json::from_value::<kube::core::Status>(body)
            .unwrap()
            .boxed(),
    )
}

fn valid_pod() -> Value {
    synthetic_pod(
        &set(json!({"containers": [{"name": "proxy", "image": "envoy"}]})),
        "kruise-system",
    )
}

/// The body kube-apiserver 1.36 answers when a ValidatingAdmissionPolicy binding with
/// `validationActions: [Deny]` refuses a pod and the validation gives no reason (the default
/// is `Invalid`, so 422) or gives `reason` (its code).
fn policy_denial(code: u16, reason: &str) -> Value {
    let message = "ValidatingAdmissionPolicy 'no-test-pods' with binding 'no-test-pods-binding' \
                   denied request: pods in this namespace are refused";
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("pods \"kruise-rs-sidecarset-dry-run-\" is forbidden: {message}"),
        "reason": reason, "code": code,
        "details": {"name": "kruise-rs-sidecarset-dry-run-", "kind": "pods",
                    "causes": [{"message": message}]}
    })
}

#[test]
fn a_policy_refusing_the_pod_gives_no_verdict_whatever_its_reason() {
    let pod = valid_pod();
    for (code, reason) in [(422, "Invalid"), (400, "BadRequest"), (403, "Forbidden")] {
        match classify(&pod, 1, Ok(Err(status_error(policy_denial(code, reason))))) {
            Outcome::Unknown(why) => assert!(
                why.contains(
                    "refused by ValidatingAdmissionPolicy 'no-test-pods' with binding \
                     'no-test-pods-binding'"
                ) && why.contains("not judged"),
                "{code}: {why}"
            ),
            other => panic!("{code} {reason}: {other:?}"),
        }
    }
}

#[test]
fn a_webhook_refusing_the_pod_gives_no_verdict_even_naming_a_sidecar_field() {
    let pod = valid_pod();
    // What the apiserver makes of a webhook's `status` (its code and causes kept, the message
    // prefixed): a policy engine pointing at the sidecar's resources.
    let webhook = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "admission webhook \"validate.policy.example.com\" denied the request: \
                    resource limits are required",
        "reason": "Invalid", "code": 422,
        "details": {"causes": [{"reason": "FieldValueRequired",
                                "field": "spec.containers[0].resources.limits",
                                "message": "resource limits are required"}]}
    });
    match classify(&pod, 1, Ok(Err(status_error(webhook)))) {
        Outcome::Unknown(why) => assert!(
            why.contains("refused by admission webhook \"validate.policy.example.com\""),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    let bare = json!({
        "status": "Failure", "code": 400, "reason": "BadRequest",
        "message": "admission webhook \"deny.example.com\" denied the request without explanation"
    });
    match classify(&pod, 1, Ok(Err(status_error(bare)))) {
        Outcome::Unknown(why) => assert!(
            why.contains("admission webhook \"deny.example.com\""),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn pod_validation_of_the_sidecars_is_a_verdict_and_of_anything_else_is_not() {
    let pod = valid_pod();
    // kube-apiserver's answer to a sidecar port out of range (`ValidatePodCreate`).
    let field_error = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Pod \"kruise-rs-sidecarset-dry-run-\" is invalid: \
                    spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be \
                    between 1 and 65535, inclusive",
        "reason": "Invalid", "code": 422,
        "details": {"name": "kruise-rs-sidecarset-dry-run-", "kind": "Pod", "causes": [{
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 70000: must be between 1 and 65535, inclusive",
            "field": "spec.containers[0].ports[0].containerPort"}]}
    });
    assert_eq!(
        classify(&pod, 1, Ok(Err(status_error(field_error)))),
        Outcome::Invalid(vec![
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 \
             and 65535, inclusive"
                .into()
        ])
    );
    // Invalid, but about the pod's own parts (the placeholder app container, the metadata):
    // something else refused it.
    for field in ["spec.containers[1].image", "metadata.labels", ""] {
        let elsewhere = json!({
            "status": "Failure", "code": 422, "reason": "Invalid",
            "message": "Pod \"x\" is invalid: ...",
            "details": {"causes": [{"reason": "FieldValueInvalid", "field": field, "message": "no"}]}
        });
        match classify(&pod, 1, Ok(Err(status_error(elsewhere)))) {
            Outcome::Unknown(why) => assert!(why.contains("not judged"), "{field}: {why}"),
            other => panic!("{field:?}: {other:?}"),
        }
    }
    // A 400 that is not the pod failing to decode.
    let other_400 = json!({"status": "Failure", "code": 400, "reason": "BadRequest",
                           "message": "the quota engine says no"});
    assert!(matches!(
        classify(&pod, 1, Ok(Err(status_error(other_400)))),
        Outcome::Unknown(_)
    ));
}

#[test]
fn the_refuser_is_read_from_the_apiservers_prefixes() {
    assert_eq!(
        admission_refuser("admission webhook \"a.b\" denied the request: no").as_deref(),
        Some("admission webhook \"a.b\"")
    );
    assert_eq!(
        admission_refuser(
            "pods \"p\" is forbidden: ValidatingAdmissionPolicy 'p' denied request: x"
        )
        .as_deref(),
        Some("ValidatingAdmissionPolicy 'p'")
    );
    assert_eq!(
        admission_refuser("ValidatingAdmissionPolicy 'p' with binding 'b' denied request: x")
            .as_deref(),
        Some("ValidatingAdmissionPolicy 'p' with binding 'b'")
    );
    for other in [
        "",
        "admission webhook \"a.b",
        "admission webhook \"a.b\" does not deny",
        "ValidatingAdmissionPolicy 'p",
        "ValidatingAdmissionPolicy 'p' with binding 'b",
        "Pod \"x\" is invalid: spec.containers[0].image: Required value",
    ] {
        assert_eq!(admission_refuser(other), None, "{other:?}");
    }
}

#[tokio::test]
async fn only_invalid_and_undecodable_pods_refuse_the_rest_is_no_verdict() {
    let pod = synthetic_pod(
        &set(
            json!({"containers": [{"name": "a", "image": "i", "resources": {"limits": {"cpu": "x"}}}]}),
        ),
        "kruise-system",
    );
    assert_eq!(classify(&pod, 1, Ok(Ok(()))), Outcome::Valid);
    match classify(&pod, 1, Ok(Err(api_error(422, "Invalid")))) {
        Outcome::Unknown(why) => assert!(why.contains("not judged"), "{why}"),
        other => panic!("a 422 naming no sidecar field: {other:?}"),
    }
    match classify(
        &pod,
        1,
        Ok(Err(status_error(json!({
            "status": "Failure", "code": 400, "reason": "BadRequest",
            "message": "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        })))),
    ) {
        Outcome::Invalid(lines) => {
            assert!(
                lines[0].starts_with("spec.containers[0].resources.limits[cpu]"),
                "{lines:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    for (code, reason) in [
        (403, "Forbidden"),
        (404, "NotFound"),
        (500, "InternalError"),
        (429, "TooManyRequests"),
    ] {
        match classify(&pod, 1, Ok(Err(api_error(code, reason)))) {
            Outcome::Unknown(why) => assert!(why.contains("kruise-system"), "{why}"),
            other => panic!("{code}: {other:?}"),
        }
    }
    let elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
        .await
        .unwrap_err();
    match classify(&pod, 1, Err(elapsed)) {
        Outcome::Unknown(why) => assert!(why.contains("no answer within 5s"), "{why}"),
        other => panic!("{other:?}"),
    }
}
