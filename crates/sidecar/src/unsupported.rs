//! SidecarSet features kruise-rs does not serve, and what a new pod does about them.
//!
//! [`FEATURES`] lists each such feature with its detector (which sidecar containers use it).
//! A pod matching a SidecarSet that uses one is admitted **without that SidecarSet**: the
//! others still inject, and the admission carries a warning ([`screen`]); the webhook also
//! records a Warning event on the SidecarSet and the controller sets its `UnsupportedFeatures`
//! condition. A SidecarSet annotated [`UNSUPPORTED_FEATURES`]`: refuse` keeps the old
//! behaviour: its pods are refused, naming the feature.
//!
//! A feature kruise-rs learns to serve leaves [`FEATURES`] (its entry and its detector).

use std::fmt;

use kruise_rs_api::sidecarset::{SidecarContainer, SidecarContainerUpgradeType, SidecarSetSpec};
pub use kruise_rs_api::well_known::UNSUPPORTED_FEATURES;

use super::hash::is_native_sidecar;
use super::revision::SelectedSidecarSet;

/// The value of [`UNSUPPORTED_FEATURES`] that refuses pods instead of skipping the SidecarSet.
pub const REFUSE: &str = "refuse";

/// A SidecarSet feature kruise-rs does not serve, and how to find it in a spec.
pub struct Feature {
    /// CamelCase, for a condition or event reason.
    pub name: &'static str,
    /// The field, as a user writes it.
    pub field: &'static str,
    /// Why kruise-rs cannot serve it, after the field in messages ("which kruise-rs does not
    /// support yet").
    pub problem: &'static str,
    /// The names of the sidecar containers that use it.
    pub containers: fn(&SidecarSetSpec) -> Vec<String>,
}

/// The features kruise-rs does not serve. HotUpgrade itself is served
/// ([`super::hot_upgrade`]); a HotUpgrade sidecar without `hotUpgradeEmptyImage`, which
/// upstream admitted, is not: its idle twin would have no image and the apiserver would refuse
/// the pod.
pub const FEATURES: &[Feature] = &[Feature {
    name: "HotUpgradeWithoutEmptyImage",
    field: "upgradeStrategy.upgradeType HotUpgrade without upgradeStrategy.hotUpgradeEmptyImage",
    problem: "so its idle twin would have no image",
    containers: hot_upgrade_without_empty_image,
}];

/// Upstream honours HotUpgrade on containers and on native-sidecar init containers only.
fn hot_upgrade_without_empty_image(spec: &SidecarSetSpec) -> Vec<String> {
    let hot = |c: &&SidecarContainer| {
        c.upgrade_strategy.as_ref().and_then(|s| s.upgrade_type)
            == Some(SidecarContainerUpgradeType::HotUpgrade)
            && c.upgrade_strategy
                .as_ref()
                .and_then(|s| s.hot_upgrade_empty_image.as_deref())
                .is_none_or(str::is_empty)
    };
    let native = spec.init_containers.iter().filter(|c| is_native_sidecar(c));
    names(spec.containers.iter().chain(native).filter(hot))
}

fn names<'a>(containers: impl Iterator<Item = &'a SidecarContainer>) -> Vec<String> {
    containers.map(|c| c.container.name.clone()).collect()
}

/// One unsupported feature found in a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// [`Feature::name`].
    pub feature: &'static str,
    /// [`Feature::field`].
    pub field: &'static str,
    /// [`Feature::problem`].
    pub problem: &'static str,
    /// The sidecar containers that use it.
    pub containers: Vec<String>,
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plural = if self.containers.len() == 1 { "" } else { "s" };
        write!(
            f,
            "container{plural} {} use{} {}, {}",
            self.containers.join(", "),
            if plural.is_empty() { "s" } else { "" },
            self.field,
            self.problem
        )
    }
}

/// The unsupported features `spec` uses, in [`FEATURES`] order.
pub fn detect(spec: &SidecarSetSpec) -> Vec<Found> {
    FEATURES
        .iter()
        .filter_map(|f| {
            let containers = (f.containers)(spec);
            (!containers.is_empty()).then_some(Found {
                feature: f.name,
                field: f.field,
                problem: f.problem,
                containers,
            })
        })
        .collect()
}

/// Whether a SidecarSet's annotation value asks for its pods to be refused.
pub fn refuses(annotation: Option<&str>) -> bool {
    annotation.is_some_and(|v| v.trim().eq_ignore_ascii_case(REFUSE))
}

/// A SidecarSet left out of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub sidecarset: String,
    /// Never empty.
    pub found: Vec<Found>,
    /// Annotated [`UNSUPPORTED_FEATURES`]`: refuse`: the pod is refused instead.
    pub refuse: bool,
}

impl Skipped {
    /// The admission warning (or, when refusing, the denial message).
    pub fn message(&self) -> String {
        let what: Vec<String> = self.found.iter().map(Found::to_string).collect();
        if self.refuse {
            format!(
                "SidecarSet {}: {}; it is annotated {UNSUPPORTED_FEATURES}={REFUSE}, so its pods are refused",
                self.sidecarset,
                what.join("; ")
            )
        } else {
            format!(
                "SidecarSet {} was not injected: {}",
                self.sidecarset,
                what.join("; ")
            )
        }
    }
}

/// The SidecarSets selected for a new pod, split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Screened {
    /// The SidecarSets to inject, in the order given.
    pub inject: Vec<SelectedSidecarSet>,
    /// The others, in the order given.
    pub skipped: Vec<Skipped>,
}

impl Screened {
    /// The first skipped SidecarSet that asks for its pods to be refused.
    pub fn refusal(&self) -> Option<&Skipped> {
        self.skipped.iter().find(|s| s.refuse)
    }

    /// The admission warnings for the skipped SidecarSets.
    pub fn warnings(&self) -> Vec<String> {
        self.skipped.iter().map(Skipped::message).collect()
    }
}

/// Splits `selected` (each at the version to inject) into the SidecarSets kruise-rs can
/// inject and those using an unsupported feature. `refuse(name)` says whether SidecarSet
/// `name` is annotated to refuse its pods instead.
pub fn screen(selected: Vec<SelectedSidecarSet>, refuse: impl Fn(&str) -> bool) -> Screened {
    let mut out = Screened::default();
    for set in selected {
        let found = detect(&set.spec);
        if found.is_empty() {
            out.inject.push(set);
        } else {
            out.skipped.push(Skipped {
                refuse: refuse(&set.name),
                sidecarset: set.name,
                found,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
