//! The part of Kubernetes' pod validation (`ValidatePodCreate`, `pkg/apis/core/validation`) that
//! applies to what a SidecarSet injects: its containers, init containers and volumes.
//!
//! Upstream builds a fake Pod from the SidecarSet and runs the whole of Kubernetes' pod
//! validation, as vendored in its release, on it. kruise-rs asks the cluster's own apiserver
//! instead (a dry-run pod, `webhook/dry_run.rs`, decision 0012), so a sidecar using a field newer
//! than this crate is judged by the Kubernetes that will run it (decision 0033). Two parts of
//! this module stay in use:
//!
//! - `validate_identities`: the names and images kruise-rs relies on itself; always checked,
//!   a SidecarSet breaking them is refused whatever the dry run says.
//! - `validate_pod_parts`: the rules below re-stated from Kubernetes 1.33, with its field paths
//!   (`spec.containers[0].name`, `spec.volumes[1]`, which are also the SidecarSet's paths) and
//!   wording. Consulted only when the dry run cannot answer, and then only as admission
//!   warnings: a newer Kubernetes may allow what they refuse. Covered:
//!
//! - **Container names**: required, RFC 1123 labels, unique across containers and init
//!   containers (a clash is reported on the init container, as Kubernetes does).
//! - **Image**: required, no leading or trailing whitespace.
//! - **imagePullPolicy** (`Always`/`IfNotPresent`/`Never`), **terminationMessagePolicy**
//!   (`File`/`FallbackToLogsOnError`): checked when set; unset is what defaulting fills.
//! - **restartPolicy**: forbidden on containers; on init containers only `Always` (a native
//!   sidecar). Init containers that are not native sidecars may not have `lifecycle` or probes.
//! - **Ports**: `containerPort` required and 1–65535, `hostPort` 0 or 1–65535, names IANA service
//!   names unique within the container, protocol `TCP`/`UDP`/`SCTP` when set.
//! - **Env**: names required and valid under Kubernetes' relaxed rule (printable ASCII except
//!   `=`); `valueFrom` has exactly one source and no `value` beside it; `fieldRef` paths are ones
//!   the downward API serves; `configMapKeyRef`/`secretKeyRef` name and key valid.
//! - **Probes**: exactly one handler, non-negative numbers, `successThreshold` 1 for liveness and
//!   startup probes.
//! - **volumeMounts**: name required and naming a volume of the SidecarSet, `mountPath` required
//!   and unique in the container, `subPath`/`subPathExpr` relative without `..` and not both,
//!   `mountPropagation` known (`Bidirectional` only for privileged containers), no clash with the
//!   container's volumeDevices. (`mountPath` is not required to be absolute: Kubernetes does not
//!   require it of a pod, and a SidecarSet should not refuse what the pod would accept.)
//! - **volumeDevices**: name naming a PVC or ephemeral volume, `devicePath` required, unique,
//!   without `..`, no clash with the container's volumeMounts.
//! - **Volumes**: names required, RFC 1123 labels, unique; exactly one volume source; `hostPath`
//!   path required and type known; `secret.secretName`, `configMap.name`,
//!   `persistentVolumeClaim.claimName` required; `defaultMode` 0–0777 for secret, configMap,
//!   downwardAPI and projected; downwardAPI items: relative paths without `..`, `fieldRef` to
//!   what a volume can expose, `resourceFieldRef` with its container; projected
//!   service-account tokens need a path and an expiry
//!   between 10 minutes and 2³² seconds.
//!
//! Not covered (Kubernetes still checks them on every pod the sidecars are injected into, so a
//! miss here fails at pod creation rather than passing silently): resources and their
//! quantities, securityContext, envFrom, lifecycle handler details, probe action details (ports,
//! hosts, headers), volume source details beyond the above, pod-level rules (host ports, DNS,
//! affinity), and anything gated by an alpha feature. The SidecarSet webhook covers those with
//! a dry-run pod judged by the apiserver itself (`webhook/dry_run.rs`, decision 0012).

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, ObjectFieldSelector, Probe, Volume, VolumeDevice, VolumeMount,
};

