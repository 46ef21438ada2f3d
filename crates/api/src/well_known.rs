//! Annotation, label and finalizer names that upstream OpenKruise components read and write.
//!
//! They are upstream's exact strings so existing tooling (dashboards, `kubectl` selectors,
//! scripts) keeps working when kruise-rs replaces kruise-manager and kruise-daemon.

/// The API group of every kind served here.
pub const GROUP: &str = "apps.kruise.io";
/// The version controllers work in; also the storage version.
pub const STORAGE_VERSION: &str = "v1beta1";
/// The older version, still served so existing manifests keep applying.
pub const LEGACY_VERSION: &str = "v1alpha1";

// --- SidecarSet ---------------------------------------------------------------------------------

/// On a SidecarSet: hash of its containers. On a Pod: JSON map of SidecarSet name to hash record.
pub const SIDECARSET_HASH: &str = "kruise.io/sidecarset-hash";
/// Same as [`SIDECARSET_HASH`], computed with every image blanked.
pub const SIDECARSET_HASH_WITHOUT_IMAGE: &str = "kruise.io/sidecarset-hash-without-image";
/// On a Pod: comma-joined, sorted names of the SidecarSets injected into it.
pub const SIDECARSET_INJECTED_LIST: &str = "kruise.io/sidecarset-injected-list";
/// On a Pod: JSON map of SidecarSet name to its in-place update state.
pub const SIDECARSET_INPLACE_UPDATE_STATE: &str = "kruise.io/sidecarset-inplace-update-state";
/// On a Pod: JSON map of hot-upgrade sidecar name to the container currently working.
pub const SIDECARSET_WORKING_HOTUPGRADE_CONTAINER: &str =
    "kruise.io/sidecarset-working-hotupgrade-container";
/// Prefix of the per-container hot-upgrade version annotation on a Pod.
pub const SIDECARSET_VERSION_PREFIX: &str = "version.sidecarset.kruise.io/";
/// Prefix of the per-container alternate hot-upgrade version annotation on a Pod.
pub const SIDECARSET_VERSION_ALT_PREFIX: &str = "versionalt.sidecarset.kruise.io/";
/// Suffix of the hot-upgrade twin that works first (`mesh` → `mesh-1`).
pub const HOT_UPGRADE_TWIN_SUFFIX_1: &str = "-1";
/// Suffix of the hot-upgrade twin that starts idle, on `hotUpgradeEmptyImage` (`mesh` → `mesh-2`).
pub const HOT_UPGRADE_TWIN_SUFFIX_2: &str = "-2";
/// Env var of each hot-upgrade twin: its own version, from the pod annotation
/// [`SIDECARSET_VERSION_PREFIX`]`<twin>` through the downward API.
pub const SIDECARSET_VERSION_ENV: &str = "SIDECARSET_VERSION";
/// Env var of each hot-upgrade twin: the other twin's version, from the pod annotation
/// [`SIDECARSET_VERSION_ALT_PREFIX`]`<twin>` through the downward API.
pub const SIDECARSET_VERSION_ALT_ENV: &str = "SIDECARSET_VERSION_ALT";
/// On a SidecarSet (kruise-rs only): `refuse` makes pods it matches be refused while it uses a
/// feature kruise-rs does not serve yet; without it such pods are admitted without it, with a
/// warning (`crates/sidecar/src/unsupported.rs`).
pub const UNSUPPORTED_FEATURES: &str = "kruise-rs.io/unsupported-features";
/// Pod condition type whose message is a JSON map of SidecarSet name to "can upgrade".
pub const SIDECARSET_UPGRADABLE_CONDITION: &str = "SidecarSetUpgradable";
/// On a ControllerRevision or a pre-download ImagePullJob: the SidecarSet it belongs to.
pub const SIDECARSET_NAME_LABEL: &str = "kruise.io/sidecarset-name";
/// Label on a pre-download ImagePullJob: the sidecar container whose new image it pulls.
pub const SIDECARSET_CONTAINER_LABEL: &str = "apps.kruise.io/sidecarset-container";
/// On a ControllerRevision (v1beta1) or on the SidecarSet itself (v1alpha1): the custom version.
pub const SIDECARSET_CUSTOM_VERSION_LABEL: &str = "apps.kruise.io/sidecarset-custom-version";
/// On a SidecarSet: `"true"` marks a canary SidecarSet.
pub const SIDECARSET_CANARY: &str = "apps.kruise.io/sidecarset-canary";
/// On a canary SidecarSet: the name of the SidecarSet it is a canary of.
pub const SIDECARSET_BASE: &str = "apps.kruise.io/sidecarset-base";
/// The Namespace label v1alpha1's `spec.namespace` is matched against.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

