//! SidecarSet hot upgrade: the two twin containers of a `HotUpgrade` sidecar, and the pod
//! annotations that say which twin works and which version each runs. Pure, in upstream's
//! names and bytes, so pods that upstream's webhook injected are read the same way.
//!
//! Injection (`super::injection`) builds the twins with `expand`; the controller reads the
//! annotations to upgrade one twin and later reset the other
//! (`controllers::sidecarset::twin_flip`).
//!
//! # The shape of a hot-upgrade sidecar in a pod
//!
//! A sidecar `mesh` with `upgradeStrategy.upgradeType: HotUpgrade` becomes two containers:
//!
//! - `mesh-1`: the sidecar as written (image included); the twin that works first;
//! - `mesh-2`: the same container on `upgradeStrategy.hotUpgradeEmptyImage`, idle.
//!
//! Each twin gets two env vars read through the downward API from pod annotations:
//! `SIDECARSET_VERSION` from `version.sidecarset.kruise.io/<twin>` and `SIDECARSET_VERSION_ALT`
//! from `versionalt.sidecarset.kruise.io/<twin>`. At injection `mesh-1` has version `"1"` and alt
//! `"0"`, `mesh-2` version `"0"` and alt `"1"` (`"0"` means "on the empty image"). The controller
//! later writes the SidecarSet's `resourceVersion` there. The pod annotation
//! `kruise.io/sidecarset-working-hotupgrade-container` is a JSON object from sidecar name to the
//! working twin, over every hot-upgrade sidecar in the pod: `{"mesh":"mesh-1"}`.
//!
//! Upstream applies this to `spec.containers` sidecars and to native-sidecar init containers
//! (`restartPolicy: Always`), after the env and volume merging of injection: the twins are
//! built from the sidecar as it would be injected.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};

use kruise_rs_api::sidecarset::{SidecarContainer, SidecarContainerUpgradeType};
use kruise_rs_api::well_known::{
    HOT_UPGRADE_TWIN_SUFFIX_1, HOT_UPGRADE_TWIN_SUFFIX_2, SIDECARSET_VERSION_ALT_ENV,
    SIDECARSET_VERSION_ALT_PREFIX, SIDECARSET_VERSION_ENV, SIDECARSET_VERSION_PREFIX,
    SIDECARSET_WORKING_HOTUPGRADE_CONTAINER,
};

use super::gojson;
use super::hash::is_native_sidecar;

/// The version annotation value of a twin injected working (upstream: "first injected, not
/// upgraded yet").
pub(crate) const INJECTED_VERSION: &str = "1";
/// The version annotation value of a twin on the empty image.
pub(crate) const EMPTY_VERSION: &str = "0";

/// Why the twins of a sidecar cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HotUpgradeError {
    /// Upstream neither validates nor defaults `hotUpgradeEmptyImage`; it injects the idle twin
    /// with an empty image, which the apiserver then refuses with a message about the pod, not
    /// the SidecarSet. We name the field instead.
    #[error(
        "sidecar container {0} uses upgradeStrategy.upgradeType HotUpgrade without \
         upgradeStrategy.hotUpgradeEmptyImage: the idle twin would have no image"
    )]
    MissingEmptyImage(String),
}

/// Which of the two twins a container is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Twin {
    /// `<name>-1`: works first after injection.
    First,
    /// `<name>-2`: starts idle, on the empty image.
    Second,
}

impl Twin {
    /// The suffix this twin's container name carries.
    pub fn suffix(self) -> &'static str {
        match self {
            Twin::First => HOT_UPGRADE_TWIN_SUFFIX_1,
            Twin::Second => HOT_UPGRADE_TWIN_SUFFIX_2,
        }
    }

    /// The other twin.
    pub fn other(self) -> Twin {
        match self {
            Twin::First => Twin::Second,
            Twin::Second => Twin::First,
        }
    }
}

/// Whether the sidecar is upgraded by swapping twins (`upgradeType: HotUpgrade`).
pub fn is_hot_upgrade(sidecar: &SidecarContainer) -> bool {
    sidecar
        .upgrade_strategy
        .as_ref()
        .and_then(|s| s.upgrade_type)
        == Some(SidecarContainerUpgradeType::HotUpgrade)
}

/// The container name of one twin of the sidecar `sidecar`: `mesh` → `mesh-1` / `mesh-2`.
pub fn twin_name(sidecar: &str, twin: Twin) -> String {
    format!("{sidecar}{}", twin.suffix())
}

