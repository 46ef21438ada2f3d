//! Bounds on the durations and counts users give the image-pull kinds (ImagePullJob,
//! ImageListPullJob, NodeImage): in the CRD schemas, in the webhook (which names the field),
//! and applied again, as the nearest bound, by the manager and the daemon when they read a
//! stored object, which may predate them (decision 0019).
//!
//! Each bound is far beyond what a pull needs, so a sane spec never meets one; what they rule
//! out is the number that overflows a clock or keeps a node retrying for years.

/// The most pull Secrets one object may name: an ImagePullJob's or ImageListPullJob's
/// `spec.pullSecrets`, a SidecarSet's `spec.imagePullSecrets`. The webhook asks one
/// SubjectAccessReview per Secret (per namespace for a SidecarSet) and must answer within its
/// 10 s timeout; 16 reviews are two rounds of the eight it sends at once. Pods name one to three;
/// upstream has no bound (decision 0026 has the measurement).
pub const MAX_PULL_SECRETS: usize = 16;

/// `pullPolicy.timeoutSeconds`: one attempt takes at least a second and at most a day.
pub const MIN_TIMEOUT_SECONDS: i32 = 1;
pub const MAX_TIMEOUT_SECONDS: i32 = 86_400;

/// `pullPolicy.backoffLimit`: retries after the first attempt. A negative count is refused;
/// one stored before is read as upstream reads it, as the default 3.
pub const MIN_BACKOFF_LIMIT: i32 = 0;
pub const MAX_BACKOFF_LIMIT: i32 = 1_000;

/// `activeDeadlineSeconds` (a job's `completionPolicy`, a NodeImage tag's `pullPolicy`): at
/// least a second, at most 365 days.
pub const MIN_ACTIVE_DEADLINE_SECONDS: i64 = 1;
pub const MAX_ACTIVE_DEADLINE_SECONDS: i64 = 365 * 86_400;

/// A job's `completionPolicy.ttlSecondsAfterFinished`: at most 365 days. A NodeImage tag's
/// TTL is only kept from being negative: the manager computes it from the job's TTL or
/// deadline plus its own margin, which can pass this bound.
pub(crate) const MIN_TTL_SECONDS: i32 = 0;
pub(crate) const MAX_JOB_TTL_SECONDS: i32 = 365 * 86_400;
