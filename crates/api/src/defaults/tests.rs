use super::*;
use crate::imagepulljob::ImagePullJobSpec;
use crate::nodeimage::{ImagePullPhase, ImageStatus, ImageTagStatus, NodeImageStatus};
use crate::sidecarset::SidecarSetSpec;
use serde_json::{Value, json};

fn sidecarset(spec: Value) -> SidecarSet {
    SidecarSet::new(
        "s",
        serde_json::from_value::<SidecarSetSpec>(spec).expect("test spec"),
    )
}

fn defaulted_json(spec: Value) -> Value {
    let mut s = sidecarset(spec);
    default_sidecarset(&mut s);
    serde_json::to_value(&s.spec).expect("serializes")
}

fn time(s: &str) -> Time {
    Time(s.parse().expect("timestamp"))
}

#[test]
fn sidecarset_top_level_defaults() {
    let spec = defaulted_json(
        json!({"injectionStrategy": {"revision": {"revisionName": "r"}},
            "patchPodMetadata": [{"annotations": {"a": "b"}}, {"annotations": {"c": "d"}, "patchPolicy": "Overwrite"}]}),
    );
    assert_eq!(
        spec["updateStrategy"],
        json!({"type": "RollingUpdate", "partition": 0, "maxUnavailable": 1})
    );
    assert_eq!(spec["revisionHistoryLimit"], json!(10));
    assert_eq!(
        spec["injectionStrategy"]["revision"]["policy"],
        json!("Always")
    );
    assert_eq!(spec["patchPodMetadata"][0]["patchPolicy"], json!("Retain"));
    assert_eq!(
        spec["patchPodMetadata"][1]["patchPolicy"],
        json!("Overwrite")
    );
    // Set values are kept.
    let spec = defaulted_json(
        json!({"updateStrategy": {"type": "NotUpdate", "partition": "10%", "maxUnavailable": 0},
            "revisionHistoryLimit": 3}),
    );
    assert_eq!(
        spec["updateStrategy"],
        json!({"type": "NotUpdate", "partition": "10%", "maxUnavailable": 0})
    );
    assert_eq!(spec["revisionHistoryLimit"], json!(3));
    // No revision, no revision policy.
    assert_eq!(defaulted_json(json!({}))["injectionStrategy"], json!({}));
}