/// Both twin names of the sidecar `sidecar`, first then second.
pub fn twin_names(sidecar: &str) -> [String; 2] {
    [
        twin_name(sidecar, Twin::First),
        twin_name(sidecar, Twin::Second),
    ]
}

/// Which twin of the sidecar `sidecar` the container `container` is, if it is one.
pub fn twin_of(container: &str, sidecar: &str) -> Option<Twin> {
    let suffix = container.strip_prefix(sidecar)?;
    [Twin::First, Twin::Second]
        .into_iter()
        .find(|t| t.suffix() == suffix)
}

/// Whether the container `container` is one of the two twins of the sidecar `sidecar`
/// (`mesh-1` or `mesh-2` for `mesh`; not `mesh` itself, not `mesh-10`). For the controller's
/// ownership check: a pod owns a hot-upgrade sidecar through its twins, not its name.
pub fn is_twin_of(container: &str, sidecar: &str) -> bool {
    twin_of(container, sidecar).is_some()
}

/// The pod annotation holding the twin `container`'s version: `version.sidecarset.kruise.io/mesh-1`.
pub(crate) fn version_annotation(container: &str) -> String {
    format!("{SIDECARSET_VERSION_PREFIX}{container}")
}

/// The pod annotation holding the other twin's version, as seen by `container`:
/// `versionalt.sidecarset.kruise.io/mesh-1`.
pub(crate) fn version_alt_annotation(container: &str) -> String {
    format!("{SIDECARSET_VERSION_ALT_PREFIX}{container}")
}

/// The two env vars a twin named `container` gets, in upstream's order: `SIDECARSET_VERSION`
/// then `SIDECARSET_VERSION_ALT`, each a downward-API field reference to its annotation
/// (`metadata.annotations['version.sidecarset.kruise.io/mesh-1']`). `apiVersion` is left out,
/// as upstream's webhook leaves it; the apiserver defaults it to `v1`.
pub(crate) fn version_env(container: &str) -> [EnvVar; 2] {
    let field = |name: &str, annotation: String| EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: format!("metadata.annotations['{annotation}']"),
            }),
            ..Default::default()
        }),
    };
    [
        field(SIDECARSET_VERSION_ENV, version_annotation(container)),
        field(
            SIDECARSET_VERSION_ALT_ENV,
            version_alt_annotation(container),
        ),
    ]
}

/// The two containers and the version annotations a hot-upgrade sidecar injects.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Twins {
    /// `<name>-1`, the sidecar's own image: the working twin.
    pub working: SidecarContainer,
    /// `<name>-2`, on `hotUpgradeEmptyImage`: the idle twin.
    pub idle: SidecarContainer,
    /// The four version annotations (`version…` and `versionalt…` of each twin).
    pub annotations: BTreeMap<String, String>,
}

impl Twins {
    /// The working-container entry this sidecar adds to
    /// `kruise.io/sidecarset-working-hotupgrade-container`: (sidecar name, working twin name).
    pub(crate) fn working_entry(&self, sidecar: &str) -> (String, String) {
        (sidecar.to_owned(), self.working.container.name.clone())
    }
}

/// The twins of a hot-upgrade sidecar at injection: both copies of `sidecar` (as injection
/// built it, env and mounts merged), renamed `-1` and `-2`, the second on the empty image, each
/// with [`version_env`] appended to its env; and their version annotations (`-1`: `"1"`/`"0"`,
/// `-2`: `"0"`/`"1"`). The caller records `-1` as working with [`working_annotation`].
pub(crate) fn inject_twins(sidecar: &SidecarContainer) -> Result<Twins, HotUpgradeError> {
    let name = &sidecar.container.name;
    let empty_image = sidecar
        .upgrade_strategy
        .as_ref()
        .and_then(|s| s.hot_upgrade_empty_image.as_deref())
        .filter(|image| !image.is_empty())
        .ok_or_else(|| HotUpgradeError::MissingEmptyImage(name.clone()))?;
    let twin = |which: Twin, image: Option<String>| {
        let mut c = sidecar.clone();
        c.container.name = twin_name(name, which);
        c.container.image = image;
        c.container
            .env
            .get_or_insert_with(Vec::new)
            .extend(version_env(&c.container.name));
        c
    };
    let working = twin(Twin::First, sidecar.container.image.clone());
    let idle = twin(Twin::Second, Some(empty_image.to_owned()));
    let annotations = BTreeMap::from([
        (
            version_annotation(&working.container.name),
            INJECTED_VERSION.to_owned(),
        ),
        (
            version_alt_annotation(&working.container.name),
            EMPTY_VERSION.to_owned(),
        ),
        (
            version_annotation(&idle.container.name),
            EMPTY_VERSION.to_owned(),
        ),
        (
            version_alt_annotation(&idle.container.name),
            INJECTED_VERSION.to_owned(),
        ),
    ]);
    Ok(Twins {
        working,
        idle,
        annotations,
    })
}

