//! JSON text exactly as Go's `encoding/json` writes kruise's structs.
//!
//! Two pod annotations and the SidecarSet hash are JSON text that upstream's kruise-manager
//! produces with `json.Marshal`. For a cluster to move between kruise-manager and kruise-rs
//! without every pod looking "changed", we must produce the same bytes. serde_json differs from Go
//! in three ways that matter here, and this module closes each gap:
//!
//! - **Field order.** Go writes struct fields in declaration order; serde_json's `Value` sorts
//!   them. The tables below (`SIDECAR_CONTAINER` and what it reaches) list every field of
//!   kruise's v1beta1 `SidecarContainer` and of core/v1 `Container` in Go's order (taken from
//!   `k8s.io/api` v0.36, a superset of the v0.32 upstream builds with; fields a version lacks are
//!   simply never present).
//! - **Zero values.** Go omits a field tagged `omitempty` only when it is the zero value of a
//!   non-struct type; a non-pointer struct is always written (`"resources":{}`), a pointer without
//!   `omitempty` is written as `null`, a required scalar as its zero value. Rust models all of
//!   these as `Option`, so each table entry records what Go does.
//! - **Strings.** Go escapes `<`, `>`, `&`, U+2028 and U+2029 (HTML-safe output); quantities are
//!   re-rendered in their canonical form (see `super::quantity`).
//!
//! Keys a table does not know (fields newer than these tables) are written after the known ones
//! in sorted order, so the output stays deterministic and still changes when they change.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use kruise_rs_api::quantity::go_quantity_text;

/// The Go type of a field, as far as its JSON encoding is concerned.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ty {
    Str,
    Int,
    Bool,
    /// `resource.Quantity`: a struct in Go (never omitted), written in canonical form.
    Quantity,
    /// `intstr.IntOrString`: a struct in Go (never omitted), written as a number or a string.
    IntOrString,
    Struct(&'static [Field]),
    Slice(&'static Ty),
    /// `map[string]T`, written with sorted keys.
    Map(&'static Ty),
}

/// One struct field: its JSON name, type, and the two tag facts that decide when Go omits it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    name: &'static str,
    ty: Ty,
    pointer: bool,
    omitempty: bool,
}

/// A value field tagged `omitempty`.
const fn opt(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        pointer: false,
        omitempty: true,
    }
}

/// A value field without `omitempty`: always written, as its zero value when unset.
const fn req(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        pointer: false,
        omitempty: false,
    }
}

/// A pointer field tagged `omitempty`: omitted only when nil.
const fn ptr(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        pointer: true,
        omitempty: true,
    }
}

/// A pointer field without `omitempty`: written as `null` when nil.
const fn ptr_req(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        pointer: true,
        omitempty: false,
    }
}

use Ty::{Bool, Int, IntOrString, Map as MapOf, Quantity, Slice, Str, Struct};

const STRINGS: Ty = Str;
const INTS: Ty = Int;

