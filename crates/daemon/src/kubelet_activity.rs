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
//! [`POLL_INTERVAL`] while it has pulls to run: no pod watch, no more RBAC.
//!
//! A pod whose image cannot be pulled looks the same: a ready sandbox, no container, for as
//! long as the kubelet backs off (a leftover pod in `ImagePullBackOff` held a node's pre-pulls
//! back for three minutes in the chaos run, from the sandbox its restarts made). So past its
//! first [`YOUNG`] seconds, a sandbox keeps the pre-pulls aside only while containerd is
//! downloading (its ingests grow): with the daemon's own pulls given up, that is someone else's
//! pull, the kubelet's. Where containerd's content store cannot be read (another runtime), a pod
//! holds pre-pulls back for [`STARTING_AT_MOST`] at the most, as before.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerState, ListContainersRequest, ListPodSandboxRequest, PodSandboxFilter,
    PodSandboxState, PodSandboxStateValue,
};
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::containerd_api::ContainerdApi;
use crate::progress::ingest_offsets;

/// How often the runtime's pods are read while pulls wait or run.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How often when no pull needs it.
const IDLE_POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How long a pod counts as starting at most.
pub(crate) const STARTING_AT_MOST: Duration = Duration::from_secs(300);
/// How long one read of the runtime may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new sandbox counts as starting whatever containerd does: the kubelet resolves the
/// image and downloads its first bytes within it.
const YOUNG: Duration = Duration::from_secs(20);
/// How long after an ingest last grew containerd counts as downloading.
const DOWNLOAD_QUIET: Duration = Duration::from_secs(5);

/// A ready pod sandbox, as far as the decision goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sandbox {
    pub(crate) id: String,
    pub(crate) created: SystemTime,
}

/// The sandboxes among `ready` that are starting at `now`: created less than
/// [`STARTING_AT_MOST`] ago, none of `running` (the sandbox ids of running containers) theirs,
/// and, past their first [`YOUNG`] seconds, only while `others_downloading` (`None`: not known,
/// every one counts).
pub(crate) fn starting<'a>(
    ready: &'a [Sandbox],
    running: &[String],
    now: SystemTime,
    others_downloading: Option<bool>,
) -> Vec<&'a str> {
    ready
        .iter()
        .filter(|s| {
            // A runtime's clock a little ahead of ours: just created.
            let age = now.duration_since(s.created).unwrap_or(Duration::ZERO);
            age < STARTING_AT_MOST && (age < YOUNG || others_downloading.unwrap_or(true))
        })
        .filter(|s| !running.contains(&s.id))
        .map(|s| s.id.as_str())
        .collect()
}

/// Whether containerd is downloading, from how its ingests move between two reads.
struct Downloads {
    api: ContainerdApi,
    offsets: HashMap<String, i64>,
    last_grew: Option<Instant>,
    /// False once the runtime said it has no content service (not containerd).
    readable: bool,
}

impl Downloads {
    /// `None` when containerd's ingests cannot be read.
    async fn under_way(&mut self) -> Option<bool> {
        if !self.readable {
            return None;
        }
        let offsets = match tokio::time::timeout(CALL_TIMEOUT, ingest_offsets(&self.api)).await {
            Ok(Ok(offsets)) => offsets,
            Ok(Err(status)) => {
                if status.code() == tonic::Code::Unimplemented {
                    self.readable = false;
                }
                return None;
            }
            Err(_) => return None,
        };
        let grew = offsets
            .iter()
            .any(|(r, offset)| self.offsets.get(r).is_none_or(|old| offset > old));
        if grew {
            self.last_grew = Some(Instant::now());
        }
        self.offsets = offsets;
        Some(self.last_grew.is_some_and(|t| t.elapsed() < DOWNLOAD_QUIET))
    }
}

/// Whether the kubelet is starting a pod on this node, read from the runtime.
pub(crate) struct KubeletActivity {
    client: RuntimeServiceClient<Channel>,
    downloads: Downloads,
}

impl KubeletActivity {
    pub(crate) fn new(channel: Channel) -> Self {
        Self {
            client: RuntimeServiceClient::new(channel.clone()),
            downloads: Downloads {
                api: ContainerdApi::new(channel),
                offsets: HashMap::new(),
                last_grew: None,
                readable: true,
            },
        }
    }

    /// The sandboxes being started now; `Err` when the runtime did not answer. `aside`: whether
    /// the pre-pulls stand aside now (their downloads given up), so that what containerd
    /// downloads is someone else's; until they do, only young sandboxes put them aside.
    async fn read(&mut self, aside: bool) -> Result<Vec<String>, tonic::Status> {
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
        if starting(&ready, &[], now, None).is_empty() {
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
        // Read even while not aside: these offsets are what the next read compares with, so
        // the daemon's own downloads before it stepped aside do not count as someone else's.
        let others_downloading = self
            .downloads
            .under_way()
            .await
            .map(|downloading| aside && downloading);
        Ok(starting(&ready, &running, now, others_downloading)
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
                let aside = *busy.borrow();
                let starting = match tokio::time::timeout(CALL_TIMEOUT, self.read(aside)).await {
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
        for downloading in [None, Some(true), Some(false)] {
            assert_eq!(
                starting(&ready, &running, now, downloading),
                ["new", "ahead"],
                "{downloading:?}"
            );
        }
        assert!(starting(&[], &running, now, None).is_empty());
    }

    /// A pod in `ImagePullBackOff` keeps a ready sandbox with no container: past its first
    /// seconds it holds the pre-pulls back only while someone downloads.
    #[test]
    fn past_its_first_seconds_a_sandbox_counts_only_while_others_download() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(10_000);
        let ready = [
            sandbox("young", now - YOUNG + Duration::from_secs(1)),
            sandbox("backing-off", now - YOUNG - Duration::from_secs(1)),
            sandbox("older", now - Duration::from_secs(200)),
        ];
        assert_eq!(starting(&ready, &[], now, Some(false)), ["young"]);
        assert_eq!(
            starting(&ready, &[], now, Some(true)),
            ["young", "backing-off", "older"]
        );
        // containerd's downloads unknown (another runtime): every one, as before.
        assert_eq!(
            starting(&ready, &[], now, None),
            ["young", "backing-off", "older"]
        );
    }
}