#[test]
fn sidecar_container_defaults() {
    let spec = defaulted_json(json!({
        "containers": [{"name": "c", "image": "envoy:1.30",
            "ports": [{"containerPort": 80}, {"containerPort": 81, "protocol": "UDP"}],
            "env": [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "livenessProbe": {"httpGet": {"port": 80}},
            "readinessProbe": {"tcpSocket": {"port": 80}, "timeoutSeconds": 5, "periodSeconds": 0},
            "startupProbe": {"exec": {"command": ["true"]}},
            "lifecycle": {"preStop": {"httpGet": {"port": 80, "path": "/quit"}}},
            "transferEnv": [{"sourceContainerNameFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}, "envName": "X"}]
        }],
        "initContainers": [{"name": "i", "image": "busybox"}]
    }));
    let c = &spec["containers"][0];
    assert_eq!(c["podInjectPolicy"], json!("BeforeAppContainer"));
    assert_eq!(c["upgradeStrategy"], json!({"upgradeType": "ColdUpgrade"}));
    assert_eq!(c["shareVolumePolicy"], json!({"type": "disabled"}));
    assert_eq!(
        c.get("shareVolumeDevicePolicy"),
        None,
        "left unset, as upstream"
    );
    assert_eq!(c["imagePullPolicy"], json!("IfNotPresent"));
    assert_eq!(c["terminationMessagePath"], json!("/dev/termination-log"));
    assert_eq!(c["terminationMessagePolicy"], json!("File"));
    assert_eq!(
        c["ports"],
        json!([{"containerPort": 80, "protocol": "TCP"}, {"containerPort": 81, "protocol": "UDP"}])
    );
    assert_eq!(
        c["env"][0]["valueFrom"]["fieldRef"]["apiVersion"],
        json!("v1")
    );
    assert_eq!(
        c["livenessProbe"],
        json!({"httpGet": {"port": 80, "path": "/", "scheme": "HTTP"}, "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
    );
    assert_eq!(
        c["readinessProbe"],
        json!({"tcpSocket": {"port": 80}, "timeoutSeconds": 5, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3})
    );
    assert_eq!(
        c["startupProbe"],
        json!({"exec": {"command": ["true"]}}),
        "as upstream, startup probes are left to the apiserver"
    );
    assert_eq!(
        c["lifecycle"]["preStop"]["httpGet"],
        json!({"port": 80, "path": "/quit", "scheme": "HTTP"})
    );
    assert_eq!(
        c["transferEnv"][0]["sourceContainerNameFrom"]["fieldRef"]["apiVersion"],
        json!("v1")
    );
    let i = &spec["initContainers"][0];
    assert_eq!(i["podInjectPolicy"], json!("AfterAppContainer"));
    assert_eq!(i["imagePullPolicy"], json!("Always"));
}

#[test]
fn image_pull_policy_follows_the_tag() {
    let cases = [
        (Some("nginx"), "Always"),
        (Some("nginx:latest"), "Always"),
        (Some("registry:5000/nginx:latest"), "Always"),
        (Some("nginx:1.25"), "IfNotPresent"),
        (
            Some("nginx@sha256:0000000000000000000000000000000000000000000000000000000000000000"),
            "IfNotPresent",
        ),
        (
            Some(
                "nginx:latest@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            ),
            "Always",
        ),
        (Some("Not A Reference"), "IfNotPresent"),
        (Some(""), "IfNotPresent"),
        (None, "IfNotPresent"),
    ];
    for (image, want) in cases {
        assert_eq!(default_image_pull_policy(image), want, "{image:?}");
    }
    let spec = defaulted_json(
        json!({"containers": [{"name": "c", "image": "nginx", "imagePullPolicy": "Never"}]}),
    );
    assert_eq!(
        spec["containers"][0]["imagePullPolicy"],
        json!("Never"),
        "a set policy is kept"
    );
}

#[test]
fn volume_defaults() {
    let spec = defaulted_json(json!({"volumes": [
        {"name": "none"},
        {"name": "hp", "hostPath": {"path": "/x"}},
        {"name": "sec", "secret": {"secretName": "s"}},
        {"name": "cm", "configMap": {"name": "c", "defaultMode": 256}},
        {"name": "dapi", "downwardAPI": {"items": [{"path": "l", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"name": "proj", "projected": {"sources": [
            {"serviceAccountToken": {"path": "t"}},
            {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}}
        ]}}
    ]}));
    let v = &spec["volumes"];
    assert_eq!(v[0], json!({"name": "none", "emptyDir": {}}));
    assert_eq!(v[1]["hostPath"], json!({"path": "/x", "type": ""}));
    assert_eq!(v[2]["secret"]["defaultMode"], json!(420));
    assert_eq!(v[3]["configMap"]["defaultMode"], json!(256));
    assert_eq!(v[4]["downwardAPI"]["defaultMode"], json!(420));
    assert_eq!(
        v[4]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"],
        json!("v1")
    );
    assert_eq!(v[5]["projected"]["defaultMode"], json!(420));
    assert_eq!(
        v[5]["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
        json!(3600)
    );
    assert_eq!(
        v[5]["projected"]["sources"][1]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"],
        json!("v1")
    );
}

#[test]
fn sidecarset_defaulting_is_idempotent() {
    let mut s = sidecarset(json!({
        "selector": {"matchLabels": {"a": "b"}},
        "containers": [{"name": "c", "image": "x", "livenessProbe": {"httpGet": {"port": 1}}, "ports": [{"containerPort": 1}]}],
        "initContainers": [{"name": "i", "image": "y", "restartPolicy": "Always"}],
        "volumes": [{"name": "v"}, {"name": "p", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}],
        "patchPodMetadata": [{"annotations": {"a": "b"}}],
        "injectionStrategy": {"revision": {"customVersion": "v1"}}
    }));
    default_sidecarset(&mut s);
    let once = s.clone();
    default_sidecarset(&mut s);
    assert_eq!(s, once);
}

#[test]
fn imagepulljob_defaults_and_idempotency() {
    let mut job = ImagePullJob::new(
        "j",
        ImagePullJobSpec {
            image: "nginx".into(),
            ..Default::default()
        },
    );
    default_imagepulljob(&mut job);
    let spec = serde_json::to_value(&job.spec).expect("serializes");
    assert_eq!(spec["completionPolicy"], json!({"type": "Always"}));
    assert_eq!(
        spec["pullPolicy"],
        json!({"timeoutSeconds": 600, "backoffLimit": 3})
    );
    assert_eq!(spec["imagePullPolicy"], json!("IfNotPresent"));
    assert_eq!(spec.get("parallelism"), None, "not defaulted, as upstream");
    assert_eq!(job.metadata.finalizers, None);
    let once = job.clone();
    default_imagepulljob(&mut job);
    assert_eq!(job, once);
    // Set values are kept.
    let mut job = ImagePullJob::new("j", serde_json::from_value(json!({"image": "x",
            "pullPolicy": {"timeoutSeconds": 30}, "completionPolicy": {"type": "Never"}, "imagePullPolicy": "Always"})).expect("spec"));
    default_imagepulljob(&mut job);
    let spec = serde_json::to_value(&job.spec).expect("serializes");
    assert_eq!(
        spec["pullPolicy"],
        json!({"timeoutSeconds": 30, "backoffLimit": 3})
    );
    assert_eq!(spec["completionPolicy"], json!({"type": "Never"}));
    assert_eq!(spec["imagePullPolicy"], json!("Always"));
}

#[test]
fn nodeimage_defaults_created_at_and_pull_policy_and_sorts_tags() {
    let mut node = NodeImage::new("n", serde_json::from_value(json!({"images": {"nginx": {"tags": [
            {"tag": "b"},
            {"tag": "a", "createdAt": "2025-01-01T00:00:00Z", "pullPolicy": {"timeoutSeconds": 5, "ttlSecondsAfterFinished": 9}},
            {"tag": "1.0"}
        ]}}})).expect("spec"));
    node.status = Some(NodeImageStatus {
        image_statuses: [(
            "nginx".into(),
            ImageStatus {
                tags: vec![
                    ImageTagStatus::new("b", ImagePullPhase::Pulling),
                    ImageTagStatus::new("a", ImagePullPhase::Succeeded),
                ],
            },
        )]
        .into(),
        ..Default::default()
    });
    let now = time("2026-06-01T12:00:00Z");
    default_nodeimage(&mut node, &now);
    let tags = &node.spec.images["nginx"].tags;
    assert_eq!(
        tags.iter().map(|t| t.tag.as_str()).collect::<Vec<_>>(),
        ["1.0", "a", "b"]
    );
    assert_eq!(tags[0].created_at, Some(now.clone()));
    assert_eq!(
        tags[1].created_at,
        Some(time("2025-01-01T00:00:00Z")),
        "kept"
    );
    assert_eq!(
        tags[0].pull_policy,
        Some(ImageTagPullPolicy {
            timeout_seconds: Some(600),
            backoff_limit: Some(3),
            ..Default::default()
        })
    );
    assert_eq!(
        tags[1].pull_policy,
        Some(ImageTagPullPolicy {
            timeout_seconds: Some(5),
            backoff_limit: Some(3),
            ttl_seconds_after_finished: Some(9),
            active_deadline_seconds: None
        })
    );
    let status_tags = &node.status.as_ref().expect("status").image_statuses["nginx"].tags;
    assert_eq!(
        status_tags
            .iter()
            .map(|t| t.tag.as_str())
            .collect::<Vec<_>>(),
        ["a", "b"]
    );

    // Idempotent, even at a later time.
    let once = node.clone();
    default_nodeimage(&mut node, &time("2027-01-01T00:00:00Z"));
    assert_eq!(node, once);
}

#[test]
fn imagelistpulljob_defaults_leave_the_image_pull_policy_alone() {
    let mut job = ImageListPullJob::new(
        "list",
        serde_json::from_value(json!({
            "images": ["nginx"],
            "pullPolicy": {"timeoutSeconds": 30}
        }))
        .expect("spec"),
    );
    default_imagelistpulljob(&mut job);
    let template = &job.spec.template;
    assert_eq!(
        template.completion_policy.type_,
        Some(CompletionPolicyType::Always)
    );
    assert_eq!(
        template.pull_policy,
        Some(PullPolicy {
            timeout_seconds: Some(30),
            backoff_limit: Some(3)
        })
    );
    assert_eq!(template.image_pull_policy, None);
    let once = job.clone();
    default_imagelistpulljob(&mut job);
    assert_eq!(job, once);
}
