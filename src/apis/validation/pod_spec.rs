//! The part of Kubernetes' pod validation (`ValidatePodCreate`, `pkg/apis/core/validation`) that
//! applies to what a SidecarSet injects: its containers, init containers and volumes.
//!
//! Upstream builds a fake Pod from the SidecarSet and runs the whole of Kubernetes' pod
//! validation on it. We cannot link Kubernetes, so this module re-states the rules that matter
//! for sidecars, with Kubernetes' field paths (`spec.containers[0].name`, `spec.volumes[1]`, which
//! are also the SidecarSet's paths) and wording. Covered:
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
//! affinity), and anything gated by an alpha feature.

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
pub fn validate_pod_parts(
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

/// What every container kind shares: name, image, policies, ports, env, mounts, devices.
fn validate_container_common(
    c: &Container,
    volumes: &BTreeMap<&str, &Volume>,
    path: &str,
) -> Vec<FieldError> {
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
pub fn env_var_name_errors(name: &str) -> Vec<String> {
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
pub fn split_subscripted_path(path: &str) -> Option<(&str, &str)> {
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
pub fn volume_sources(v: &Volume) -> Vec<&'static str> {
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
pub fn validate_volumes(volumes: &[Volume], path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut names = HashSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let vol_path = index(path, i);
        let name_path = child(&vol_path, "name");
        if v.name.is_empty() {
            errs.push(FieldError::required(&name_path, ""));
        } else {
            errs.extend(invalid_each(
                &name_path,
                &v.name,
                dns1123_label_errors(&v.name),
            ));
            if !names.insert(v.name.as_str()) {
                errs.push(FieldError::duplicate(&name_path, &v.name));
            }
        }
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
mod tests {
    use super::*;
    use crate::apis::validation::ErrorKind;
    use serde_json::json;

    fn container(v: serde_json::Value) -> Container {
        serde_json::from_value(v).expect("test container")
    }

    fn volume(v: serde_json::Value) -> Volume {
        serde_json::from_value(v).expect("test volume")
    }

    fn ok_container(name: &str) -> Container {
        container(json!({"name": name, "image": "busybox"}))
    }

    fn check(init: &[Container], containers: &[Container], volumes: &[Volume]) -> Vec<FieldError> {
        let init: Vec<&Container> = init.iter().collect();
        let containers: Vec<&Container> = containers.iter().collect();
        validate_pod_parts(&init, &containers, volumes, "spec")
    }

    fn paths(errs: &[FieldError]) -> Vec<&str> {
        errs.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn downward_api_volume_items_are_checked_like_kubernetes() {
        let volumes = vec![volume(json!({"name": "d", "downwardAPI": {"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
            {"path": "node", "fieldRef": {"fieldPath": "spec.nodeName"}},
            {"path": "../x", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "/abs", "fieldRef": {"fieldPath": "metadata.uid"}},
            {"path": "cpu", "resourceFieldRef": {"resource": "limits.cpu"}},
            {"path": "none"}
        ]}}))];
        let paths: Vec<String> = validate_volumes(&volumes, "spec.volumes")
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(
            paths,
            [
                "spec.volumes[0].downwardAPI.items[2].fieldRef.fieldPath",
                "spec.volumes[0].downwardAPI.items[3].path",
                "spec.volumes[0].downwardAPI.items[4].path",
                "spec.volumes[0].downwardAPI.items[5].resourceFieldRef.containerName",
                "spec.volumes[0].downwardAPI.items[6].fieldRef",
            ]
        );
    }

    #[test]
    fn a_plain_sidecar_is_valid() {
        let c = container(json!({
            "name": "proxy",
            "image": "envoy:1",
            "imagePullPolicy": "IfNotPresent",
            "terminationMessagePolicy": "File",
            "ports": [{"name": "admin", "containerPort": 9901, "protocol": "TCP"}],
            "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}}],
            "volumeMounts": [{"name": "conf", "mountPath": "/etc/envoy"}],
            "livenessProbe": {"httpGet": {"port": 9901}, "successThreshold": 1}
        }));
        let v = volume(json!({"name": "conf", "configMap": {"name": "envoy"}}));
        assert_eq!(check(&[], &[c], &[v]), []);
    }

    #[test]
    fn container_names_are_required_labels_and_unique_across_both_lists() {
        let errs = check(
            &[ok_container("a"), ok_container("b")],
            &[
                ok_container("a"),
                ok_container("Bad_Name"),
                ok_container(""),
                ok_container("c"),
                ok_container("c"),
            ],
            &[],
        );
        assert_eq!(
            paths(&errs),
            [
                "spec.containers[1].name",
                "spec.containers[2].name",
                "spec.containers[4].name",
                "spec.initContainers[0].name",
            ]
        );
        assert_eq!(errs[0].kind, ErrorKind::Invalid);
        assert_eq!(
            errs[1].to_string(),
            "spec.containers[2].name: Required value"
        );
        assert_eq!(
            errs[2].to_string(),
            r#"spec.containers[4].name: Duplicate value: "c""#
        );
        assert_eq!(
            errs[3].to_string(),
            r#"spec.initContainers[0].name: Duplicate value: "a""#
        );
    }

    #[test]
    fn image_is_required_without_surrounding_whitespace() {
        let errs = check(
            &[container(json!({"name": "init"}))],
            &[
                container(json!({"name": "a", "image": ""})),
                container(json!({"name": "b", "image": " busybox"})),
            ],
            &[],
        );
        assert_eq!(
            paths(&errs),
            [
                "spec.containers[0].image",
                "spec.containers[1].image",
                "spec.initContainers[0].image"
            ]
        );
        assert_eq!(errs[0].kind, ErrorKind::Required);
        assert_eq!(
            errs[1].message,
            "must not have leading or trailing whitespace"
        );
    }

    #[test]
    fn pull_and_termination_policies_are_known_values_when_set() {
        let errs = check(
            &[],
            &[container(json!({
                "name": "a", "image": "x",
                "imagePullPolicy": "Sometimes",
                "terminationMessagePolicy": "Never"
            }))],
            &[],
        );
        assert_eq!(
            errs[0].to_string(),
            r#"spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never""#
        );
        assert_eq!(errs[1].path, "spec.containers[0].terminationMessagePolicy");
        assert_eq!(errs.len(), 2);
    }

    #[test]
    fn restart_policy_only_always_and_only_on_init_containers() {
        let errs = check(
            &[
                container(json!({"name": "i1", "image": "x", "restartPolicy": "Always"})),
                container(json!({"name": "i2", "image": "x", "restartPolicy": "OnFailure"})),
            ],
            &[container(
                json!({"name": "a", "image": "x", "restartPolicy": "Always"}),
            )],
            &[],
        );
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.containers[0].restartPolicy: Forbidden: may not be set for non-init containers",
                r#"spec.initContainers[1].restartPolicy: Unsupported value: "OnFailure": supported values: "Always""#,
            ]
        );
    }

    #[test]
    fn plain_init_containers_may_not_have_probes_or_lifecycle_but_native_sidecars_may() {
        let probe = json!({"exec": {"command": ["true"]}});
        let errs = check(
            &[
                container(
                    json!({"name": "plain", "image": "x", "readinessProbe": probe, "lifecycle": {}}),
                ),
                container(
                    json!({"name": "native", "image": "x", "restartPolicy": "Always", "readinessProbe": probe}),
                ),
            ],
            &[],
            &[],
        );
        assert_eq!(
            paths(&errs),
            [
                "spec.initContainers[0].lifecycle",
                "spec.initContainers[0].readinessProbe"
            ]
        );
        assert_eq!(
            errs[0].message,
            "may not be set for init containers without restartPolicy=Always"
        );
    }

    #[test]
    fn ports() {
        let errs = check(
            &[],
            &[container(json!({"name": "a", "image": "x", "ports": [
                {"name": "http", "containerPort": 80},
                {"name": "http", "containerPort": 81},
                {"name": "Bad--", "containerPort": 0},
                {"containerPort": 70000, "hostPort": 70000, "protocol": "HTTP"},
                {"containerPort": 82, "hostPort": 0}
            ]}))],
            &[],
        );
        assert_eq!(
            paths(&errs),
            [
                "spec.containers[0].ports[1].name",
                "spec.containers[0].ports[2].name",
                "spec.containers[0].ports[2].name",
                "spec.containers[0].ports[2].name",
                "spec.containers[0].ports[2].containerPort",
                "spec.containers[0].ports[3].containerPort",
                "spec.containers[0].ports[3].hostPort",
                "spec.containers[0].ports[3].protocol",
            ]
        );
        assert_eq!(errs[0].kind, ErrorKind::Duplicate);
        assert_eq!(
            errs[5].to_string(),
            "spec.containers[0].ports[3].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive"
        );
        assert_eq!(port_name_errors("a-b"), Vec::<String>::new());
        assert_eq!(
            port_name_errors("123"),
            ["must contain at least one letter (a-z)"]
        );
        assert_eq!(
            port_name_errors("abcdefghijklmnop"),
            ["must be no more than 15 characters"]
        );
    }

    #[test]
    fn env_names_follow_the_relaxed_rule() {
        assert!(env_var_name_errors("1-weird.name with spaces").is_empty());
        assert_eq!(
            env_var_name_errors("A=B"),
            [
                "a valid environment variable name must consist only of printable ASCII characters other than '='"
            ]
        );
        assert_eq!(env_var_name_errors("é").len(), 1);
        assert_eq!(env_var_name_errors("tab\t").len(), 1);
        let errs = check(
            &[],
            &[container(
                json!({"name": "a", "image": "x", "env": [{"name": ""}, {"name": "X=1"}]}),
            )],
            &[],
        );
        assert_eq!(
            paths(&errs),
            [
                "spec.containers[0].env[0].name",
                "spec.containers[0].env[1].name"
            ]
        );
        assert_eq!(errs[0].kind, ErrorKind::Required);
    }

    #[test]
    fn env_value_from_has_exactly_one_valid_source() {
        let errs = check(
            &[],
            &[container(json!({"name": "a", "image": "x", "env": [
                {"name": "A", "valueFrom": {}},
                {"name": "B", "value": "v", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}, "secretKeyRef": {"name": "s", "key": "k"}}},
                {"name": "D", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.containers"}}},
                {"name": "E", "valueFrom": {"fieldRef": {"apiVersion": "v2", "fieldPath": "metadata.name"}}},
                {"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['bad key']"}}},
                {"name": "G", "valueFrom": {"configMapKeyRef": {"name": "Bad", "key": ".."}}},
                {"name": "H", "valueFrom": {"secretKeyRef": {"name": "s", "key": ""}}},
                {"name": "I", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['Example.com/Key']"}}},
                {"name": "J", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
            ]}))],
            &[],
        );
        let env = |s: &str| format!("spec.containers[0].env{s}");
        assert_eq!(
            paths(&errs),
            [
                env("[0].valueFrom"),
                env("[1].valueFrom"),
                env("[2].valueFrom"),
                env("[3].valueFrom.fieldRef.fieldPath"),
                env("[4].valueFrom.fieldRef.apiVersion"),
                env("[5].valueFrom.fieldRef"),
                env("[6].valueFrom.configMapKeyRef.name"),
                env("[6].valueFrom.configMapKeyRef.key"),
                env("[7].valueFrom.secretKeyRef.key"),
            ]
        );
        assert_eq!(
            errs[0].message,
            "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
        );
        assert_eq!(
            errs[1].message,
            "may not be specified when `value` is not empty"
        );
        assert_eq!(
            errs[2].message,
            "may not have more than one field specified at a time"
        );
        assert_eq!(errs[3].kind, ErrorKind::NotSupported);
        assert_eq!(errs[7].message, "must not be '..'");
    }

    #[test]
    fn probes_need_one_handler_and_sane_numbers() {
        let errs = check(
            &[],
            &[container(json!({"name": "a", "image": "x",
                "livenessProbe": {"successThreshold": 2},
                "readinessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": 1}, "periodSeconds": -1, "successThreshold": 3},
                "startupProbe": {"grpc": {"port": 1}}
            }))],
            &[],
        );
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.containers[0].livenessProbe: Required value: must specify a handler type",
                "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
                "spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type",
                "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
            ]
        );
    }

    #[test]
    fn volume_mounts_reference_volumes_with_unique_paths() {
        let errs = check(
            &[],
            &[container(
                json!({"name": "a", "image": "x", "volumeMounts": [
                    {"name": "v", "mountPath": "/a"},
                    {"name": "v", "mountPath": "/a"},
                    {"name": "missing", "mountPath": "/b"},
                    {"name": "", "mountPath": ""},
                    {"name": "v", "mountPath": "/c", "subPath": "/abs"},
                    {"name": "v", "mountPath": "/d", "subPath": "a/../b", "subPathExpr": "$(X)"},
                    {"name": "v", "mountPath": "/e", "mountPropagation": "Bidirectional"},
                    {"name": "v", "mountPath": "/f", "mountPropagation": "Sideways"}
                ]}),
            )],
            &[volume(json!({"name": "v", "emptyDir": {}}))],
        );
        let m = |s: &str| format!("spec.containers[0].volumeMounts{s}");
        assert_eq!(
            paths(&errs),
            [
                m("[1].mountPath"),
                m("[2].name"),
                m("[3].name"),
                m("[3].mountPath"),
                m("[4].subPath"),
                m("[5].subPath"),
                m("[5].subPathExpr"),
                m("[6].mountPropagation"),
                m("[7].mountPropagation"),
            ]
        );
        assert_eq!(errs[0].message, "must be unique");
        assert_eq!(
            errs[1].to_string(),
            r#"spec.containers[0].volumeMounts[2].name: Not found: "missing": no volume of this name in spec.volumes"#
        );
        assert_eq!(errs[4].message, "must be a relative path");
        assert_eq!(errs[5].message, "must not contain '..'");
        assert_eq!(
            errs[6].message,
            "subPathExpr and subPath are mutually exclusive"
        );
        assert_eq!(errs[7].kind, ErrorKind::Forbidden);
        assert_eq!(errs[8].kind, ErrorKind::NotSupported);

        // A privileged container may use Bidirectional propagation.
        let privileged = container(json!({"name": "a", "image": "x",
            "securityContext": {"privileged": true},
            "volumeMounts": [{"name": "v", "mountPath": "/e", "mountPropagation": "Bidirectional"}]}));
        assert_eq!(
            check(
                &[],
                &[privileged],
                &[volume(json!({"name": "v", "emptyDir": {}}))]
            ),
            []
        );
    }

    #[test]
    fn upstream_volume_device_scenarios() {
        let pvc = volume(json!({"name": "disk0", "persistentVolumeClaim": {"claimName": "pvc-0"}}));
        let log = volume(json!({"name": "log", "emptyDir": {}}));
        // wrong-volumeDevice-volumes: the device names no volume.
        let c = container(json!({"name": "a", "image": "x",
            "volumeDevices": [{"name": "disk0", "devicePath": "/dev/nvme1"}]}));
        let errs = check(&[], std::slice::from_ref(&c), &[]);
        assert_eq!(paths(&errs), ["spec.containers[0].volumeDevices[0].name"]);
        assert_eq!(errs[0].kind, ErrorKind::NotFound);
        // right-volumeDevice-volumes
        assert_eq!(check(&[], &[c], std::slice::from_ref(&pvc)), []);
        // volumeDevice-volumeMount-path-conflict: reported from both sides.
        let c = container(json!({"name": "a", "image": "x",
            "volumeDevices": [{"name": "disk0", "devicePath": "/home/admin/log"}],
            "volumeMounts": [{"name": "log", "mountPath": "/home/admin/log"}]}));
        let errs = check(&[], &[c], &[pvc, log.clone()]);
        assert_eq!(
            paths(&errs),
            [
                "spec.containers[0].volumeMounts[0].mountPath",
                "spec.containers[0].volumeDevices[0].devicePath",
            ]
        );
        // A device on a non-PVC volume, a duplicate, an empty path and a backstep.
        let c = container(json!({"name": "a", "image": "x", "volumeDevices": [
            {"name": "log", "devicePath": "/dev/a"},
            {"name": "log", "devicePath": "/dev/a"},
            {"name": "log", "devicePath": ""},
            {"name": "log", "devicePath": "/dev/../x"}
        ]}));
        let errs = check(&[], &[c], &[log]);
        let messages: Vec<&str> = errs.iter().map(|e| e.message.as_str()).collect();
        assert!(messages.contains(
            &"can only use volume source type of PersistentVolumeClaim or Ephemeral for block mode"
        ));
        assert!(messages.contains(&"must be unique"));
        assert!(messages.contains(&"can not contain backsteps ('..')"));
        assert!(
            errs.iter()
                .any(|e| e.kind == ErrorKind::Required && e.path.ends_with("[2].devicePath"))
        );
    }

    #[test]
    fn volumes_need_a_valid_unique_name_and_exactly_one_source() {
        let errs = validate_volumes(
            &[
                volume(json!({"name": "test-volume"})),
                volume(
                    json!({"name": "a", "emptyDir": {}, "hostPath": {"path": "/x"}, "secret": {"secretName": "s"}}),
                ),
                volume(json!({"name": "a", "emptyDir": {}})),
                volume(json!({"name": "Bad.Name", "emptyDir": {}})),
                volume(json!({"name": "", "emptyDir": {}})),
            ],
            "spec.volumes",
        );
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec.volumes[0]: Required value: must specify a volume type",
                "spec.volumes[1].emptyDir: Forbidden: may not specify more than 1 volume type",
                "spec.volumes[1].secret: Forbidden: may not specify more than 1 volume type",
                r#"spec.volumes[2].name: Duplicate value: "a""#,
                r#"spec.volumes[3].name: Invalid value: "Bad.Name": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"#,
                "spec.volumes[4].name: Required value",
            ]
        );
    }

    #[test]
    fn volume_sources_are_checked() {
        let errs = validate_volumes(
            &[
                volume(json!({"name": "a", "hostPath": {"path": "", "type": "Pipe"}})),
                volume(json!({"name": "b", "secret": {"defaultMode": 1000}})),
                volume(json!({"name": "c", "configMap": {"name": "", "defaultMode": -1}})),
                volume(json!({"name": "d", "persistentVolumeClaim": {"claimName": ""}})),
                volume(json!({"name": "e", "downwardAPI": {"defaultMode": 512}})),
                volume(
                    json!({"name": "f", "projected": {"defaultMode": 420, "sources": [
                        {"serviceAccountToken": {"path": "", "expirationSeconds": 60}},
                        {"serviceAccountToken": {"path": "t", "expirationSeconds": 5_000_000_000_i64}},
                        {"serviceAccountToken": {"audience": "istio-ca", "expirationSeconds": 43200, "path": "istio-token"}}
                    ]}}),
                ),
                volume(json!({"name": "g", "hostPath": {"path": "/x", "type": ""}})),
            ],
            "spec.volumes",
        );
        assert_eq!(
            paths(&errs),
            [
                "spec.volumes[0].hostPath.path",
                "spec.volumes[0].hostPath.type",
                "spec.volumes[1].secret.secretName",
                "spec.volumes[1].secret.defaultMode",
                "spec.volumes[2].configMap.name",
                "spec.volumes[2].configMap.defaultMode",
                "spec.volumes[3].persistentVolumeClaim.claimName",
                "spec.volumes[4].downwardAPI.defaultMode",
                "spec.volumes[5].projected.sources[0].serviceAccountToken.path",
                "spec.volumes[5].projected.sources[0].serviceAccountToken.expirationSeconds",
                "spec.volumes[5].projected.sources[1].serviceAccountToken.expirationSeconds",
            ]
        );
        assert_eq!(
            errs[3].message,
            "must be a number between 0 and 0777 (octal), both inclusive"
        );
        assert_eq!(
            errs[9].message,
            "may not specify a duration less than 10 minutes"
        );
    }

    #[test]
    fn subscripted_paths_split() {
        assert_eq!(
            split_subscripted_path("metadata.labels['app']"),
            Some(("metadata.labels", "app"))
        );
        assert_eq!(split_subscripted_path("metadata.name"), None);
        assert_eq!(split_subscripted_path("metadata.labels['app'"), None);
    }
}