const CONTAINER_PORT: &[Field] = &[
    opt("name", Str),
    opt("hostPort", Int),
    req("containerPort", Int),
    opt("protocol", Str),
    opt("hostIP", Str),
];
/// `ConfigMapEnvSource` and `SecretEnvSource` (inline `LocalObjectReference` first).
const ENV_SOURCE_REF: &[Field] = &[opt("name", Str), ptr("optional", Bool)];
const ENV_FROM_SOURCE: &[Field] = &[
    opt("prefix", Str),
    ptr("configMapRef", Struct(ENV_SOURCE_REF)),
    ptr("secretRef", Struct(ENV_SOURCE_REF)),
];
const OBJECT_FIELD_SELECTOR: &[Field] = &[opt("apiVersion", Str), req("fieldPath", Str)];
const RESOURCE_FIELD_SELECTOR: &[Field] = &[
    opt("containerName", Str),
    req("resource", Str),
    opt("divisor", Quantity),
];
/// `ConfigMapKeySelector` and `SecretKeySelector`.
const KEY_SELECTOR: &[Field] = &[opt("name", Str), req("key", Str), ptr("optional", Bool)];
const FILE_KEY_SELECTOR: &[Field] = &[
    req("volumeName", Str),
    req("path", Str),
    req("key", Str),
    ptr("optional", Bool),
];
const ENV_VAR_SOURCE: &[Field] = &[
    ptr("fieldRef", Struct(OBJECT_FIELD_SELECTOR)),
    ptr("resourceFieldRef", Struct(RESOURCE_FIELD_SELECTOR)),
    ptr("configMapKeyRef", Struct(KEY_SELECTOR)),
    ptr("secretKeyRef", Struct(KEY_SELECTOR)),
    ptr("fileKeyRef", Struct(FILE_KEY_SELECTOR)),
];
const ENV_VAR: &[Field] = &[
    req("name", Str),
    opt("value", Str),
    ptr("valueFrom", Struct(ENV_VAR_SOURCE)),
];
const QUANTITIES: Ty = Quantity;
const RESOURCE_CLAIM: &[Field] = &[req("name", Str), opt("request", Str)];
const RESOURCE_REQUIREMENTS: &[Field] = &[
    opt("limits", MapOf(&QUANTITIES)),
    opt("requests", MapOf(&QUANTITIES)),
    opt("claims", Slice(&Struct(RESOURCE_CLAIM))),
];
const CONTAINER_RESIZE_POLICY: &[Field] = &[req("resourceName", Str), req("restartPolicy", Str)];
const RESTART_RULE_ON_EXIT_CODES: &[Field] = &[opt("operator", Str), opt("values", Slice(&INTS))];
const CONTAINER_RESTART_RULE: &[Field] = &[
    opt("action", Str),
    ptr("exitCodes", Struct(RESTART_RULE_ON_EXIT_CODES)),
];
const VOLUME_MOUNT: &[Field] = &[
    req("name", Str),
    opt("readOnly", Bool),
    ptr("recursiveReadOnly", Str),
    req("mountPath", Str),
    opt("subPath", Str),
    ptr("mountPropagation", Str),
    opt("subPathExpr", Str),
];
const VOLUME_DEVICE: &[Field] = &[req("name", Str), req("devicePath", Str)];
const EXEC_ACTION: &[Field] = &[opt("command", Slice(&STRINGS))];
const HTTP_HEADER: &[Field] = &[req("name", Str), req("value", Str)];
const HTTP_GET_ACTION: &[Field] = &[
    opt("path", Str),
    req("port", IntOrString),
    opt("host", Str),
    opt("scheme", Str),
    opt("httpHeaders", Slice(&Struct(HTTP_HEADER))),
];
const TCP_SOCKET_ACTION: &[Field] = &[req("port", IntOrString), opt("host", Str)];
const GRPC_ACTION: &[Field] = &[req("port", Int), ptr_req("service", Str)];
/// `Probe`: the inline `ProbeHandler` fields come first.
const PROBE: &[Field] = &[
    ptr("exec", Struct(EXEC_ACTION)),
    ptr("httpGet", Struct(HTTP_GET_ACTION)),
    ptr("tcpSocket", Struct(TCP_SOCKET_ACTION)),
    ptr("grpc", Struct(GRPC_ACTION)),
    opt("initialDelaySeconds", Int),
    opt("timeoutSeconds", Int),
    opt("periodSeconds", Int),
    opt("successThreshold", Int),
    opt("failureThreshold", Int),
    ptr("terminationGracePeriodSeconds", Int),
];
const SLEEP_ACTION: &[Field] = &[req("seconds", Int)];
const LIFECYCLE_HANDLER: &[Field] = &[
    ptr("exec", Struct(EXEC_ACTION)),
    ptr("httpGet", Struct(HTTP_GET_ACTION)),
    ptr("tcpSocket", Struct(TCP_SOCKET_ACTION)),
    ptr("sleep", Struct(SLEEP_ACTION)),
];
const LIFECYCLE: &[Field] = &[
    ptr("postStart", Struct(LIFECYCLE_HANDLER)),
    ptr("preStop", Struct(LIFECYCLE_HANDLER)),
    ptr("stopSignal", Str),
];
const CAPABILITIES: &[Field] = &[opt("add", Slice(&STRINGS)), opt("drop", Slice(&STRINGS))];
const SE_LINUX_OPTIONS: &[Field] = &[
    opt("user", Str),
    opt("role", Str),
    opt("type", Str),
    opt("level", Str),
];
const WINDOWS_OPTIONS: &[Field] = &[
    ptr("gmsaCredentialSpecName", Str),
    ptr("gmsaCredentialSpec", Str),
    ptr("runAsUserName", Str),
    ptr("hostProcess", Bool),
];
/// `SeccompProfile` and `AppArmorProfile`.
const PROFILE: &[Field] = &[req("type", Str), ptr("localhostProfile", Str)];
const SECURITY_CONTEXT: &[Field] = &[
    ptr("capabilities", Struct(CAPABILITIES)),
    ptr("privileged", Bool),
    ptr("seLinuxOptions", Struct(SE_LINUX_OPTIONS)),
    ptr("windowsOptions", Struct(WINDOWS_OPTIONS)),
    ptr("runAsUser", Int),
    ptr("runAsGroup", Int),
    ptr("runAsNonRoot", Bool),
    ptr("readOnlyRootFilesystem", Bool),
    ptr("allowPrivilegeEscalation", Bool),
    ptr("procMount", Str),
    ptr("seccompProfile", Struct(PROFILE)),
    ptr("appArmorProfile", Struct(PROFILE)),
];

