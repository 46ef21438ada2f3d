//! One tag's pull: attempts, backoff, per-attempt timeout, the active deadline, `IfNotPresent`,
//! and trying each matching credential. Generic over [`ImageRuntime`] so the whole sequence is
//! unit tested against a scripted runtime; the real one is [`Cri`].

use std::future::Future;
use std::time::Duration;

use super::slots::FairSlots;
use k8s_cri::v1::{AuthConfig, PodSandboxConfig};
use tokio::sync::watch;
use tokio::time::Instant;

use super::auth::Credential;
use super::cri::{Cri, CriError, PresentImage};
use super::image_fs::{ImageFsGuard, space_of};
use super::plan::PullTask;
use kruise_rs_api::well_known::{PULLING_IMAGE_BY, PULLING_IMAGE_BY_VALUE};
use kruise_rs_kube::backoff::Doubling;

/// First pause between attempts; it doubles up to [`MAX_BACKOFF`].
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The image calls a pull makes.
pub(crate) trait ImageRuntime: Send + Sync {
    fn image_status(
        &self,
        image: &str,
    ) -> impl Future<Output = Result<Option<PresentImage>, CriError>> + Send;
    fn pull_image(
        &self,
        image: &str,
        auth: Option<AuthConfig>,
        sandbox: PodSandboxConfig,
    ) -> impl Future<Output = Result<String, CriError>> + Send;
    /// Whether the runtime answers at all.
    fn check(&self) -> impl Future<Output = Result<(), CriError>> + Send;
    /// The mountpoints of the runtime's image filesystems.
    fn image_filesystems(&self) -> impl Future<Output = Result<Vec<String>, CriError>> + Send;
}

impl ImageRuntime for Cri {
    async fn image_status(&self, image: &str) -> Result<Option<PresentImage>, CriError> {
        Cri::image_status(self, image).await
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<AuthConfig>,
        sandbox: PodSandboxConfig,
    ) -> Result<String, CriError> {
        Cri::pull_image(self, image, auth, sandbox).await
    }
    async fn check(&self) -> Result<(), CriError> {
        Cri::check(self).await
    }
    async fn image_filesystems(&self) -> Result<Vec<String>, CriError> {
        Cri::image_filesystems(self).await
    }
}

/// What a pull needs besides the task.
#[derive(Debug)]
pub(crate) struct PullInput<'a> {
    /// The fully qualified reference (`registry/repo:tag` or `registry/repo@sha256:…`).
    pub image: &'a str,
    /// `registry/repo`, to pick the matching repo digest for the image id.
    pub name: &'a str,
    /// Credentials matching the image's registry, most specific first.
    pub credentials: &'a [&'a Credential],
    /// Why some pull secrets or credential provider plugins gave no credentials, appended to
    /// a failure message.
    pub credential_problems: &'a [String],
    /// How long the task has been running already (across a daemon restart).
    pub elapsed: Duration,
    /// The limit on the image filesystem's usage a pull is held to ([`ImageFsGuard`]).
    pub image_fs: &'a ImageFsGuard,
    /// True while the kubelet starts a pod on the node: no attempt starts, and one under way
    /// steps aside (`kubelet_activity`). `None`: never.
    pub kubelet_busy: Option<&'a watch::Receiver<bool>>,
}

/// Until the kubelet starts no pod (at once when `busy` is `None` or its sender is gone).
async fn kubelet_idle(busy: Option<&watch::Receiver<bool>>) {
    if let Some(busy) = busy {
        let _ = busy.clone().wait_for(|starting| !*starting).await;
    }
}

/// Until the kubelet starts a pod (never when `busy` is `None` or its sender is gone).
async fn kubelet_starts(busy: Option<&watch::Receiver<bool>>) {
    if let Some(busy) = busy
        && busy.clone().wait_for(|starting| *starting).await.is_ok()
    {
        return;
    }
    std::future::pending::<()>().await;
}

/// The image id to report: `name@sha256:…`.
pub(crate) type ImageId = String;