/// Whether injection replaces this sidecar by twins: a `HotUpgrade` container, or a
/// `HotUpgrade` native-sidecar init container (`restartPolicy: Always`); a plain init container
/// is injected as written whatever its upgrade type (upstream's rule).
pub fn injects_twins(sidecar: &SidecarContainer, init_container: bool) -> bool {
    is_hot_upgrade(sidecar) && (!init_container || is_native_sidecar(sidecar))
}

/// One SidecarSet's sidecars (containers, or init containers), as injection adds them.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Expansion {
    /// The sidecars in order, each hot-upgrade one replaced by its twins (`-1` then `-2`).
    pub containers: Vec<SidecarContainer>,
    /// Version annotations of every twin, and, when there is at least one hot-upgrade
    /// sidecar, `kruise.io/sidecarset-working-hotupgrade-container` for the whole `working` map.
    pub annotations: BTreeMap<String, String>,
}

/// The sidecars of one list (`init_container` says which) as injection adds them: each one that
/// [`injects_twins`] becomes its twins, the others stay; `working` (the pod's working map,
/// carried across the SidecarSets injected into one pod, as upstream does) gets
/// `<name>` → `<name>-1` for each, and the annotation is written from all of it.
pub(crate) fn expand(
    sidecars: impl IntoIterator<Item = SidecarContainer>,
    init_container: bool,
    working: &mut BTreeMap<String, String>,
) -> Result<Expansion, HotUpgradeError> {
    let mut out = Expansion::default();
    let mut any = false;
    for sidecar in sidecars {
        if !injects_twins(&sidecar, init_container) {
            out.containers.push(sidecar);
            continue;
        }
        let twins = inject_twins(&sidecar)?;
        let (name, twin) = twins.working_entry(&sidecar.container.name);
        working.insert(name, twin);
        out.annotations.extend(twins.annotations);
        out.containers.push(twins.working);
        out.containers.push(twins.idle);
        any = true;
    }
    if any {
        out.annotations.insert(
            SIDECARSET_WORKING_HOTUPGRADE_CONTAINER.to_owned(),
            working_annotation(working),
        );
    }
    Ok(out)
}

/// The value of `kruise.io/sidecarset-working-hotupgrade-container` for the map sidecar name →
/// working twin, in Go's `json.Marshal` bytes (keys sorted, compact, HTML-safe escapes):
/// `{"envoy":"envoy-2","mesh":"mesh-1"}`. Upstream writes the whole map, entries of earlier
/// SidecarSets and of the pod's existing annotation included.
pub(crate) fn working_annotation(working: &BTreeMap<String, String>) -> String {
    let mut out = String::from("{");
    for (i, (sidecar, twin)) in working.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        gojson::write_string(&mut out, sidecar);
        out.push(':');
        gojson::write_string(&mut out, twin);
    }
    out.push('}');
    out
}

/// The sidecar name → working twin map read from a pod's annotations, as upstream reads it:
/// no annotation, a value that is not JSON, or JSON that is not an object reads as empty; in an
/// object, entries whose value is not a string are skipped (Go skips them too, keeping the
/// others; Go reads a `null` value as `""`, kruise-rs as absent).
pub fn working_twins(raw: Option<&str>) -> BTreeMap<String, String> {
    let Some(raw) = raw else {
        return BTreeMap::new();
    };
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::Object(map)) => map
            .into_iter()
            .filter_map(|(k, v)| match v {
                serde_json::Value::String(s) => Some((k, s)),
                _ => None,
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// The working and the other twin of a hot-upgrade sidecar in a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwinRoles {
    /// The twin recorded as working.
    pub working: String,
    /// The other: idle on the empty image, or, mid-upgrade, the older version still running.
    pub other: String,
}

/// Which twin of `sidecar` works, by upstream's rule (`GetPodHotUpgradeContainers`): `-1` if
/// the working map names `<sidecar>-1`, otherwise `-2`, including when the map has no entry
/// for it or names something else (the controller owns a pod only with an entry: [`pod_has_twins`]).
pub fn twin_roles(sidecar: &str, working: &BTreeMap<String, String>) -> TwinRoles {
    let [first, second] = twin_names(sidecar);
    if working.get(sidecar) == Some(&first) {
        TwinRoles {
            working: first,
            other: second,
        }
    } else {
        TwinRoles {
            working: second,
            other: first,
        }
    }
}

/// The versions one twin reads through its env, from the pod's annotations.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct TwinVersions<'a> {
    /// `version.sidecarset.kruise.io/<twin>`: `"0"` on the empty image, `"1"` as injected,
    /// else the SidecarSet `resourceVersion` it was upgraded at.
    pub(crate) version: Option<&'a str>,
    /// `versionalt.sidecarset.kruise.io/<twin>`: the other twin's version.
    pub(crate) alt: Option<&'a str>,
}