const UPGRADE_STRATEGY: &[Field] = &[opt("upgradeType", Str), opt("hotUpgradeEmptyImage", Str)];
const SHARE_VOLUME_POLICY: &[Field] = &[opt("type", Str)];
const SOURCE_CONTAINER_NAME_SOURCE: &[Field] = &[ptr("fieldRef", Struct(OBJECT_FIELD_SELECTOR))];
const TRANSFER_ENV_VAR: &[Field] = &[
    opt("sourceContainerName", Str),
    ptr(
        "sourceContainerNameFrom",
        Struct(SOURCE_CONTAINER_NAME_SOURCE),
    ),
    opt("envName", Str),
    opt("envNames", Slice(&STRINGS)),
];
const RESOURCE_EXPRESSIONS: &[Field] = &[opt("cpu", Str), opt("memory", Str)];
const RESOURCES_EXPR: &[Field] = &[
    ptr("limits", Struct(RESOURCE_EXPRESSIONS)),
    ptr("requests", Struct(RESOURCE_EXPRESSIONS)),
];
const RESOURCES_POLICY: &[Field] = &[
    req("targetContainersMode", Str),
    opt("targetContainersNameRegex", Str),
    req("resourcesExpr", Struct(RESOURCES_EXPR)),
];

/// kruise v1beta1 `SidecarContainer`: the inline core/v1 `Container` (Go order), then Kruise's
/// fields. `upgradeStrategy` and `shareVolumePolicy` are non-pointer structs, so Go always
/// writes them, as `{}` when unset.
pub(crate) const SIDECAR_CONTAINER: &[Field] = &[
    req("name", Str),
    opt("image", Str),
    opt("command", Slice(&STRINGS)),
    opt("args", Slice(&STRINGS)),
    opt("workingDir", Str),
    opt("ports", Slice(&Struct(CONTAINER_PORT))),
    opt("envFrom", Slice(&Struct(ENV_FROM_SOURCE))),
    opt("env", Slice(&Struct(ENV_VAR))),
    opt("resources", Struct(RESOURCE_REQUIREMENTS)),
    opt("resizePolicy", Slice(&Struct(CONTAINER_RESIZE_POLICY))),
    ptr("restartPolicy", Str),
    opt("restartPolicyRules", Slice(&Struct(CONTAINER_RESTART_RULE))),
    opt("volumeMounts", Slice(&Struct(VOLUME_MOUNT))),
    opt("volumeDevices", Slice(&Struct(VOLUME_DEVICE))),
    ptr("livenessProbe", Struct(PROBE)),
    ptr("readinessProbe", Struct(PROBE)),
    ptr("startupProbe", Struct(PROBE)),
    ptr("lifecycle", Struct(LIFECYCLE)),
    opt("terminationMessagePath", Str),
    opt("terminationMessagePolicy", Str),
    opt("imagePullPolicy", Str),
    ptr("securityContext", Struct(SECURITY_CONTEXT)),
    opt("stdin", Bool),
    opt("stdinOnce", Bool),
    opt("tty", Bool),
    opt("podInjectPolicy", Str),
    opt("upgradeStrategy", Struct(UPGRADE_STRATEGY)),
    opt("shareVolumePolicy", Struct(SHARE_VOLUME_POLICY)),
    ptr("shareVolumeDevicePolicy", Struct(SHARE_VOLUME_POLICY)),
    opt("transferEnv", Slice(&Struct(TRANSFER_ENV_VAR))),
    ptr("resourcesPolicy", Struct(RESOURCES_POLICY)),
];