use super::{
    FieldError, child, dns1123_label_errors, dns1123_subdomain_errors, index, invalid_each,
    qualified_name_errors, validate_nonnegative,
};

const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];
const TERMINATION_MESSAGE_POLICIES: [&str; 2] = ["FallbackToLogsOnError", "File"];
const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];
const MOUNT_PROPAGATIONS: [&str; 3] = ["Bidirectional", "HostToContainer", "None"];
const HOST_PATH_TYPES: [&str; 8] = [
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];
/// Downward API paths an env var's `fieldRef` may use (besides subscripted labels/annotations).
const ENV_FIELD_PATHS: [&str; 11] = [
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];
const MAX_FILE_MODE: i32 = 0o777;
const MIN_TOKEN_EXPIRATION_SECONDS: i64 = 10 * 60;
const MAX_TOKEN_EXPIRATION_SECONDS: i64 = 1 << 32;

/// Validates containers, init containers and the volumes they may mount as Kubernetes would in a
/// pod. `spec_path` is the path of the object holding them (`"spec"` for a SidecarSet); the
/// lists are reported as `<spec_path>.initContainers`, `.containers` and `.volumes`.
pub(crate) fn validate_pod_parts(
    init_containers: &[&Container],
    containers: &[&Container],
    volumes: &[Volume],
    spec_path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let volume_path = child(spec_path, "volumes");
    errs.extend(validate_volumes(volumes, &volume_path));
    let by_name: BTreeMap<&str, &Volume> = volumes.iter().map(|v| (v.name.as_str(), v)).collect();

    let containers_path = child(spec_path, "containers");
    let mut names = HashSet::new();
    for (i, c) in containers.iter().enumerate() {
        let path = index(&containers_path, i);
        errs.extend(validate_container_common(c, &by_name, &path));
        if c.restart_policy.is_some() {
            errs.push(FieldError::forbidden(
                child(&path, "restartPolicy"),
                "may not be set for non-init containers",
            ));
        }
        if !c.name.is_empty() && !names.insert(c.name.as_str()) {
            errs.push(FieldError::duplicate(child(&path, "name"), &c.name));
        }
        errs.extend(validate_probes(c, &path));
    }

    let init_path = child(spec_path, "initContainers");
    for (i, c) in init_containers.iter().enumerate() {
        let path = index(&init_path, i);
        errs.extend(validate_container_common(c, &by_name, &path));
        let native_sidecar = match c.restart_policy.as_deref() {
            None => false,
            Some("Always") => true,
            Some(other) => {
                errs.push(FieldError::not_supported(
                    child(&path, "restartPolicy"),
                    other,
                    &["Always"],
                ));
                false
            }
        };
        if !c.name.is_empty() && !names.insert(c.name.as_str()) {
            errs.push(FieldError::duplicate(child(&path, "name"), &c.name));
        }
        if native_sidecar {
            errs.extend(validate_probes(c, &path));
        } else {
            let set = [
                ("lifecycle", c.lifecycle.is_some()),
                ("livenessProbe", c.liveness_probe.is_some()),
                ("readinessProbe", c.readiness_probe.is_some()),
                ("startupProbe", c.startup_probe.is_some()),
            ];
            for (field, _) in set.into_iter().filter(|(_, is_set)| *is_set) {
                errs.push(FieldError::forbidden(
                    child(&path, field),
                    "may not be set for init containers without restartPolicy=Always",
                ));
            }
        }
    }
    errs
}

/// A container's name (required, an RFC 1123 label) and image (required, no surrounding
/// whitespace).
fn name_and_image_errors(c: &Container, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name_path = child(path, "name");
    if c.name.is_empty() {
        errs.push(FieldError::required(&name_path, ""));
    } else {
        errs.extend(invalid_each(
            &name_path,
            &c.name,
            dns1123_label_errors(&c.name),
        ));
    }
    let image_path = child(path, "image");
    match c.image.as_deref() {
        None | Some("") => errs.push(FieldError::required(&image_path, "")),
        Some(image) if image.trim() != image => errs.push(FieldError::invalid(
            &image_path,
            image,
            "must not have leading or trailing whitespace",
        )),
        Some(_) => {}
    }
    errs
}