/// Pulls with up to `task.attempts` attempts; `Err` is the message for the status.
///
/// `slot` is the node-wide pull slot the worker holds: it is given back for every pause (a
/// backoff, a wait for the runtime) and taken again for the next attempt, so a tag that keeps
/// failing does not keep other tags from pulling. An attempt that failed because the runtime
/// could not be reached (down, restarting) is not counted: the pull waits until the runtime
/// answers again and repeats it, up to [`MAX_UNCOUNTED`] times, within the active deadline.
pub(crate) async fn pull<R: ImageRuntime>(
    runtime: &R,
    slot: &mut Slot<'_>,
    task: &PullTask,
    input: &PullInput<'_>,
) -> Result<ImageId, String> {
    // No deadline when it lies beyond what the clock can hold: it is never reached anyway.
    let deadline = task
        .active_deadline
        .and_then(|limit| Instant::now().checked_add(limit.saturating_sub(input.elapsed)));
    let deadline_message = || {
        let limit = task.active_deadline.unwrap_or_default().as_secs();
        format!(
            "pulling {} exceeded activeDeadlineSeconds ({limit}s)",
            input.image
        )
    };
    let mut last_error = String::new();
    let mut attempt: u32 = 1;
    let mut uncounted: u32 = 0;
    loop {
        // Not while the kubelet starts a pod: its pulls go first (kubelet_activity.rs), and
        // the slot goes back meanwhile.
        if input.kubelet_busy.is_some_and(|busy| *busy.borrow()) {
            slot.release();
        }
        if within(deadline, kubelet_idle(input.kubelet_busy))
            .await
            .is_none()
        {
            return Err(failure(&deadline_message(), &last_error, input));
        }
        match within(deadline, slot.hold()).await {
            None => return Err(failure(&deadline_message(), &last_error, input)),
            Some(false) => return Err(failure("the daemon is stopping", &last_error, input)),
            Some(true) => {}
        }
        let budget = match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(failure(&deadline_message(), &last_error, input));
                }
                task.timeout.min(left)
            }
            None => task.timeout,
        };
        let attempted = tokio::select! {
            attempted = tokio::time::timeout(budget, attempt_once(runtime, task, input)) => attempted,
            () = kubelet_starts(input.kubelet_busy) => {
                // Dropping the attempt cancels the runtime's pull.
                slot.release();
                tracing::info!(image = input.image, attempt, "the kubelet is starting a pod: the pull steps aside, the attempt not counted");
                continue;
            }
        };
        let error = match attempted {
            Ok(Ok(id)) => return Ok(id),
            Ok(Err(err)) => err,
            Err(_) => CriError::answered(format!(
                "pull attempt timed out after {}s",
                budget.as_secs_f64()
            )),
        };
        last_error = error.message;
        slot.release();
        if error.unreachable && uncounted < MAX_UNCOUNTED {
            uncounted += 1;
            tracing::info!(image = input.image, attempt, error = %last_error, "the runtime cannot be reached; waiting for it, the attempt not counted");
            if within(deadline, wait_for_runtime(runtime)).await.is_none() {
                return Err(failure(&deadline_message(), &last_error, input));
            }
            continue;
        }
        tracing::debug!(image = input.image, attempt, error = %last_error, "pull attempt failed");
        if attempt >= task.attempts {
            break;
        }
        if within(deadline, tokio::time::sleep(backoff(attempt)))
            .await
            .is_none()
        {
            return Err(failure(&deadline_message(), &last_error, input));
        }
        attempt += 1;
    }
    let summary = format!(
        "pulling {} failed after {} attempt{}",
        input.image,
        task.attempts,
        if task.attempts == 1 { "" } else { "s" }
    );
    Err(failure(&summary, &last_error, input))
}

/// Attempts a pull may repeat uncounted because the runtime could not be reached. Enough for
/// any number of ordinary runtime restarts during one pull; a runtime that goes down on every
/// pull of the image ends up counting them.
pub(crate) const MAX_UNCOUNTED: u32 = 10;
/// Longest pause between two checks of a runtime that does not answer.
pub(crate) const MAX_RUNTIME_RECHECK: Duration = Duration::from_secs(5);

/// Waits until the runtime answers, checking after 1s, 2s, 4s, then every
/// [`MAX_RUNTIME_RECHECK`].
async fn wait_for_runtime<R: ImageRuntime>(runtime: &R) {
    let pauses = Doubling::new(FIRST_BACKOFF, MAX_RUNTIME_RECHECK, 0.0);
    for checks in 1.. {
        tokio::time::sleep(pauses.unjittered(checks)).await;
        if runtime.check().await.is_ok() {
            return;
        }
    }
}

/// `work`'s output, or `None` once `deadline` passes first.
async fn within<T>(deadline: Option<Instant>, work: impl Future<Output = T>) -> Option<T> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, work).await.ok(),
        None => Some(work.await),
    }
}

/// A worker's place among the node's concurrent pulls: held while it talks to the runtime,
/// given back while it waits. Taken in `share`'s turn ([`FairSlots`]).
#[derive(Debug)]
pub(crate) struct Slot<'a> {
    slots: &'a FairSlots,
    share: String,
    held: bool,
}

impl<'a> Slot<'a> {
    /// Waits for a slot for `share` (the tenant of the tag); `None` once `slots` is closed.
    pub(crate) async fn acquire(slots: &'a FairSlots, share: &str) -> Option<Self> {
        let mut slot = Self {
            slots,
            share: share.to_owned(),
            held: false,
        };
        slot.hold().await.then_some(slot)
    }