/// The type of a slice of [`SIDECAR_CONTAINER`]s, for `"containers"` / `"initContainers"`.
pub(crate) const SIDECAR_CONTAINERS: Ty = Slice(&Struct(SIDECAR_CONTAINER));

/// Writes `value` (a serde_json rendering of a Go value of type `ty`) the way `json.Marshal`
/// writes the Go value.
pub(crate) fn write_typed(out: &mut String, ty: Ty, value: Option<&Value>) {
    let value = value.filter(|v| !v.is_null());
    match (ty, value) {
        (Ty::Str, None) => out.push_str("\"\""),
        (Ty::Int | Ty::IntOrString, None) => out.push('0'),
        (Ty::Bool, None) => out.push_str("false"),
        (Ty::Quantity, None) => out.push_str("\"0\""),
        (Ty::Slice(_) | Ty::Map(_), None) => out.push_str("null"),
        (Ty::Struct(fields), None) => write_struct(out, fields, &Map::new()),
        (Ty::Quantity, Some(Value::String(q))) => {
            // Go re-renders a quantity it decoded; one it could not decode would have failed the
            // whole object, so keeping the text is the only deterministic choice left.
            let text = go_quantity_text(q);
            write_string(out, text.as_deref().unwrap_or(q));
        }
        (Ty::Struct(fields), Some(Value::Object(map))) => write_struct(out, fields, map),
        (Ty::Slice(item), Some(Value::Array(items))) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if v.is_null() {
                    out.push_str("null");
                } else {
                    write_typed(out, *item, Some(v));
                }
            }
            out.push(']');
        }
        (Ty::Map(item), Some(Value::Object(map))) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_typed(out, *item, map.get(k));
            }
            out.push('}');
        }
        // A shape the table does not expect (or a plain scalar): Go would write it as it is.
        (_, Some(v)) => write_generic(out, v),
    }
}

/// Whether Go's `omitempty` drops this non-pointer value.
fn is_go_empty(ty: Ty, value: Option<&Value>) -> bool {
    match ty {
        // Structs (including Quantity and IntOrString) are never "empty" to encoding/json.
        Ty::Struct(_) | Ty::Quantity | Ty::IntOrString => false,
        _ => match value {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Bool(b)) => !b,
            Some(Value::Number(n)) => n.as_f64() == Some(0.0),
            Some(Value::Array(a)) => a.is_empty(),
            Some(Value::Object(o)) => o.is_empty(),
        },
    }
}

fn write_struct(out: &mut String, fields: &[Field], map: &Map<String, Value>) {
    out.push('{');
    let mut first = true;
    let mut sep = |out: &mut String| {
        if !first {
            out.push(',');
        }
        first = false;
    };
    for field in fields {
        let value = map.get(field.name).filter(|v| !v.is_null());
        let omit = if field.pointer {
            value.is_none() && field.omitempty
        } else {
            field.omitempty && is_go_empty(field.ty, value)
        };
        if omit {
            continue;
        }
        sep(out);
        write_string(out, field.name);
        out.push(':');
        if field.pointer && value.is_none() {
            out.push_str("null");
        } else {
            write_typed(out, field.ty, value);
        }
    }
    let mut unknown: Vec<&String> = map
        .keys()
        .filter(|k| !fields.iter().any(|f| f.name == k.as_str()))
        .collect();
    unknown.sort();
    for key in unknown {
        if let Some(v) = map.get(key) {
            sep(out);
            write_string(out, key);
            out.push(':');
            write_generic(out, v);
        }
    }
    out.push('}');
}

/// Any JSON value, written as Go writes a `map[string]interface{}` tree: sorted keys, compact,
/// HTML-safe strings.
pub(crate) fn write_generic(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_generic(out, v);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                if let Some(v) = map.get(k) {
                    write_generic(out, v);
                }
            }
            out.push('}');
        }
    }
}