#[cfg(test)]
impl TwinVersions<'_> {
    /// Whether the annotations record this twin as on the empty image.
    pub(crate) fn is_empty(&self) -> bool {
        self.version == Some(EMPTY_VERSION)
    }
}

/// The version annotations of the twin `container`.
#[cfg(test)]
pub(crate) fn twin_versions<'a>(
    container: &str,
    annotations: Option<&'a BTreeMap<String, String>>,
) -> TwinVersions<'a> {
    let get = |key: String| annotations.and_then(|a| a.get(&key)).map(String::as_str);
    TwinVersions {
        version: get(version_annotation(container)),
        alt: get(version_alt_annotation(container)),
    }
}

/// Records in a pod's annotations that the twin `upgraded` of `sidecar` got the SidecarSet's
/// image at `resource_version` (the SidecarSet's `metadata.resourceVersion`), as upstream's
/// controller does in the same pod update as the image change: the working map names
/// `upgraded`; `version.<upgraded>` = `resource_version`; `versionalt.<upgraded>` = the other
/// twin's version (`""` when it has none, as upstream copies a missing value);
/// `versionalt.<other>` = `resource_version`. Several
/// hot sidecars of one pod are recorded one after the other on the same map, as upstream does.
pub fn record_upgrade(
    annotations: &mut BTreeMap<String, String>,
    sidecar: &str,
    upgraded: Twin,
    resource_version: &str,
) {
    let new = twin_name(sidecar, upgraded);
    let old = twin_name(sidecar, upgraded.other());
    let mut working = working_twins(
        annotations
            .get(SIDECARSET_WORKING_HOTUPGRADE_CONTAINER)
            .map(String::as_str),
    );
    working.insert(sidecar.to_owned(), new.clone());
    annotations.insert(
        SIDECARSET_WORKING_HOTUPGRADE_CONTAINER.to_owned(),
        working_annotation(&working),
    );
    let old_version = annotations
        .get(&version_annotation(&old))
        .cloned()
        .unwrap_or_default();
    annotations.insert(version_annotation(&new), resource_version.to_owned());
    annotations.insert(version_alt_annotation(&new), old_version);
    annotations.insert(version_alt_annotation(&old), resource_version.to_owned());
}

/// Records in a pod's annotations that the other twin of a hot-upgrade sidecar went back to the
/// empty image (upstream's flip): `version.<other>` = `"0"`, `versionalt.<working>` = `"0"`.
///
pub fn record_flip(annotations: &mut BTreeMap<String, String>, roles: &TwinRoles) {
    annotations.insert(version_annotation(&roles.other), EMPTY_VERSION.to_owned());
    annotations.insert(
        version_alt_annotation(&roles.working),
        EMPTY_VERSION.to_owned(),
    );
}

/// Whether a pod holds a hot-upgrade sidecar the way upstream's controller requires before it
/// counts the pod (`IsPodConsistentWithSidecarSet`): both twins among `containers` and an
/// entry for `sidecar` in the working map (whatever it names).
pub fn pod_has_twins<'a>(
    sidecar: &str,
    containers: impl IntoIterator<Item = &'a str>,
    working: &BTreeMap<String, String>,
) -> bool {
    if !working.contains_key(sidecar) {
        return false;
    }
    let (mut first, mut second) = (false, false);
    for c in containers {
        match twin_of(c, sidecar) {
            Some(Twin::First) => first = true,
            Some(Twin::Second) => second = true,
            None => {}
        }
    }
    first && second
}

#[cfg(test)]
mod tests;
