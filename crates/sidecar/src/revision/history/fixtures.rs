//! SidecarSets and specs the revision tests of this crate and of the manager's controller share
//! (feature `test-fixtures`).

use k8s_openapi::api::apps::v1::ControllerRevision;
use kruise_rs_api::sidecarset::{SidecarSet, SidecarSetSpec};
use serde_json::{Value, json};

use super::{go_json_text, revision_data};

pub const NS: &str = "kruise-system";
pub(crate) const UID: &str = "1223344";

pub(crate) fn spec(v: Value) -> SidecarSetSpec {
    serde_json::from_value(v).expect("valid spec")
}

pub fn minimal() -> Value {
    json!({"containers": [{"name": "c", "image": "i"}]})
}

pub fn rich() -> Value {
    json!({
        "containers": [{
            "name": "proxy",
            "image": "example.com/proxy:1.2",
            "command": ["/bin/sh", "-c", "run <a> && b"],
            "env": [{"name": "A", "value": "1"}],
            "ports": [{"containerPort": 15000, "name": "admin"}],
            "resources": {"limits": {"cpu": "0.5", "memory": "1024Mi"}},
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}],
            "podInjectPolicy": "AfterAppContainer",
            "upgradeStrategy": {"upgradeType": "HotUpgrade", "hotUpgradeEmptyImage": "example.com/empty:1"},
            "shareVolumePolicy": {"type": "enabled"},
            "transferEnv": [{"sourceContainerName": "app", "envNames": ["X"]}],
        }],
        "initContainers": [
            {"name": "init", "image": "busybox", "restartPolicy": "Always"},
            {"name": "plain", "image": "busybox", "args": ["x"]},
        ],
        "volumes": [
            {"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 420, "optional": false}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
            {"name": "sec", "secret": {"secretName": "s", "items": [{"key": "k", "path": "p"}]}},
        ],
        "imagePullSecrets": [{"name": "regcred"}],
        "patchPodMetadata": [{
            "annotations": {"oom-score": "{\"log-agent\": 1}", "b": "2"},
            "patchPolicy": "MergePatchJson",
        }],
    })
}

pub fn sidecarset(name: &str, spec_json: Value) -> SidecarSet {
    let mut set = SidecarSet::new(name, spec(spec_json));
    set.metadata.uid = Some(UID.into());
    set.spec.revision_history_limit = Some(10);
    set
}

pub fn text_of(s: &SidecarSetSpec) -> String {
    go_json_text(&revision_data(s))
}

pub fn name_of(r: &ControllerRevision) -> &str {
    r.metadata.name.as_deref().unwrap_or_default()
}