    /// Takes a slot unless one is held; `false` once `slots` is closed.
    async fn hold(&mut self) -> bool {
        if !self.held {
            if !self.slots.acquire(&self.share).await {
                return false;
            }
            self.held = true;
        }
        true
    }

    fn release(&mut self) {
        if std::mem::take(&mut self.held) {
            self.slots.release();
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// The pause after failed attempt number `attempt` (1-based): 1s, 2s, 4s, … capped at 30s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Doubling::new(FIRST_BACKOFF, MAX_BACKOFF, 0.0).unjittered(attempt)
}

fn failure(summary: &str, last_error: &str, input: &PullInput<'_>) -> String {
    let mut message = summary.to_owned();
    if !last_error.is_empty() {
        message.push_str(": ");
        message.push_str(last_error);
    }
    for problem in input.credential_problems {
        message.push_str("; ");
        message.push_str(problem);
    }
    message
}

/// One attempt; the error keeps whether the runtime could be reached at all.
async fn attempt_once<R: ImageRuntime>(
    runtime: &R,
    task: &PullTask,
    input: &PullInput<'_>,
) -> Result<ImageId, CriError> {
    let reworded = |what: String| {
        move |e: CriError| CriError {
            message: format!("{what}: {}", e.message),
            unreachable: e.unreachable,
        }
    };
    if task.if_not_present
        && let Some(present) =
            runtime
                .image_status(input.image)
                .await
                .map_err(reworded(format!(
                    "cannot ask the runtime for {}",
                    input.image
                )))?
    {
        return Ok(image_id(input.name, &present));
    }
    // Not pulling onto a full disk: what the runtime would write, the kubelet would collect.
    let filesystems = runtime.image_filesystems().await.map_err(reworded(
        "cannot ask the runtime for its image filesystem".to_owned(),
    ))?;
    input
        .image_fs
        .check(&filesystems, space_of)
        .map_err(CriError::answered)?;
    let sandbox = sandbox_config(task);
    if input.credentials.is_empty() {
        runtime.pull_image(input.image, None, sandbox).await?;
    } else {
        // Each matching credential in turn; never anonymous once a credential matched.
        let mut refusals = Vec::new();
        let mut pulled = false;
        for credential in input.credentials {
            match runtime
                .pull_image(input.image, Some(auth_config(credential)), sandbox.clone())
                .await
            {
                Ok(_) => {
                    pulled = true;
                    break;
                }
                // The runtime is gone: the other credentials would say nothing either.
                Err(e) if e.unreachable => return Err(e),
                Err(e) => refusals.push(format!(
                    "with the credentials of {} for {}: {}",
                    credential.source, credential.server_address, e.message
                )),
            }
        }
        if !pulled {
            return Err(CriError::answered(refusals.join("; ")));
        }
    }
    let present = runtime
        .image_status(input.image)
        .await
        .map_err(reworded(
            "pulled, but cannot read the image's status".to_owned(),
        ))?
        .ok_or_else(|| {
            CriError::answered(format!(
                "pulled, but the runtime does not list {}",
                input.image
            ))
        })?;
    Ok(image_id(input.name, &present))
}

/// `name@sha256:…` from the runtime: the repo digest under this name (what a pod's `imageID`
/// shows and what pulls the same content again), else `name@<image id>` as upstream reports.
pub(crate) fn image_id(name: &str, present: &PresentImage) -> ImageId {
    present
        .repo_digests
        .iter()
        .find(|d| d.split_once('@').is_some_and(|(n, _)| n == name))
        .cloned()
        .unwrap_or_else(|| format!("{name}@{}", present.id))
}

/// The NodeImage's sandbox labels and annotations, marked as a kruise-daemon pull.
pub(crate) fn sandbox_config(task: &PullTask) -> PodSandboxConfig {
    let mut annotations: std::collections::HashMap<String, String> = task
        .sandbox
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(
        PULLING_IMAGE_BY.to_owned(),
        PULLING_IMAGE_BY_VALUE.to_owned(),
    );
    PodSandboxConfig {
        labels: task
            .sandbox
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        annotations,
        ..PodSandboxConfig::default()
    }
}

fn auth_config(credential: &Credential) -> AuthConfig {
    AuthConfig {
        username: credential.username.clone(),
        password: credential.password.clone(),
        auth: String::new(),
        // Left empty as the kubelet does: containerd parses a non-empty one as a URL and refuses
        // the plain `host:port` keys docker configs use ("first path segment in URL cannot
        // contain colon"). The image reference already names the registry.
        server_address: String::new(),
        identity_token: credential.identity_token.clone(),
        registry_token: credential.registry_token.clone(),
    }
}

#[cfg(test)]
mod tests;