/// A volume's name: required, an RFC 1123 label, not one of `names` (those before it).
fn volume_name_errors<'a>(
    v: &'a Volume,
    path: &str,
    names: &mut HashSet<&'a str>,
) -> Vec<FieldError> {
    let name_path = child(path, "name");
    if v.name.is_empty() {
        return vec![FieldError::required(&name_path, "")];
    }
    let mut errs = invalid_each(&name_path, &v.name, dns1123_label_errors(&v.name));
    if !names.insert(v.name.as_str()) {
        errs.push(FieldError::duplicate(&name_path, &v.name));
    }
    errs
}

/// The part of pod validation kruise-rs relies on itself, whatever the cluster's Kubernetes
/// says: injection, upgrades and hot-upgrade twins find containers by name, pre-download and
/// upgrades read images, injection merges volumes by name. So container names are required
/// RFC 1123 labels, unique across containers and init containers; images are required without
/// surrounding whitespace; volume names are required RFC 1123 labels, unique. No Kubernetes
/// release kruise-rs serves has changed these rules. Every other pod rule is the apiserver's to
/// judge (the webhook's dry-run pod); [`validate_pod_parts`] re-states them for when it cannot.
pub(crate) fn validate_identities(
    init_containers: &[&Container],
    containers: &[&Container],
    volumes: &[Volume],
    spec_path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = HashSet::new();
    for (list, items) in [
        ("containers", containers),
        ("initContainers", init_containers),
    ] {
        let list_path = child(spec_path, list);
        for (i, c) in items.iter().enumerate() {
            let path = index(&list_path, i);
            errs.extend(name_and_image_errors(c, &path));
            if !c.name.is_empty() && !names.insert(c.name.as_str()) {
                errs.push(FieldError::duplicate(child(&path, "name"), &c.name));
            }
        }
    }
    let volume_path = child(spec_path, "volumes");
    let mut volume_names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        errs.extend(volume_name_errors(
            v,
            &index(&volume_path, i),
            &mut volume_names,
        ));
    }
    errs
}

/// What every container kind shares: name, image, policies, ports, env, mounts, devices.
fn validate_container_common(
    c: &Container,
    volumes: &BTreeMap<&str, &Volume>,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = name_and_image_errors(c, path);
    if let Some(policy) = c.image_pull_policy.as_deref()
        && !PULL_POLICIES.contains(&policy)
    {
        errs.push(FieldError::not_supported(
            child(path, "imagePullPolicy"),
            policy,
            &PULL_POLICIES,
        ));
    }
    if let Some(policy) = c.termination_message_policy.as_deref()
        && !TERMINATION_MESSAGE_POLICIES.contains(&policy)
    {
        errs.push(FieldError::not_supported(
            child(path, "terminationMessagePolicy"),
            policy,
            &TERMINATION_MESSAGE_POLICIES,
        ));
    }

    errs.extend(validate_ports(
        c.ports.as_deref().unwrap_or_default(),
        &child(path, "ports"),
    ));
    let env_path = child(path, "env");
    for (i, env) in c.env.iter().flatten().enumerate() {
        errs.extend(validate_env_var(env, &index(&env_path, i)));
    }
    let mounts = c.volume_mounts.as_deref().unwrap_or_default();
    let devices = c.volume_devices.as_deref().unwrap_or_default();
    errs.extend(validate_volume_mounts(
        mounts,
        devices,
        volumes,
        is_privileged(c),
        &child(path, "volumeMounts"),
    ));
    errs.extend(validate_volume_devices(
        devices,
        mounts,
        volumes,
        &child(path, "volumeDevices"),
    ));
    errs
}

fn is_privileged(c: &Container) -> bool {
    c.security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false)
}

// --- Ports --------------------------------------------------------------------------------------

/// Kubernetes' `IsValidPortName` (an IANA service name).
fn port_name_errors(name: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if name.len() > 15 {
        errs.push("must be no more than 15 characters".to_owned());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        errs.push(
            "must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_owned(),
        );
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_owned());
    }
    if name.contains("--") {
        errs.push("must not contain consecutive hyphens".to_owned());
    }
    if name.starts_with('-') || name.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_owned());
    }
    errs
}