// --- Image pre-download ---------------------------------------------------------------------------

/// ImagePullJob annotation (kruise-rs's): the most nodes pulling from the job's registry host at
/// once, across all jobs, that this job starts nodes under; lowers `--max-pulls-per-registry`.
pub const MAX_PULLS_PER_REGISTRY: &str = "kruise-rs.io/max-pulls-per-registry";

/// On a workload or SidecarSet: how many nodes pre-download at once.
pub const IMAGE_PREDOWNLOAD_PARALLELISM: &str = "apps.kruise.io/image-predownload-parallelism";
/// On a workload or SidecarSet: per-pull timeout in seconds.
pub const IMAGE_PREDOWNLOAD_TIMEOUT_SECONDS: &str =
    "apps.kruise.io/image-predownload-timeout-seconds";
/// On a workload or SidecarSet: updated-and-ready pods (integer or percent) before pre-download starts.
pub const IMAGE_PREDOWNLOAD_MIN_UPDATED_READY_PODS: &str =
    "apps.kruise.io/image-predownload-min-updated-ready-pods";
/// On a ControllerRevision: pre-download jobs were created for it (upstream's spelling, "pre-pre").
pub const IMAGE_PREDOWNLOAD_CREATED: &str = "apps.kruise.io/pre-predownload-created";
/// On a ControllerRevision: pre-download was deliberately skipped for it.
pub const IMAGE_PREDOWNLOAD_IGNORED: &str = "apps.kruise.io/image-predownload-ignored";
/// On an ImagePullJob: the revision hash it pre-downloads for.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";

// --- ImagePullJob and NodeImage ---------------------------------------------------------------------

/// Finalizer on an ImagePullJob while it holds synced pull secrets.
pub const DELETION_PROTECTION_FINALIZER: &str = "apps.kruise.io/deletion-protection";
/// On a synced Secret: `namespace/name` of the Secret it copies.
pub const SECRET_SOURCE_KEY: &str = "imagepulljobs.kruise.io/source-key";
/// On a synced Secret: comma-joined sorted `namespace/name` of the jobs using it.
pub const SECRET_REFERENCES: &str = "imagepulljobs.kruise.io/references";
/// On an ImagePullJob (kruise-rs only): the uid of each pull Secret its author was checked
/// against, `name=uid` comma-joined and sorted by name (`crates/api/src/pull_secret_pins.rs`). The
/// manager writes an entry at the job's first claim of a Secret and never changes one; a
/// Secret whose uid differs is not given to the daemons. Changing or removing an entry is a new
/// check: the webhook asks whether whoever does it may read that Secret (decision 0029).
pub const PULL_SECRET_UIDS: &str = "kruise-rs.io/pull-secret-uids";
/// On a synced Secret (kruise-rs only): the uid of the source Secret its data came from; the
/// jobs it lists were checked against that one.
pub const SECRET_SOURCE_UID: &str = "kruise-rs.io/source-uid";
/// On a synced Secret: `batch` for shared copies.
pub const SECRET_MODE: &str = "imagepulljobs.kruise.io/mode";
/// The `mode` value of shared secret copies.
pub const SECRET_MODE_BATCH: &str = "batch";
/// On a NodeImage: keep it even though no Node of that name exists (tests, virtual nodes).
pub const FAKE_NODEIMAGE: &str = "apps.kruise.io/fake-nodeimage";
/// Node label value (`type: virtual-kubelet`) of nodes the NodeImage controller ignores.
pub const VIRTUAL_KUBELET_TYPE: &str = "virtual-kubelet";
/// CRI sandbox annotation the daemon adds to every `PullImage` call.
pub const PULLING_IMAGE_BY: &str = "apps.kruise.io/pulling-image-by";
/// Value of [`PULLING_IMAGE_BY`].
pub const PULLING_IMAGE_BY_VALUE: &str = "kruise-daemon";