/// A JSON string literal as Go (1.22+) writes it: short escapes for `\b \f \n \r \t`, `\u00XX`
/// for other control characters, and `<`, `>`, `&`, U+2028, U+2029 escaped for HTML safety.
pub(crate) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Rewrites serde_json's compact output with Go's HTML-safe escapes. Sound because `<`, `>`, `&`,
/// U+2028 and U+2029 can only occur inside string literals of compact JSON, and serde_json
/// already escapes everything else exactly as Go does.
pub fn html_escape_compact_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(v: Value) -> String {
        let mut out = String::new();
        write_typed(&mut out, Struct(SIDECAR_CONTAINER), Some(&v));
        out
    }

    #[test]
    fn a_minimal_container_gets_gos_always_written_structs() {
        assert_eq!(
            container(json!({"name": "c", "image": "i"})),
            r#"{"name":"c","image":"i","resources":{},"upgradeStrategy":{},"shareVolumePolicy":{}}"#
        );
    }

    #[test]
    fn fields_come_in_go_declaration_order_not_alphabetical() {
        let out = container(json!({
            "tty": true,
            "name": "c",
            "env": [{"value": "v", "name": "A"}],
            "args": ["x"],
            "command": ["y"],
            "podInjectPolicy": "AfterAppContainer",
        }));
        assert_eq!(
            out,
            r#"{"name":"c","command":["y"],"args":["x"],"env":[{"name":"A","value":"v"}],"resources":{},"tty":true,"podInjectPolicy":"AfterAppContainer","upgradeStrategy":{},"shareVolumePolicy":{}}"#
        );
    }

    #[test]
    fn omitempty_drops_zero_values_but_pointers_keep_them() {
        let out = container(json!({
            "name": "c",
            "image": "",
            "stdin": false,
            "command": [],
            "securityContext": {"privileged": false, "runAsUser": 0},
        }));
        assert_eq!(
            out,
            r#"{"name":"c","resources":{},"securityContext":{"privileged":false,"runAsUser":0},"upgradeStrategy":{},"shareVolumePolicy":{}}"#
        );
    }

    #[test]
    fn required_fields_get_their_zero_value_and_nil_pointers_without_omitempty_null() {
        let out = container(json!({
            "name": "c",
            "livenessProbe": {"grpc": {"port": 8080}},
            "env": [{"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}],
        }));
        assert!(
            out.contains(r#""grpc":{"port":8080,"service":null}"#),
            "{out}"
        );
        assert!(
            out.contains(r#""resourceFieldRef":{"resource":"limits.cpu","divisor":"0"}"#),
            "{out}"
        );
    }

    #[test]
    fn quantities_are_canonical_and_resource_maps_sorted() {
        let out = container(json!({
            "name": "c",
            "resources": {"limits": {"memory": "1024Mi", "cpu": "0.5"}},
        }));
        assert!(
            out.contains(r#""resources":{"limits":{"cpu":"500m","memory":"1Gi"}}"#),
            "{out}"
        );
    }

    #[test]
    fn unknown_fields_follow_the_known_ones_sorted() {
        let out = container(json!({"name": "c", "zeta": 1, "alpha": {"b": 1, "a": 2}}));
        assert_eq!(
            out,
            r#"{"name":"c","resources":{},"upgradeStrategy":{},"shareVolumePolicy":{},"alpha":{"a":2,"b":1},"zeta":1}"#
        );
    }

    #[test]
    fn strings_are_escaped_like_go() {
        // Expected text produced by Go 1.26 `json.Marshal`.
        let mut out = String::new();
        write_string(
            &mut out,
            "a<b>&c\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}\"\\ \u{2028}\u{2029} é",
        );
        assert_eq!(
            out,
            "\"a\\u003cb\\u003e\\u0026c\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f}\\\"\\\\ \\u2028\\u2029 é\""
        );
    }

    #[test]
    fn html_escaping_serde_output_matches_write_string() {
        let s = "x<y>&z\u{2028}\u{1}\"";
        let mut go = String::new();
        write_string(&mut go, s);
        let serde = serde_json::to_string(s).expect("a string serializes");
        assert_eq!(html_escape_compact_json(&serde), go);
    }

    #[test]
    fn generic_values_sort_keys_at_every_level() {
        let mut out = String::new();
        write_generic(&mut out, &json!({"b": [{"d": 1, "c": null}], "a": true}));
        assert_eq!(out, r#"{"a":true,"b":[{"c":null,"d":1}]}"#);
    }
}