fn port_number_error(path: String, port: i32) -> Option<FieldError> {
    (!(1..=65535).contains(&port)).then(|| {
        FieldError::invalid_int(
            path,
            i64::from(port),
            "must be between 1 and 65535, inclusive",
        )
    })
}

fn validate_ports(ports: &[ContainerPort], path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate() {
        let port_path = index(path, i);
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            let name_path = child(&port_path, "name");
            let problems = port_name_errors(name);
            if !problems.is_empty() {
                errs.extend(invalid_each(&name_path, name, problems));
            } else if !names.insert(name) {
                errs.push(FieldError::duplicate(name_path, name));
            }
        }
        if port.container_port == 0 {
            errs.push(FieldError::required(child(&port_path, "containerPort"), ""));
        } else {
            errs.extend(port_number_error(
                child(&port_path, "containerPort"),
                port.container_port,
            ));
        }
        if let Some(host_port) = port.host_port.filter(|p| *p != 0) {
            errs.extend(port_number_error(child(&port_path, "hostPort"), host_port));
        }
        if let Some(protocol) = port.protocol.as_deref()
            && !PROTOCOLS.contains(&protocol)
        {
            errs.push(FieldError::not_supported(
                child(&port_path, "protocol"),
                protocol,
                &PROTOCOLS,
            ));
        }
    }
    errs
}

// --- Env ----------------------------------------------------------------------------------------

/// Kubernetes' relaxed environment variable name rule (`IsRelaxedEnvVarName`, applied when its
/// `RelaxedEnvironmentVariableValidation` feature is on, as it is by default in current
/// releases): non-empty, printable ASCII other than `=`.
pub(crate) fn env_var_name_errors(name: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if name.is_empty() {
        errs.push("environment variable name must be non-empty".to_owned());
    }
    if name.chars().any(|c| !(' '..='~').contains(&c) || c == '=') {
        errs.push(
            "a valid environment variable name must consist only of printable ASCII characters other than '='"
                .to_owned(),
        );
    }
    errs
}

