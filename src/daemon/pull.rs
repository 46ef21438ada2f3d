//! One tag's pull: attempts, backoff, per-attempt timeout, the active deadline, `IfNotPresent`,
//! and trying each matching credential. Generic over [`ImageRuntime`] so the whole sequence is
//! unit tested against a scripted runtime; the real one is [`Cri`].

use std::future::Future;
use std::time::Duration;

use k8s_cri::v1::{AuthConfig, PodSandboxConfig};
use tokio::time::Instant;

use super::auth::Credential;
use super::cri::{Cri, CriError, PresentImage};
use super::plan::PullTask;
use crate::apis::well_known::{PULLING_IMAGE_BY, PULLING_IMAGE_BY_VALUE};

/// First pause between attempts; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The image calls a pull makes.
pub trait ImageRuntime: Send + Sync {
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
}

/// What a pull needs besides the task.
#[derive(Debug)]
pub struct PullInput<'a> {
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
}

/// The image id to report: `name@sha256:…`.
pub type ImageId = String;

/// Pulls with up to `task.attempts` attempts; `Err` is the message for the status.
pub async fn pull<R: ImageRuntime>(
    runtime: &R,
    task: &PullTask,
    input: &PullInput<'_>,
) -> Result<ImageId, String> {
    let deadline = task
        .active_deadline
        .map(|limit| Instant::now() + limit.saturating_sub(input.elapsed));
    let deadline_message = || {
        let limit = task.active_deadline.unwrap_or_default().as_secs();
        format!(
            "pulling {} exceeded activeDeadlineSeconds ({limit}s)",
            input.image
        )
    };
    let mut last_error = String::new();
    for attempt in 1..=task.attempts {
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
        match tokio::time::timeout(budget, attempt_once(runtime, task, input)).await {
            Ok(Ok(id)) => return Ok(id),
            Ok(Err(err)) => last_error = err,
            Err(_) => {
                last_error = format!("pull attempt timed out after {}s", budget.as_secs_f64())
            }
        }
        tracing::debug!(image = input.image, attempt, error = %last_error, "pull attempt failed");
        if attempt == task.attempts {
            break;
        }
        let pause = backoff(attempt);
        match deadline {
            Some(deadline) if Instant::now() + pause >= deadline => {
                tokio::time::sleep_until(deadline).await;
                return Err(failure(&deadline_message(), &last_error, input));
            }
            _ => tokio::time::sleep(pause).await,
        }
    }
    let summary = format!(
        "pulling {} failed after {} attempt{}",
        input.image,
        task.attempts,
        if task.attempts == 1 { "" } else { "s" }
    );
    Err(failure(&summary, &last_error, input))
}

/// The pause after failed attempt number `attempt` (1-based): 1s, 2s, 4s, … capped at 30s.
pub fn backoff(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    FIRST_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF)
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

async fn attempt_once<R: ImageRuntime>(
    runtime: &R,
    task: &PullTask,
    input: &PullInput<'_>,
) -> Result<ImageId, String> {
    if task.if_not_present
        && let Some(present) = runtime
            .image_status(input.image)
            .await
            .map_err(|e| format!("cannot ask the runtime for {}: {e}", input.image))?
    {
        return Ok(image_id(input.name, &present));
    }
    let sandbox = sandbox_config(task);
    if input.credentials.is_empty() {
        runtime
            .pull_image(input.image, None, sandbox)
            .await
            .map_err(|e| e.message)?;
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
                Err(e) => refusals.push(format!(
                    "with the credentials of {} for {}: {}",
                    credential.source, credential.server_address, e.message
                )),
            }
        }
        if !pulled {
            return Err(refusals.join("; "));
        }
    }
    let present = runtime
        .image_status(input.image)
        .await
        .map_err(|e| format!("pulled, but cannot read the image's status: {e}"))?
        .ok_or_else(|| format!("pulled, but the runtime does not list {}", input.image))?;
    Ok(image_id(input.name, &present))
}

/// `name@sha256:…` from the runtime: the repo digest under this name (what a pod's `imageID`
/// shows and what pulls the same content again), else `name@<image id>` as upstream reports.
pub fn image_id(name: &str, present: &PresentImage) -> ImageId {
    present
        .repo_digests
        .iter()
        .find(|d| d.split_once('@').is_some_and(|(n, _)| n == name))
        .cloned()
        .unwrap_or_else(|| format!("{name}@{}", present.id))
}

/// The NodeImage's sandbox labels and annotations, marked as a kruise-daemon pull.
pub fn sandbox_config(task: &PullTask) -> PodSandboxConfig {
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
