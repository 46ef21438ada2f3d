//! The daemon's command-line flags, the same for `kruise-rs daemon` and `kruise-rs-daemon`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::credential_provider::{self, CredentialProviderOptions};
use super::{DEFAULT_KUBE_API_RATE, DaemonOptions};
use kruise_rs_kube::RateLimit;
use kruise_rs_kube::cli::parse_duration;

/// The daemon's flags.
#[derive(Debug, clap::Args)]
pub struct DaemonArgs {
    /// The node this daemon runs on (set NODE_NAME from the downward API's spec.nodeName).
    #[arg(long, value_name = "NAME", env = "NODE_NAME")]
    pub node_name: String,

    /// Kubeconfig file to use; by default KUBECONFIG, then ~/.kube/config, then the in-cluster
    /// service account.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The CRI socket. Default: the first of containerd/containerd.sock, containerd.sock,
    /// crio/crio.sock, crio.sock, cri-dockerd.sock, cri-dockerd/cri-dockerd.sock under
    /// --host-run-dir that answers.
    #[arg(long, value_name = "PATH", env = "KRUISE_RS_CRI_SOCKET")]
    pub cri_socket: Option<PathBuf>,

    /// Upstream kruise-daemon's spelling of the CRI socket: its path relative to
    /// --host-run-dir (`containerd/containerd.sock`), so upstream's DaemonSet arguments work.
    #[arg(long, value_name = "NAME", conflicts_with = "cri_socket")]
    pub socket_file: Option<PathBuf>,

    /// Where the host's /var/run is mounted, for socket detection.
    #[arg(long, value_name = "DIR", default_value = "/var/run")]
    pub host_run_dir: PathBuf,

    /// Address of the /healthz, /readyz and /metrics server.
    #[arg(
        long,
        value_name = "ADDR",
        env = "KRUISE_RS_PROBE_ADDR",
        default_value = "0.0.0.0:10221"
    )]
    pub probe_addr: SocketAddr,

    /// Image pulls in flight at once on this node. Upstream's spelling
    /// --max-workers-for-pull-image is accepted, with its -1 for "no bound" (read as 65535).
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = parse_pull_workers,
          visible_alias = "max-workers-for-pull-image", allow_negative_numbers = true)]
    pub max_concurrent_pulls: u16,

    /// Requests a second the daemon sends the API server on average (a client-side token
    /// bucket; requests over it wait); 0 for no limit. The default is client-go's, which
    /// upstream's daemon keeps.
    #[arg(long, value_name = "QPS", default_value_t = DEFAULT_KUBE_API_RATE.qps,
          visible_alias = "rest-config-qps")]
    pub kube_api_qps: f64,

    /// Requests the daemon may send at once above --kube-api-qps after a quiet spell.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_KUBE_API_RATE.burst,
          visible_alias = "rest-config-burst")]
    pub kube_api_burst: u32,

    /// /healthz fails once the CRI runtime has not answered for this long, so a liveness probe
    /// restarts the daemon's container (whose new mount of the socket reaches a restarted
    /// runtime's new one).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub cri_liveness_timeout: Duration,

    /// A kubelet CredentialProviderConfig (kubelet.config.k8s.io/v1, YAML or JSON) naming
    /// credential provider plugins for images no pull secret covers. When given, the file must
    /// exist and be valid or the daemon does not start. Default: /kruise/CredentialProviderPlugin.yaml
    /// if it exists (upstream's path), else no plugins.
    #[arg(long, value_name = "PATH")]
    pub plugin_config_file: Option<PathBuf>,

    /// Pulls wait while the runtime's image filesystem (its ImageFsInfo mountpoint, as the
    /// daemon's container sees it) is at least this full, in percent: the tag fails with
    /// ImageFilesystemFull instead of pushing the kubelet's image GC to collect what pods need.
    /// The default is the kubelet's default imageGCHighThresholdPercent; 100 turns it off.
    #[arg(long, value_name = "PERCENT", default_value_t = super::DEFAULT_IMAGE_FS_HIGH_PERCENT,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub image_fs_high_threshold_percent: u8,

    /// The directory of the credential provider plugin executables named in
    /// --plugin-config-file (the kubelet's --image-credential-provider-bin-dir).
    #[arg(long, value_name = "DIR", default_value = credential_provider::DEFAULT_BIN_DIR)]
    pub plugin_bin_dir: PathBuf,
}

/// `--max-concurrent-pulls`: 1 to 65535, or upstream's -1 for no bound (65535).
fn parse_pull_workers(text: &str) -> Result<u16, String> {
    match text.trim().parse::<i64>() {
        Ok(-1) => Ok(u16::MAX),
        Ok(n) => u16::try_from(n)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| format!("{n} is not between 1 and 65535 (or -1 for no bound)")),
        Err(e) => Err(format!("not a number: {e}")),
    }
}

/// `--socket-file`: a path relative to `host_run_dir` without `..`, as upstream's daemon
/// joins it under its mount of the host's /var/run.
fn socket_under(host_run_dir: &std::path::Path, name: &std::path::Path) -> Result<PathBuf, String> {
    use std::path::Component;
    if name.as_os_str().is_empty() || !name.components().all(|c| matches!(c, Component::Normal(_)))
    {
        return Err(format!(
            "--socket-file {} must name a socket under --host-run-dir ({}), without .. or a \
             leading /; give a full path with --cri-socket",
            name.display(),
            host_run_dir.display()
        ));
    }
    Ok(host_run_dir.join(name))
}

impl DaemonArgs {
    /// What [`super::run`] takes; an error names the flags that do not fit together.
    pub fn options(self) -> Result<DaemonOptions, String> {
        let cri_socket = match &self.socket_file {
            Some(name) => Some(socket_under(&self.host_run_dir, name)?),
            None => self.cri_socket,
        };
        Ok(DaemonOptions {
            kube_api_rate: RateLimit::from_flags(self.kube_api_qps, self.kube_api_burst)?,
            node_name: self.node_name,
            kubeconfig: self.kubeconfig,
            cri_socket,
            host_run_dir: self.host_run_dir,
            probe_addr: self.probe_addr,
            cri_liveness_timeout: self.cri_liveness_timeout,
            max_concurrent_pulls: usize::from(self.max_concurrent_pulls),
            image_fs_high_percent: self.image_fs_high_threshold_percent,
            credential_providers: CredentialProviderOptions {
                config_file: self.plugin_config_file,
                bin_dir: self.plugin_bin_dir,
                ..CredentialProviderOptions::default()
            },
        })
    }
}
