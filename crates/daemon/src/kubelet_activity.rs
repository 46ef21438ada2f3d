//! Pre-pulls step aside while the kubelet starts a pod on this node.
//!
//! containerd 2 downloads through one transfer service with a node-wide limit of concurrent
//! layer downloads (`max_concurrent_downloads`, 3 by default), shared by every pull: three layers
//! of the daemon's pre-pulls in flight hold a pending pod's image behind them. So while the
//! kubelet is starting a pod, the daemon starts no pull, and gives up the attempts it has under
//! way (the next attempt pulls again; whether containerd reuses what the interrupted one
//! downloaded is not measured here); those attempts are not counted against the tag.
//!
//! The kubelet's pulls are not visible through CRI, but the pods it is starting are: a pod
//! sandbox that is ready, was created less than [`STARTING_AT_MOST`] ago, and has no running
//! container yet (the kubelet pulls a container's image between creating the sandbox and
//! creating the container). Read from the runtime the daemon already talks to, every
//! [`POLL_INTERVAL`] while it has pulls to run: no pod watch, no more RBAC. A pod that never
//! gets a container running (its image does not exist, it crashes at once) holds pre-pulls back
//! for [`STARTING_AT_MOST`] at the most.

use std::time::{Duration, SystemTime};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerState, ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue,
};
use tokio::sync::watch;
use tonic::transport::Channel;

/// How often the runtime's pods are read while pulls wait or run.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How often when no pull needs it.
const IDLE_POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How long a pod counts as starting at most.
pub(crate) const STARTING_AT_MOST: Duration = Duration::from_secs(300);
/// How long one read of the runtime may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A ready pod sandbox, as far as the decision goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sandbox {
    pub(crate) id: String,
    pub(crate) created: SystemTime,
}

/// The sandboxes among `ready` that are starting at `now`: created less than
/// [`STARTING_AT_MOST`] ago, none of `running` (the sandbox ids of running containers) theirs.
pub(crate) fn starting<'a>(
    ready: &'a [Sandbox],
    running: &[String],
    now: SystemTime,
) -> Vec<&'a str> {
    ready
        .iter()
        .filter(|s| {
            now.duration_since(s.created)
                .is_ok_and(|age| age < STARTING_AT_MOST)
                || s.created > now
        })
        .filter(|s| !running.contains(&s.id))
        .map(|s| s.id.as_str())
        .collect()
}

/// Whether the kubelet is starting a pod on this node, read from the runtime.
pub(crate) struct KubeletActivity {
    client: RuntimeServiceClient<Channel>,
}

impl KubeletActivity {
    pub(crate) fn new(channel: Channel) -> Self {
        Self {
            client: RuntimeServiceClient::new(channel),
        }
    }

    /// The sandboxes being started now; `Err` when the runtime did not answer.
    async fn read(&mut self) -> Result<Vec<String>, tonic::Status> {
        let ready_filter = PodSandboxFilter {
            state: Some(PodSandboxStateValue {
                state: PodSandboxState::SandboxReady as i32,
            }),
            ..Default::default()
        };
        let sandboxes = self
            .client
            .list_pod_sandbox(ListPodSandboxRequest {
                filter: Some(ready_filter),
            })
            .await?
            .into_inner()
            .items;
        let ready: Vec<Sandbox> = sandboxes
            .into_iter()
            .map(|s| Sandbox {
                id: s.id,
                created: SystemTime::UNIX_EPOCH
                    + Duration::from_nanos(u64::try_from(s.created_at).unwrap_or(0)),
            })
            .collect();
        let now = SystemTime::now();
        if starting(&ready, &[], now).is_empty() {
            return Ok(Vec::new());
        }
        let running: Vec<String> = self
            .client
            .list_containers(ListContainersRequest { filter: None })
            .await?
            .into_inner()
            .containers
            .into_iter()
            .filter(|c| c.state == ContainerState::ContainerRunning as i32)
            .map(|c| c.pod_sandbox_id)
            .collect();
        Ok(starting(&ready, &running, now)
            .into_iter()
            .map(str::to_owned)
            .collect())
    }

    /// Publishes whether a pod is starting into `busy`, until every receiver is gone; reads
    /// every [`POLL_INTERVAL`] while `wanted` says pulls are waiting or running. A runtime that
    /// does not answer (or has no RuntimeService on this socket) counts as no pod starting.
    pub(crate) async fn run(mut self, busy: watch::Sender<bool>, wanted: impl Fn() -> bool) {
        let mut said_failed = false;
        loop {
            if busy.is_closed() {
                return;
            }
            let pause = if wanted() {
                let starting = match tokio::time::timeout(CALL_TIMEOUT, self.read()).await {
                    Ok(Ok(starting)) => starting,
                    Ok(Err(status)) => {
                        if !std::mem::replace(&mut said_failed, true) {
                            tracing::warn!(error = %status.message(), "cannot read the runtime's pods: pre-pulls do not step aside for the kubelet");
                        }
                        Vec::new()
                    }
                    Err(_) => Vec::new(),
                };
                let now_busy = !starting.is_empty();
                if busy.send_replace(now_busy) != now_busy {
                    if now_busy {
                        tracing::info!(sandboxes = ?starting, "the kubelet is starting pods: pre-pulls step aside");
                    } else {
                        tracing::info!("no pod starting any more: pre-pulls go on");
                    }
                }
                POLL_INTERVAL
            } else {
                busy.send_replace(false);
                IDLE_POLL_INTERVAL
            };
            tokio::time::sleep(pause).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str, created: SystemTime) -> Sandbox {
        Sandbox {
            id: id.into(),
            created,
        }
    }

    #[test]
    fn a_new_sandbox_without_a_running_container_is_starting() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let ready = [
            sandbox("new", now - Duration::from_secs(3)),
            sandbox("running", now - Duration::from_secs(3)),
            sandbox("old", now - STARTING_AT_MOST - Duration::from_secs(1)),
            // A runtime's clock a little ahead of ours.
            sandbox("ahead", now + Duration::from_millis(50)),
        ];
        let running = ["running".to_owned()];
        assert_eq!(starting(&ready, &running, now), ["new", "ahead"]);
        assert!(starting(&[], &running, now).is_empty());
    }
}
