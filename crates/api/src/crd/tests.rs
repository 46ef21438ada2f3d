use super::*;

#[test]
fn every_kind_serves_both_versions_and_stores_v1beta1() {
    for crd in crds() {
        let versions: Vec<_> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(
            versions,
            [("v1alpha1", true, false), ("v1beta1", true, true)],
            "{}",
            crd.spec.names.kind
        );
        let conversion = crd.spec.conversion.as_ref().expect("conversion is stated");
        assert_eq!(conversion.strategy, "None", "{}", crd.spec.names.kind);
        assert!(conversion.webhook.is_none(), "{}", crd.spec.names.kind);
        for v in &crd.spec.versions {
            let sub = v.subresources.as_ref().expect("subresources");
            assert!(
                sub.status.is_some(),
                "{} {} has a status subresource",
                crd.spec.names.kind,
                v.name
            );
        }
    }
}

fn columns(kind: &str, version: &str) -> Vec<(String, String, String)> {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .expect(kind);
    let v = crd
        .spec
        .versions
        .into_iter()
        .find(|v| v.name == version)
        .expect(version);
    v.additional_printer_columns
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.name, c.type_, c.json_path))
        .collect()
}

fn cols(spec: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    spec.iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

/// Upstream's columns, plus one of ours: the ImagePullJob's PROGRESS (decision 0037), before AGE.
#[test]
fn printer_columns_are_upstreams() {
    let age = ("AGE", "date", ".metadata.creationTimestamp");
    let sidecarset = cols(&[
        ("MATCHED", "integer", ".status.matchedPods"),
        ("UPDATED", "integer", ".status.updatedPods"),
        ("READY", "integer", ".status.readyPods"),
        age,
    ]);
    let job = [
        ("TOTAL", "integer", ".status.desired"),
        ("ACTIVE", "integer", ".status.active"),
        ("SUCCEED", "integer", ".status.succeeded"),
        ("FAILED", "integer", ".status.failed"),
        ("PROGRESS", "string", ".status.progress"),
        age,
    ];
    let mut job_legacy = job.to_vec();
    job_legacy.push(("MESSAGE", "string", ".status.message"));
    let nodeimage = cols(&[
        ("DESIRED", "integer", ".status.desired"),
        ("PULLING", "integer", ".status.pulling"),
        ("SUCCEED", "integer", ".status.succeeded"),
        ("FAILED", "integer", ".status.failed"),
        age,
    ]);
    for version in ["v1alpha1", "v1beta1"] {
        assert_eq!(columns("SidecarSet", version), sidecarset);
        assert_eq!(columns("NodeImage", version), nodeimage);
    }
    assert_eq!(columns("ImagePullJob", "v1beta1"), cols(&job));
    assert_eq!(columns("ImagePullJob", "v1alpha1"), cols(&job_legacy));
    let list = cols(&[
        ("TOTAL", "integer", ".status.desired"),
        ("SUCCEEDED", "integer", ".status.succeeded"),
        ("COMPLETED", "integer", ".status.completed"),
        age,
    ]);
    for version in ["v1alpha1", "v1beta1"] {
        assert_eq!(columns("ImageListPullJob", version), list);
    }
}

#[test]
fn scopes_and_names_are_upstreams() {
    let got: Vec<_> = crds()
        .into_iter()
        .map(|c| {
            (
                c.metadata.name.unwrap_or_default(),
                c.spec.scope,
                file_name_of(&c.spec.names.plural),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "sidecarsets.apps.kruise.io".into(),
                "Cluster".into(),
                "apps.kruise.io_sidecarsets.yaml".into()
            ),
            (
                "imagepulljobs.apps.kruise.io".into(),
                "Namespaced".into(),
                "apps.kruise.io_imagepulljobs.yaml".into()
            ),
            (
                "nodeimages.apps.kruise.io".into(),
                "Cluster".into(),
                "apps.kruise.io_nodeimages.yaml".into()
            ),
            (
                "imagelistpulljobs.apps.kruise.io".into(),
                "Namespaced".into(),
                "apps.kruise.io_imagelistpulljobs.yaml".into()
            ),
        ] as [(String, String, String); 4]
    );
}

fn file_name_of(plural: &str) -> String {
    format!("apps.kruise.io_{plural}.yaml")
}

/// `crds/` is committed; it must be exactly what the types generate. Regenerate with
/// `cargo run -- crds --out-dir crds` (or `make crds`).
#[test]
fn committed_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut stale = Vec::new();
    for crd in crds() {
        let path = dir.join(file_name(&crd));
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != to_yaml(&crd) {
            stale.push(path.display().to_string());
        }
    }
    let mut extra: Vec<_> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    extra.retain(|f| !crds().iter().any(|c| file_name(c) == *f));
    assert!(
        stale.is_empty() && extra.is_empty(),
        "crds/ has drifted from the Rust types (stale: {stale:?}, unknown files: {extra:?}); \
             run `cargo run -- crds --out-dir crds` and commit the result"
    );
}