fn validate_env_var(env: &EnvVar, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name_path = child(path, "name");
    if env.name.is_empty() {
        errs.push(FieldError::required(name_path, ""));
    } else {
        errs.extend(invalid_each(
            &name_path,
            &env.name,
            env_var_name_errors(&env.name),
        ));
    }
    let Some(from) = &env.value_from else {
        return errs;
    };
    let from_path = child(path, "valueFrom");
    let mut sources = 0;
    if let Some(field_ref) = &from.field_ref {
        sources += 1;
        errs.extend(validate_env_field_ref(
            field_ref,
            &child(&from_path, "fieldRef"),
        ));
    }
    if from.resource_field_ref.is_some() {
        sources += 1;
    }
    let key_refs = [
        (
            "configMapKeyRef",
            from.config_map_key_ref.as_ref().map(|r| (&r.name, &r.key)),
        ),
        (
            "secretKeyRef",
            from.secret_key_ref.as_ref().map(|r| (&r.name, &r.key)),
        ),
    ];
    for (field, key_ref) in key_refs {
        if let Some((name, key)) = key_ref {
            sources += 1;
            let ref_path = child(&from_path, field);
            errs.extend(invalid_each(
                &child(&ref_path, "name"),
                name,
                dns1123_subdomain_errors(name),
            ));
            if key.is_empty() {
                errs.push(FieldError::required(child(&ref_path, "key"), ""));
            } else {
                errs.extend(invalid_each(
                    &child(&ref_path, "key"),
                    key,
                    config_map_key_errors(key),
                ));
            }
        }
    }
    let has_value = env.value.as_deref().is_some_and(|v| !v.is_empty());
    if sources == 0 {
        errs.push(FieldError::invalid(
            from_path,
            "",
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`",
        ));
    } else if has_value {
        errs.push(FieldError::invalid(
            from_path,
            "",
            "may not be specified when `value` is not empty",
        ));
    } else if sources > 1 {
        errs.push(FieldError::invalid(
            from_path,
            "",
            "may not have more than one field specified at a time",
        ));
    }
    errs
}

/// Kubernetes' `IsConfigMapKey`.
fn config_map_key_errors(key: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if key.len() > 253 {
        errs.push("must be no more than 253 characters".to_owned());
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        errs.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name', or 'KEY_NAME', or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_owned());
    }
    if key == "." {
        errs.push("must not be '.'".to_owned());
    } else if key == ".." {
        errs.push("must not be '..'".to_owned());
    } else if key.starts_with("..") {
        errs.push("must not start with '..'".to_owned());
    }
    errs
}

/// Fields a downwardAPI volume can expose (fewer than env vars can: no spec or status fields).
const DOWNWARD_VOLUME_FIELDS: &[&str] = &[
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
];

/// downwardAPI volume items as Kubernetes checks them: a relative path without `..`, and a
/// `fieldRef` to a field a volume can expose, or a `resourceFieldRef` naming its container. A
/// SidecarSet with anything else would be admitted and then fail every pod it selects.
fn validate_downward_items(
    items: &[k8s_openapi::api::core::v1::DownwardAPIVolumeFile],
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let ip = index(path, i);
        let file = &item.path;
        if file.is_empty() {
            errs.push(FieldError::required(child(&ip, "path"), ""));
        } else if file.starts_with('/') {
            errs.push(FieldError::invalid(
                child(&ip, "path"),
                file,
                "must be a relative path",
            ));
        } else if file.split('/').any(|part| part == "..") {
            errs.push(FieldError::invalid(
                child(&ip, "path"),
                file,
                "must not contain '..'",
            ));
        }
        match (&item.field_ref, &item.resource_field_ref) {
            (Some(field), None) => {
                let fp = &field.field_path;
                let base = split_subscripted_path(fp).map_or(fp.as_str(), |(base, _)| base);
                let subscript_ok = split_subscripted_path(fp).is_none_or(|(base, _)| {
                    base == "metadata.labels" || base == "metadata.annotations"
                });
                if !DOWNWARD_VOLUME_FIELDS.contains(&base) || !subscript_ok {
                    errs.push(FieldError::not_supported(
                        child(&child(&ip, "fieldRef"), "fieldPath"),
                        fp,
                        DOWNWARD_VOLUME_FIELDS,
                    ));
                }
            }
            (None, Some(resource)) => {
                if resource
                    .container_name
                    .as_deref()
                    .unwrap_or_default()
                    .is_empty()
                {
                    errs.push(FieldError::required(
                        child(&child(&ip, "resourceFieldRef"), "containerName"),
                        "a downwardAPI volume's resourceFieldRef must name its container",
                    ));
                }
            }
            (Some(_), Some(_)) => errs.push(FieldError::invalid(
                ip.clone(),
                "",
                "fieldRef and resourceFieldRef can not be specified simultaneously",
            )),
            (None, None) => errs.push(FieldError::required(
                child(&ip, "fieldRef"),
                "one of fieldRef and resourceFieldRef is required",
            )),
        }
    }
    errs
}

/// Splits `metadata.labels['key']` into (`metadata.labels`, `key`).
pub(crate) fn split_subscripted_path(path: &str) -> Option<(&str, &str)> {
    let (base, rest) = path.split_once("['")?;
    let key = rest.strip_suffix("']")?;
    Some((base, key))
}

fn validate_env_field_ref(field_ref: &ObjectFieldSelector, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(version) = field_ref.api_version.as_deref()
        && version != "v1"
    {
        errs.push(FieldError::not_supported(
            child(path, "apiVersion"),
            version,
            &["v1"],
        ));
        return errs;
    }
    let field_path = child(path, "fieldPath");
    let fp = field_ref.field_path.as_str();
    if fp.is_empty() {
        errs.push(FieldError::required(field_path, ""));
        return errs;
    }
    match split_subscripted_path(fp) {
        Some(("metadata.annotations", key)) => {
            errs.extend(invalid_each(
                path,
                key,
                qualified_name_errors(&key.to_lowercase()),
            ));
        }
        Some(("metadata.labels", key)) => {
            errs.extend(invalid_each(path, key, qualified_name_errors(key)));
        }
        Some((base, _)) => errs.push(FieldError::invalid(
            path,
            base,
            "does not support subscript",
        )),
        None if !ENV_FIELD_PATHS.contains(&fp) => {
            errs.push(FieldError::not_supported(field_path, fp, &ENV_FIELD_PATHS));
        }
        None => {}
    }
    errs
}

// --- Probes -------------------------------------------------------------------------------------

fn validate_probes(c: &Container, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let probes = [
        ("livenessProbe", c.liveness_probe.as_ref(), true),
        ("readinessProbe", c.readiness_probe.as_ref(), false),
        ("startupProbe", c.startup_probe.as_ref(), true),
    ];
    for (field, probe, success_must_be_one) in probes {
        if let Some(probe) = probe {
            errs.extend(validate_probe(
                probe,
                success_must_be_one,
                &child(path, field),
            ));
        }
    }
    errs
}

fn validate_probe(probe: &Probe, success_must_be_one: bool, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let handlers = [
        ("exec", probe.exec.is_some()),
        ("httpGet", probe.http_get.is_some()),
        ("tcpSocket", probe.tcp_socket.is_some()),
        ("grpc", probe.grpc.is_some()),
    ];
    let mut set = handlers.iter().filter(|(_, is_set)| *is_set);
    if set.next().is_none() {
        errs.push(FieldError::required(path, "must specify a handler type"));
    }
    for (field, _) in set {
        errs.push(FieldError::forbidden(
            child(path, field),
            "may not specify more than 1 handler type",
        ));
    }
    let numbers = [
        ("initialDelaySeconds", probe.initial_delay_seconds),
        ("timeoutSeconds", probe.timeout_seconds),
        ("periodSeconds", probe.period_seconds),
        ("successThreshold", probe.success_threshold),
        ("failureThreshold", probe.failure_threshold),
    ];
    for (field, value) in numbers {
        if let Some(v) = value {
            errs.extend(validate_nonnegative(i64::from(v), &child(path, field)));
        }
    }
    if success_must_be_one
        && let Some(v) = probe.success_threshold
        && v != 1
    {
        errs.push(FieldError::invalid_int(
            child(path, "successThreshold"),
            i64::from(v),
            "must be 1",
        ));
    }
    errs
}

// --- Mounts and devices -------------------------------------------------------------------------

/// Kubernetes' `validateLocalDescendingPath`: relative, without a `..` element.
fn validate_local_descending_path(p: &str, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if p.starts_with('/') {
        errs.push(FieldError::invalid(path, p, "must be a relative path"));
    }
    errs.extend(validate_no_backsteps(p, path, "must not contain '..'"));
    errs
}

fn validate_no_backsteps(p: &str, path: &str, message: &str) -> Option<FieldError> {
    p.replace('\\', "/")
        .split('/')
        .any(|part| part == "..")
        .then(|| FieldError::invalid(path, p, message))
}

fn validate_volume_mounts(
    mounts: &[VolumeMount],
    devices: &[VolumeDevice],
    volumes: &BTreeMap<&str, &Volume>,
    privileged: bool,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut mount_paths = HashSet::new();
    for (i, m) in mounts.iter().enumerate() {
        let mount_path = index(path, i);
        let name_path = child(&mount_path, "name");
        if m.name.is_empty() {
            errs.push(FieldError::required(&name_path, ""));
        } else if !volumes.contains_key(m.name.as_str()) {
            errs.push(FieldError::not_found(
                &name_path,
                &m.name,
                "no volume of this name in spec.volumes",
            ));
        }
        let path_path = child(&mount_path, "mountPath");
        if m.mount_path.is_empty() {
            errs.push(FieldError::required(&path_path, ""));
        } else if !mount_paths.insert(m.mount_path.as_str()) {
            errs.push(FieldError::invalid(
                &path_path,
                &m.mount_path,
                "must be unique",
            ));
        }
        if devices.iter().any(|d| d.name == m.name) {
            errs.push(FieldError::invalid(
                &name_path,
                &m.name,
                "must not already exist in volumeDevices",
            ));
        }
        if devices.iter().any(|d| d.device_path == m.mount_path) {
            errs.push(FieldError::invalid(
                &path_path,
                &m.mount_path,
                "must not already exist as a path in volumeDevices",
            ));
        }
        let sub_path = m.sub_path.as_deref().unwrap_or_default();
        if !sub_path.is_empty() {
            errs.extend(validate_local_descending_path(
                sub_path,
                &child(&mount_path, "subPath"),
            ));
        }
        let expr = m.sub_path_expr.as_deref().unwrap_or_default();
        if !expr.is_empty() {
            let expr_path = child(&mount_path, "subPathExpr");
            if !sub_path.is_empty() {
                errs.push(FieldError::invalid(
                    &expr_path,
                    expr,
                    "subPathExpr and subPath are mutually exclusive",
                ));
            }
            errs.extend(validate_local_descending_path(expr, &expr_path));
        }
        if let Some(propagation) = m.mount_propagation.as_deref() {
            let prop_path = child(&mount_path, "mountPropagation");
            if !MOUNT_PROPAGATIONS.contains(&propagation) {
                errs.push(FieldError::not_supported(
                    &prop_path,
                    propagation,
                    &MOUNT_PROPAGATIONS,
                ));
            } else if propagation == "Bidirectional" && !privileged {
                errs.push(FieldError::forbidden(
                    &prop_path,
                    "Bidirectional mount propagation is available only to privileged containers",
                ));
            }
        }
    }
    errs
}

fn validate_volume_devices(
    devices: &[VolumeDevice],
    mounts: &[VolumeMount],
    volumes: &BTreeMap<&str, &Volume>,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = HashSet::new();
    let mut device_paths = HashSet::new();
    for (i, d) in devices.iter().enumerate() {
        let device_path = index(path, i);
        let name_path = child(&device_path, "name");
        if d.name.is_empty() {
            errs.push(FieldError::required(&name_path, ""));
        }
        if !names.insert(d.name.as_str()) {
            errs.push(FieldError::invalid(&name_path, &d.name, "must be unique"));
        }
        match volumes.get(d.name.as_str()) {
            None => errs.push(FieldError::not_found(
                &name_path,
                &d.name,
                "no volume of this name in spec.volumes",
            )),
            Some(v) if v.persistent_volume_claim.is_none() && v.ephemeral.is_none() => {
                errs.push(FieldError::invalid(
                    &name_path,
                    &d.name,
                    "can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode",
                ));
            }
            Some(_) => {}
        }
        let dp_path = child(&device_path, "devicePath");
        if d.device_path.is_empty() {
            errs.push(FieldError::required(&dp_path, ""));
        }
        if device_paths.contains(d.device_path.as_str()) {
            errs.push(FieldError::invalid(
                &dp_path,
                &d.device_path,
                "must be unique",
            ));
        }
        match validate_no_backsteps(&d.device_path, &dp_path, "can not contain backsteps ('..')") {
            Some(e) if !d.device_path.is_empty() => errs.push(e),
            _ => {
                device_paths.insert(d.device_path.as_str());
            }
        }
        if mounts.iter().any(|m| m.name == d.name) {
            errs.push(FieldError::invalid(
                &name_path,
                &d.name,
                "must not already exist in volumeMounts",
            ));
        }
        if mounts.iter().any(|m| m.mount_path == d.device_path) {
            errs.push(FieldError::invalid(
                &dp_path,
                &d.device_path,
                "must not already exist as a path in volumeMounts",
            ));
        }
    }
    errs
}

// --- Volumes ------------------------------------------------------------------------------------

/// The volume sources set on `v`, by their JSON field names, in Kubernetes' order.
pub(crate) fn volume_sources(v: &Volume) -> Vec<&'static str> {
    let all = [
        ("hostPath", v.host_path.is_some()),
        ("emptyDir", v.empty_dir.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("secret", v.secret.is_some()),
        ("nfs", v.nfs.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("persistentVolumeClaim", v.persistent_volume_claim.is_some()),
        ("rbd", v.rbd.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("cinder", v.cinder.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("flocker", v.flocker.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("fc", v.fc.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("configMap", v.config_map.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("projected", v.projected.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
        ("csi", v.csi.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("image", v.image.is_some()),
    ];
    all.into_iter()
        .filter(|(_, is_set)| *is_set)
        .map(|(name, _)| name)
        .collect()
}

fn validate_default_mode(mode: Option<i32>, path: &str) -> Option<FieldError> {
    let mode = mode?;
    (!(0..=MAX_FILE_MODE).contains(&mode)).then(|| {
        FieldError::invalid_int(
            path,
            i64::from(mode),
            "must be a number between 0 and 0777 (octal), both inclusive",
        )
    })
}

/// Validates a pod's (here: a SidecarSet's) volume list.
pub(crate) fn validate_volumes(volumes: &[Volume], path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let vol_path = index(path, i);
        errs.extend(volume_name_errors(v, &vol_path, &mut names));
        let sources = volume_sources(v);
        match sources.as_slice() {
            [] => errs.push(FieldError::required(
                &vol_path,
                "must specify a volume type",
            )),
            [_] => {}
            [_, extra @ ..] => {
                for source in extra {
                    errs.push(FieldError::forbidden(
                        child(&vol_path, source),
                        "may not specify more than 1 volume type",
                    ));
                }
            }
        }
        errs.extend(validate_volume_source(v, &vol_path));
    }
    errs
}

fn validate_volume_source(v: &Volume, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(host_path) = &v.host_path {
        let hp = child(path, "hostPath");
        if host_path.path.is_empty() {
            errs.push(FieldError::required(child(&hp, "path"), ""));
        }
        if let Some(t) = host_path.type_.as_deref()
            && !HOST_PATH_TYPES.contains(&t)
        {
            errs.push(FieldError::not_supported(
                child(&hp, "type"),
                t,
                &HOST_PATH_TYPES,
            ));
        }
    }
    if let Some(secret) = &v.secret {
        let sp = child(path, "secret");
        if secret.secret_name.as_deref().unwrap_or_default().is_empty() {
            errs.push(FieldError::required(child(&sp, "secretName"), ""));
        }
        errs.extend(validate_default_mode(
            secret.default_mode,
            &child(&sp, "defaultMode"),
        ));
    }
    if let Some(config_map) = &v.config_map {
        let cp = child(path, "configMap");
        if config_map.name.is_empty() {
            errs.push(FieldError::required(child(&cp, "name"), ""));
        }
        errs.extend(validate_default_mode(
            config_map.default_mode,
            &child(&cp, "defaultMode"),
        ));
    }
    if let Some(downward) = &v.downward_api {
        let dp = child(path, "downwardAPI");
        errs.extend(validate_default_mode(
            downward.default_mode,
            &child(&dp, "defaultMode"),
        ));
        errs.extend(validate_downward_items(
            downward.items.as_deref().unwrap_or_default(),
            &child(&dp, "items"),
        ));
    }
    if let Some(pvc) = &v.persistent_volume_claim
        && pvc.claim_name.is_empty()
    {
        errs.push(FieldError::required(
            child(&child(path, "persistentVolumeClaim"), "claimName"),
            "",
        ));
    }
    if let Some(projected) = &v.projected {
        let pp = child(path, "projected");
        errs.extend(validate_default_mode(
            projected.default_mode,
            &child(&pp, "defaultMode"),
        ));
        let sources_path = child(&pp, "sources");
        for (i, source) in projected.sources.iter().flatten().enumerate() {
            let Some(token) = &source.service_account_token else {
                continue;
            };
            let tp = child(&index(&sources_path, i), "serviceAccountToken");
            if token.path.is_empty() {
                errs.push(FieldError::required(child(&tp, "path"), ""));
            }
            if let Some(seconds) = token.expiration_seconds {
                let ep = child(&tp, "expirationSeconds");
                if seconds < MIN_TOKEN_EXPIRATION_SECONDS {
                    errs.push(FieldError::invalid_int(
                        ep,
                        seconds,
                        "may not specify a duration less than 10 minutes",
                    ));
                } else if seconds > MAX_TOKEN_EXPIRATION_SECONDS {
                    errs.push(FieldError::invalid_int(
                        ep,
                        seconds,
                        "may not specify a duration larger than 2^32 seconds",
                    ));
                }
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests;