#[test]
fn every_crd_fits_the_client_side_apply_annotation() {
    // `kubectl apply` (client side) stores the whole object in a 256 KiB annotation.
    for crd in crds() {
        let json = serde_json::to_vec(&crd).expect("serializes");
        assert!(
            json.len() < 256 * 1024,
            "{} is {} bytes",
            crd.spec.names.kind,
            json.len()
        );
    }
}

/// Each served version's name and schema (as JSON) of the CRD of `kind`.
fn version_schemas(kind: &str) -> Vec<(String, serde_json::Value)> {
    let crd = crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .expect(kind);
    crd.spec
        .versions
        .iter()
        .map(|v| {
            let schema = serde_json::to_value(&v.schema).expect("serializes");
            (v.name.clone(), schema)
        })
        .collect()
}

/// Issue 42: the apiserver bounds pull Secrets before the webhook sees the object, in both
/// versions of each kind that names them.
#[test]
fn pull_secrets_are_bounded_in_the_schemas() {
    let bounded = [
        ("ImagePullJob", "pullSecrets"),
        ("ImageListPullJob", "pullSecrets"),
        ("SidecarSet", "imagePullSecrets"),
    ];
    for (kind, field) in bounded {
        for (version, schema) in version_schemas(kind) {
            let max = schema.pointer(&format!(
                "/openAPIV3Schema/properties/spec/properties/{field}/maxItems"
            ));
            assert_eq!(
                max.and_then(serde_json::Value::as_u64),
                Some(crate::limits::MAX_PULL_SECRETS as u64),
                "{kind} {version} spec.{field}"
            );
        }
    }
}

/// Upstream defaults `imagePullPolicy` on an ImagePullJob and not on an ImageListPullJob. A
/// schema default on the list would also apply when the apiserver reads a stored list: a list
/// upstream's kruise-manager runs would read with a field it never wrote, its template hash
/// would change and upstream would replace every child of every running list during a switch.
#[test]
fn only_the_imagepulljob_schema_defaults_the_image_pull_policy() {
    for (kind, default) in [
        ("ImagePullJob", Some(serde_json::json!("IfNotPresent"))),
        ("ImageListPullJob", None),
    ] {
        for (version, schema) in version_schemas(kind) {
            let policy = schema
                .pointer("/openAPIV3Schema/properties/spec/properties/imagePullPolicy")
                .unwrap_or_else(|| panic!("{kind} {version} has spec.imagePullPolicy"));
            assert_eq!(
                policy.get("default"),
                default.as_ref(),
                "{kind} {version} spec.imagePullPolicy"
            );
            assert_eq!(
                policy["enum"],
                serde_json::json!(["Always", "IfNotPresent"])
            );
        }
    }
}

/// Upstream's NodeImage CRD defaults nothing, and every default costs the apiserver a walk of
/// the schema on each decode of the most written kind (decision 0045).
#[test]
fn the_nodeimage_schema_defaults_nothing() {
    fn defaults(path: &str, value: &serde_json::Value, found: &mut Vec<String>) {
        let serde_json::Value::Object(map) = value else {
            return;
        };
        if map.contains_key("default") {
            found.push(path.to_owned());
        }
        for (key, value) in map {
            match (key.as_str(), value) {
                ("properties", serde_json::Value::Object(properties)) => {
                    for (name, value) in properties {
                        defaults(&format!("{path}.{name}"), value, found);
                    }
                }
                (_, serde_json::Value::Array(items)) => {
                    for item in items {
                        defaults(&format!("{path}.{key}[]"), item, found);
                    }
                }
                (_, value) => defaults(&format!("{path}.{key}"), value, found),
            }
        }
    }
    for (version, schema) in version_schemas("NodeImage") {
        let mut found = Vec::new();
        defaults("", &schema, &mut found);
        assert!(found.is_empty(), "NodeImage {version} defaults {found:?}");
    }
    // The other kinds keep theirs (an ImagePullJob's imagePullPolicy, for one).
    assert!(
        version_schemas("ImagePullJob")
            .iter()
            .all(|(_, s)| s.to_string().contains("\"default\""))
    );
}
