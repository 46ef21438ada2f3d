//! `kruise-rs`: the controller-manager, the node daemon and the CRD printer in one binary.

use std::{io::Write, net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kruise_rs::controllers::{ControllerOptions, Workers};
use kruise_rs::manager::{self, LeaderElection, ManagerOptions};
use kruise_rs::webhook::{
    CertSource, Endpoint, FailurePolicy, SidecarSetCacheReads, UnreadableSidecarSetPolicy,
    WebhookOptions,
};
use kruise_rs_controller::initial_list::StreamingLists;
use kruise_rs_daemon::{self as daemon, DaemonArgs};
use kruise_rs_kube::RateLimit;
use kruise_rs_kube::cli::{LogFormat, error_chain, init_logging, parse_duration, shutdown_signal};
use tracing::error;

/// Serves OpenKruise's SidecarSet, ImagePullJob and NodeImage APIs.
#[derive(Debug, Parser)]
#[command(name = "kruise-rs", version, about)]
struct Cli {
    /// Log format. Verbosity comes from RUST_LOG (default `info`), e.g. `RUST_LOG=kruise_rs=debug`.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "KRUISE_RS_LOG_FORMAT",
        default_value_t = LogFormat::Text
    )]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller-manager (controllers, probes and metrics).
    Manager(Box<ManagerArgs>),
    /// Run the node daemon: pull what this node's NodeImage asks for through CRI.
    Daemon(DaemonArgs),
    /// Print every CustomResourceDefinition as YAML, for `kubectl apply --server-side -f -`; or
    /// with --install, install them (switching upstream OpenKruise's off its conversion webhook).
    Crds(CrdsArgs),
}

#[derive(Debug, Args)]
struct CrdsArgs {
    /// Write one file per CRD into this directory (created if needed) instead of printing them.
    #[arg(long, value_name = "DIR", conflicts_with = "install")]
    out_dir: Option<PathBuf>,

    /// Install the CRDs into the cluster instead of printing them: for each, remove a conversion
    /// webhook it has (upstream OpenKruise's), server-side apply ours (taking over upstream's
    /// fields), wait until it is Established and its objects read in both versions. Idempotent.
    #[arg(long)]
    install: bool,

    /// With --install: the kubeconfig file to use; by default KUBECONFIG, then ~/.kube/config,
    /// then the in-cluster service account.
    #[arg(long, value_name = "PATH", requires = "install")]
    kubeconfig: Option<PathBuf>,

    /// With --install: how long each CRD may take to be Established and readable.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration,
          requires = "install")]
    timeout: Duration,
}

#[derive(Debug, Args)]
struct ManagerArgs {
    /// Kubeconfig file to use; by default KUBECONFIG, then ~/.kube/config, then the in-cluster
    /// service account.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,

    /// Address of the /healthz, /readyz and /metrics server.
    #[arg(
        long,
        value_name = "ADDR",
        env = "KRUISE_RS_PROBE_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    probe_addr: SocketAddr,

    /// How long a Node must have been Ready before its NodeImage is created (`30s`, `0`, `2m`).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    nodeimage_creation_delay: Duration,

    /// How long a node may leave a requested image unanswered before it is marked Failed.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    nodeimage_response_timeout: Duration,

    /// Extra seconds an `Always` job's finished tags stay on a node (upstream's flag name).
    #[arg(long = "default-ttlseconds-for-always-nodeimage", value_name = "SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=31 * 24 * 3600))]
    default_ttl_for_always_nodeimage: u64,

    /// Namespace whose Secrets the node daemons may read; job pull secrets are copied there.
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "KRUISE_DAEMON_CONFIG_NS",
        default_value = "kruise-daemon-config"
    )]
    daemon_config_namespace: String,

    /// Manage only the Nodes, NodeImages, ImagePullJobs and SidecarSets with these labels (`kubectl -l`
    /// syntax), e.g. to shard nodes between managers. Default: all.
    #[arg(long, value_name = "SELECTOR")]
    label_selector: Option<String>,

    /// How the controllers' watches get their first list: `auto` streams it (WatchList) where
    /// the API server serves streaming lists, asked once at start, and lists then watches
    /// elsewhere (Kubernetes 1.33 ships WatchList off); `never` always lists then watches.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = StreamingLists::Auto)]
    streaming_lists: StreamingLists,

    /// `upstream` also serves the reconciles and the leadership under upstream kruise-manager's
    /// metric names (controller-runtime's `controller_runtime_reconcile_total`, ...,
    /// `kruise_manager_is_leader`), so dashboards and alerts written for it keep working.
    #[arg(long, value_enum, value_name = "NAMES", default_value_t = MetricsCompat::None)]
    metrics_compat: MetricsCompat,

    /// The most nodes pulling from one registry host at once, across every ImagePullJob (and so
    /// every SidecarSet pre-download); 0: no limit. A job's annotation
    /// `kruise-rs.io/max-pulls-per-registry` lowers it for its own starts.
    #[arg(long, value_name = "N", default_value_t = 0)]
    max_pulls_per_registry: usize,

    /// Pre-download new SidecarSet sidecar images on the nodes of the pods to upgrade (as
    /// ImagePullJobs) and hold each pod until its node has pulled; `=false` rolls SidecarSets out
    /// as upstream OpenKruise does, without pre-download.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    sidecarset_predownload: bool,

    /// Also write upstream OpenKruise's pod condition `SidecarSetUpgradable=True` on every pod a
    /// SidecarSet upgrades in place (one more pod status write per upgraded pod). Off, the
    /// condition is written only on pods some SidecarSet cannot upgrade (`False`).
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    sidecarset_upgradable_condition_on_upgrade: bool,

    #[command(flatten)]
    leader_election: LeaderElectionArgs,

    #[command(flatten)]
    api: ApiArgs,

    #[command(flatten)]
    webhook: WebhookArgs,
}

#[derive(Debug, Args)]
struct ApiArgs {
    /// Requests a second the controllers send the API server on average (a client-side token
    /// bucket they share; requests over it wait); 0 for no limit. The webhooks and leader
    /// election are not counted. Upstream's name --rest-config-qps also works (upstream's
    /// default is 30).
    #[arg(
        long,
        visible_alias = "rest-config-qps",
        value_name = "QPS",
        default_value_t = manager::DEFAULT_KUBE_API_RATE.qps
    )]
    kube_api_qps: f64,

    /// Requests the controllers may send at once above --kube-api-qps after a quiet spell (the
    /// bucket's size). Upstream's name --rest-config-burst also works (upstream's default is
    /// 50).
    #[arg(
        long,
        visible_alias = "rest-config-burst",
        value_name = "N",
        default_value_t = manager::DEFAULT_KUBE_API_RATE.burst
    )]
    kube_api_burst: u32,

    /// SidecarSets reconciled at once.
    #[arg(long, value_name = "N", default_value_t = Workers::default().sidecarset,
          value_parser = clap::value_parser!(u16).range(1..))]
    sidecarset_workers: u16,

    /// ImagePullJobs reconciled at once.
    #[arg(long, value_name = "N", default_value_t = Workers::default().imagepulljob,
          value_parser = clap::value_parser!(u16).range(1..))]
    imagepulljob_workers: u16,

    /// ImageListPullJobs reconciled at once.
    #[arg(long, value_name = "N", default_value_t = Workers::default().imagelistpulljob,
          value_parser = clap::value_parser!(u16).range(1..))]
    imagelistpulljob_workers: u16,

    /// Nodes reconciled at once by the NodeImage controller, and as many NodeImages.
    #[arg(long, value_name = "N", default_value_t = Workers::default().nodeimage,
          value_parser = clap::value_parser!(u16).range(1..))]
    nodeimage_workers: u16,
}

impl ApiArgs {
    fn rate_limit(&self) -> Result<Option<RateLimit>, String> {
        RateLimit::from_flags(self.kube_api_qps, self.kube_api_burst)
    }

    fn workers(&self) -> Workers {
        Workers {
            sidecarset: self.sidecarset_workers,
            imagepulljob: self.imagepulljob_workers,
            imagelistpulljob: self.imagelistpulljob_workers,
            nodeimage: self.nodeimage_workers,
        }
    }
}

#[derive(Debug, Args)]
struct LeaderElectionArgs {
    /// Run the controllers only on the replica holding the leader Lease in --namespace (every
    /// replica serves the webhooks); `--leader-elect=false` for a single replica without one.
    /// The replica's identity is POD_NAME, else the host name with a random suffix.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    leader_elect: bool,

    /// Name of the leader Lease.
    #[arg(long, value_name = "NAME", default_value = manager::leader::DEFAULT_LEASE_NAME)]
    leader_election_id: String,

    /// How long a Lease its holder stops renewing stays with it (followers wait that long).
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    leader_election_lease_duration: Duration,

    /// How long the leader keeps leading while it fails to renew; less than the lease duration.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    leader_election_renew_deadline: Duration,

    /// How often the leader renews and the others try to acquire (`2s`, `500ms`).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    leader_election_retry_period: Duration,

    /// What a replica that does not lead keeps watching: `warm` keeps every pod and NodeImage
    /// in memory (about what the leader holds for them), so that it takes over without listing
    /// them; `cold` watches nothing until it leads (least memory, slower takeover).
    #[arg(long, value_enum, value_name = "WHAT", default_value_t = StandbyCaches::Warm)]
    standby_caches: StandbyCaches,
}

/// `--standby-caches`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StandbyCaches {
    Warm,
    Cold,
}

impl LeaderElectionArgs {
    fn options(self, namespace: &str) -> Option<LeaderElection> {
        self.leader_elect.then(|| LeaderElection {
            lease_name: self.leader_election_id,
            lease_duration: self.leader_election_lease_duration,
            renew_deadline: self.leader_election_renew_deadline,
            retry_period: self.leader_election_retry_period,
            warm_standby: self.standby_caches == StandbyCaches::Warm,
            ..LeaderElection::new(namespace)
        })
    }
}

#[derive(Debug, Args)]
struct WebhookArgs {
    /// Run without the admission webhooks (no sidecar injection, no defaulting or validation).
    #[arg(long)]
    disable_webhooks: bool,

    /// Address of the webhooks' HTTPS server.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:9443")]
    webhook_addr: SocketAddr,

    /// The manager's namespace: holds the certificate Secret and SidecarSet revisions, and is
    /// never sent to the webhooks (nor is kube-system).
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "POD_NAMESPACE",
        default_value = "kruise-system"
    )]
    namespace: String,

    /// The Service in front of the webhook server, in --namespace.
    #[arg(long, value_name = "NAME", default_value = "kruise-rs-webhook")]
    webhook_service: String,

    /// The Service's port.
    #[arg(long, value_name = "PORT", default_value_t = 443)]
    webhook_service_port: i32,

    /// Reach the webhooks at this base URL instead of through the Service (local runs:
    /// `https://127.0.0.1:9443`).
    #[arg(long, value_name = "URL")]
    webhook_url: Option<String>,

    /// Serve tls.crt/tls.key from this directory (cert-manager) instead of self-managed
    /// certificates; its ca.crt, if any, becomes the caBundle.
    #[arg(long, value_name = "DIR")]
    webhook_cert_dir: Option<PathBuf>,

    /// The Secret in --namespace holding self-managed certificates.
    #[arg(long, value_name = "NAME", default_value = "kruise-rs-webhook-certs")]
    webhook_secret: String,

    /// What the apiserver does with a pod when the pod webhook cannot answer: Fail refuses it
    /// (pods are not created without their sidecars), Ignore admits it unchanged. The
    /// SidecarSet, ImagePullJob, ImageListPullJob and NodeImage webhooks always Fail: their
    /// validation checks pull-Secret access and must not be skipped.
    #[arg(long, value_enum, default_value_t = FailurePolicy::Fail)]
    webhook_failure_policy: FailurePolicy,

    /// How long the apiserver waits for a webhook answer (1 to 30 seconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(i32).range(1..=30))]
    webhook_timeout_seconds: i32,

    /// Admit SidecarSet `patchPodMetadata` that no rule of the whitelist (ConfigMap
    /// `kruise-configuration`, key `SidecarSet_PatchPodMetadata_WhiteList`) covers: upstream
    /// OpenKruise's feature gate `SidecarSetPatchPodMetadataDefaultsAllowed`. A rule that applies
    /// to a SidecarSet still limits it to the keys it allows.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    sidecarset_patch_pod_metadata_defaults_allowed: bool,

    /// Inject a pod's sidecar containers in name order (as sidecar init containers always are)
    /// rather than SidecarSet then declaration order: upstream OpenKruise's feature gate
    /// `EnableSortSidecarContainerByName`.
    #[arg(long, value_name = "BOOL", default_value_t = false, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    sidecarset_sort_containers_by_name: bool,

    /// What the pod webhook does with a pod that a SidecarSet it cannot read (written around
    /// the webhook with a field our types refuse) may select: `admit` it without that
    /// SidecarSet, with an admission warning naming it, or `refuse` it, naming the SidecarSet
    /// and the field. Whom it may select is read from its raw selection fields; if those do not
    /// read either, it may select any pod.
    #[arg(long, value_enum, default_value_t = UnreadableSidecarSetPolicy::Admit)]
    unreadable_sidecarset_policy: UnreadableSidecarSetPolicy,

    /// Before each pod admission, read the version the apiserver's SidecarSet cache stands at
    /// and wait until the webhook's cache holds it (or list the SidecarSets), so that a pod
    /// created just after a SidecarSet changed gets it as it is. `=false` uses the cache as it
    /// stands, as upstream OpenKruise does: one request less per pod (about 0.8 ms of the
    /// apiserver's CPU and of the pod's admission), but a pod created while the watch lags
    /// (milliseconds; seconds when the manager is busy) gets the SidecarSets as they were.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    sidecarset_cache_fence: bool,

    /// After SIGTERM, how long the webhooks keep answering (with `/readyz` failing, so the
    /// Service drops this replica) before the server stops. Keep it below the pod's
    /// terminationGracePeriodSeconds minus its preStop sleep and about 15 s of stopping.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    webhook_shutdown_grace: Duration,

    /// Extra requirements on the namespaces whose pods are sent to the pod webhook, as a JSON
    /// LabelSelector (`{"matchLabels":{"team":"a"}}`). kube-system, --namespace and namespaces
    /// labelled `control-plane` are excluded whatever it says. It never scopes the SidecarSet,
    /// ImagePullJob, ImageListPullJob and NodeImage webhooks: they see every namespace.
    #[arg(long, value_name = "JSON", value_parser = parse_label_selector)]
    webhook_namespace_selector: Option<LabelSelector>,

    /// Only pods this JSON LabelSelector selects are sent to the pod webhook (default: all).
    #[arg(long, value_name = "JSON", value_parser = parse_label_selector)]
    webhook_pod_object_selector: Option<LabelSelector>,
}

impl WebhookArgs {
    fn options(self) -> Option<WebhookOptions> {
        if self.disable_webhooks {
            return None;
        }
        let endpoint = match self.webhook_url {
            Some(url) => Endpoint::Url(url),
            None => Endpoint::Service {
                namespace: self.namespace.clone(),
                name: self.webhook_service,
                port: self.webhook_service_port,
            },
        };
        let certs = match self.webhook_cert_dir {
            Some(dir) => CertSource::Directory(dir),
            None => CertSource::SelfManaged {
                secret: self.webhook_secret,
            },
        };
        Some(WebhookOptions {
            addr: self.webhook_addr,
            namespace: self.namespace,
            certs,
            endpoint,
            pod_failure_policy: self.webhook_failure_policy,
            timeout_seconds: self.webhook_timeout_seconds,
            configuration_prefix: "kruise-rs".to_owned(),
            pod_namespace_selector: self.webhook_namespace_selector,
            pod_object_selector: self.webhook_pod_object_selector,
            patch_pod_metadata_defaults_allowed: self
                .sidecarset_patch_pod_metadata_defaults_allowed,
            sort_sidecar_containers_by_name: self.sidecarset_sort_containers_by_name,
            unreadable_sidecarset_policy: self.unreadable_sidecarset_policy,
            sidecarset_cache_reads: if self.sidecarset_cache_fence {
                SidecarSetCacheReads::Confirmed
            } else {
                SidecarSetCacheReads::AsTheyStand
            },
            shutdown_grace: self.webhook_shutdown_grace,
        })
    }
}

/// A LabelSelector written as JSON (how the chart passes its YAML values).
fn parse_label_selector(text: &str) -> Result<LabelSelector, String> {
    serde_json::from_str(text).map_err(|e| format!("not a JSON LabelSelector: {e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before the runtime's threads start: each keeps the malloc arena it first gets.
    if matches!(cli.command, Command::Manager(_)) {
        kruise_rs::manager::allocator::one_arena();
    }
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async_main(cli)),
        Err(err) => {
            eprintln!("kruise-rs: cannot start the async runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The `--metrics-compat` flag: which metric names `/metrics` serves besides kruise-rs's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum MetricsCompat {
    /// kruise-rs's own names only (`kruise_rs_*`).
    None,
    /// Also upstream kruise-manager's (controller-runtime's and `kruise_manager_is_leader`).
    Upstream,
}

async fn async_main(cli: Cli) -> ExitCode {
    if let Err(err) = init_logging(cli.log_format) {
        eprintln!("kruise-rs: {}", error_chain(&err));
        return ExitCode::FAILURE;
    }
    match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            error!("{}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Manager(args) => {
            let args = *args;
            let kube_api_rate = args.api.rate_limit().map_err(anyhow::Error::msg)?;
            let shutdown =
                shutdown_signal().context("cannot install the SIGTERM and SIGINT handlers")?;
            let opts = ManagerOptions {
                kubeconfig: args.kubeconfig,
                probe_addr: args.probe_addr,
                controllers: ControllerOptions {
                    nodeimage_creation_delay: args.nodeimage_creation_delay,
                    nodeimage_response_timeout: args.nodeimage_response_timeout,
                    default_ttl_for_always_nodeimage: Duration::from_secs(
                        args.default_ttl_for_always_nodeimage,
                    ),
                    daemon_config_namespace: args.daemon_config_namespace,
                    namespace: args.webhook.namespace.clone(),
                    label_selector: args.label_selector,
                    max_pulls_per_registry: args.max_pulls_per_registry,
                    sidecarset_predownload: args.sidecarset_predownload,
                    sidecarset_upgradable_condition_on_upgrade: args
                        .sidecarset_upgradable_condition_on_upgrade,
                    workers: args.api.workers(),
                    upstream_metric_names: args.metrics_compat == MetricsCompat::Upstream,
                    // The manager puts in the set its /metrics serves, the mode it detects and
                    // the readiness it waits for.
                    ..Default::default()
                },
                streaming_lists: args.streaming_lists,
                leader_election: args.leader_election.options(&args.webhook.namespace),
                webhook: args.webhook.options(),
                kube_api_rate,
            };
            manager::run(opts, shutdown, None).await?;
            Ok(())
        }
        Command::Daemon(args) => {
            let shutdown =
                shutdown_signal().context("cannot install the SIGTERM and SIGINT handlers")?;
            daemon::run(args.options().map_err(anyhow::Error::msg)?, shutdown, None).await?;
            Ok(())
        }
        Command::Crds(CrdsArgs {
            install: true,
            kubeconfig,
            timeout,
            ..
        }) => {
            let client = kruise_rs_kube::connect(kubeconfig.as_deref()).await?;
            let outcomes = kruise_rs::manager::crd_install::install(&client, timeout)
                .await
                .context("cannot install the CRDs")?;
            let mut stdout = std::io::stdout().lock();
            for outcome in outcomes {
                writeln!(stdout, "{outcome}").context("cannot write to stdout")?;
            }
            Ok(())
        }
        Command::Crds(CrdsArgs {
            out_dir: Some(dir), ..
        }) => kruise_rs_api::crd::write_all(&dir)
            .with_context(|| format!("cannot write the CRDs into {}", dir.display())),
        Command::Crds(CrdsArgs { out_dir: None, .. }) => {
            let yaml = kruise_rs_api::crds_yaml();
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(yaml.as_bytes())
                .and_then(|()| stdout.flush())
            {
                // The reader stopped early (`kruise-rs crds | head`): its choice, not our failure.
                Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                result => result.context("cannot write the CRDs to stdout"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn manager_defaults() {
        let cli = Cli::try_parse_from(["kruise-rs", "manager"]).unwrap();
        let Command::Manager(args) = cli.command else {
            panic!("not the manager: {:?}", cli.command);
        };
        assert_eq!(args.probe_addr, "0.0.0.0:8080".parse().unwrap());
        assert_eq!(args.kubeconfig, None);
        let election = args
            .leader_election
            .options("kruise-system")
            .expect("leader election is on by default");
        assert_eq!(election.lease_name, "kruise-rs-manager");
        assert_eq!(election.namespace, "kruise-system");
        assert_eq!(election.lease_duration, Duration::from_secs(15));
        assert_eq!(election.renew_deadline, Duration::from_secs(10));
        assert_eq!(election.retry_period, Duration::from_secs(2));
        assert!(!election.identity.is_empty());
        assert_eq!(election.check(), Ok(()));
    }

    fn manager_args(flags: &[&str]) -> ManagerArgs {
        let cli = Cli::try_parse_from(["kruise-rs", "manager"].iter().chain(flags)).unwrap();
        let Command::Manager(args) = cli.command else {
            panic!("not the manager: {:?}", cli.command);
        };
        *args
    }

    #[test]
    fn webhook_selector_and_grace_flags() {
        let args = manager_args(&[
            "--webhook-shutdown-grace=3s",
            r#"--webhook-pod-object-selector={"matchLabels":{"inject":"yes"}}"#,
            r#"--webhook-namespace-selector={"matchExpressions":[{"key":"team","operator":"Exists"}]}"#,
        ]);
        let opts = args.webhook.options().expect("webhooks on");
        assert_eq!(opts.shutdown_grace, Duration::from_secs(3));
        let object = opts.pod_object_selector.expect("object selector");
        assert_eq!(object.match_labels.unwrap()["inject"], "yes");
        let namespace = opts.pod_namespace_selector.expect("namespace selector");
        assert_eq!(namespace.match_expressions.unwrap()[0].operator, "Exists");
        assert!(
            Cli::try_parse_from([
                "kruise-rs",
                "manager",
                "--webhook-pod-object-selector=team=a"
            ])
            .is_err()
        );
        let defaults = manager_args(&[]).webhook.options().expect("webhooks on");
        assert_eq!(defaults.shutdown_grace, Duration::from_secs(10));
        assert!(
            defaults.pod_object_selector.is_none() && defaults.pod_namespace_selector.is_none()
        );
    }

    #[test]
    fn unreadable_sidecarsets_admit_unless_told_to_refuse() {
        let policy = |flags: &[&str]| {
            manager_args(flags)
                .webhook
                .options()
                .expect("webhooks on")
                .unreadable_sidecarset_policy
        };
        assert_eq!(policy(&[]), UnreadableSidecarSetPolicy::Admit);
        assert_eq!(
            policy(&["--unreadable-sidecarset-policy=refuse"]),
            UnreadableSidecarSetPolicy::Refuse
        );
        assert_eq!(
            policy(&["--unreadable-sidecarset-policy", "admit"]),
            UnreadableSidecarSetPolicy::Admit
        );
        assert!(
            Cli::try_parse_from([
                "kruise-rs",
                "manager",
                "--unreadable-sidecarset-policy=ignore"
            ])
            .is_err()
        );
    }

    #[test]
    fn the_sidecarset_cache_is_confirmed_unless_told_not_to() {
        let reads = |flags: &[&str]| {
            manager_args(flags)
                .webhook
                .options()
                .expect("webhooks on")
                .sidecarset_cache_reads
        };
        assert_eq!(reads(&[]), SidecarSetCacheReads::Confirmed);
        assert_eq!(
            reads(&["--sidecarset-cache-fence"]),
            SidecarSetCacheReads::Confirmed
        );
        assert_eq!(
            reads(&["--sidecarset-cache-fence=false"]),
            SidecarSetCacheReads::AsTheyStand
        );
        assert!(
            Cli::try_parse_from(["kruise-rs", "manager", "--sidecarset-cache-fence=sometimes"])
                .is_err()
        );
    }

    #[test]
    fn leader_election_flags() {
        let on = manager_args(&["--leader-elect"]);
        assert!(on.leader_election.leader_elect);
        let off = manager_args(&["--leader-elect=false"]);
        assert_eq!(off.leader_election.options("ns"), None);
        let tuned = manager_args(&[
            "--namespace",
            "ops",
            "--leader-election-id",
            "my-lease",
            "--leader-election-lease-duration",
            "30s",
            "--leader-election-renew-deadline",
            "20s",
            "--leader-election-retry-period",
            "500ms",
        ]);
        let namespace = tuned.webhook.namespace.clone();
        let election = tuned.leader_election.options(&namespace).unwrap();
        assert_eq!(election.lease_name, "my-lease");
        assert_eq!(election.namespace, "ops");
        assert_eq!(election.lease_duration, Duration::from_secs(30));
        assert_eq!(election.renew_deadline, Duration::from_secs(20));
        assert_eq!(election.retry_period, Duration::from_millis(500));
        assert!(election.warm_standby, "warm by default");
        let cold = manager_args(&["--standby-caches=cold"]);
        assert!(!cold.leader_election.options("ns").unwrap().warm_standby);
        assert!(Cli::try_parse_from(["kruise-rs", "manager", "--leader-elect=maybe"]).is_err());
        assert!(Cli::try_parse_from(["kruise-rs", "manager", "--standby-caches=hot"]).is_err());
    }

    #[test]
    fn api_rate_and_workers_have_their_defaults_and_take_upstreams_flag_names() {
        let defaults = manager_args(&[]);
        assert_eq!(
            defaults.api.rate_limit(),
            Ok(Some(RateLimit {
                qps: 500.0,
                burst: 1000
            }))
        );
        assert_eq!(defaults.api.workers(), Workers::default());
        assert_eq!(defaults.api.workers().sidecarset, 3);
        let tuned = manager_args(&[
            "--kube-api-qps",
            "5",
            "--kube-api-burst",
            "10",
            "--sidecarset-workers",
            "1",
            "--imagepulljob-workers",
            "2",
            "--imagelistpulljob-workers",
            "4",
            "--nodeimage-workers",
            "8",
        ]);
        assert_eq!(
            tuned.api.rate_limit(),
            Ok(Some(RateLimit {
                qps: 5.0,
                burst: 10
            }))
        );
        assert_eq!(
            tuned.api.workers(),
            Workers {
                sidecarset: 1,
                imagepulljob: 2,
                imagelistpulljob: 4,
                nodeimage: 8
            }
        );
        let upstream = manager_args(&["--rest-config-qps=300", "--rest-config-burst=500"]);
        assert_eq!(
            upstream.api.rate_limit(),
            Ok(Some(RateLimit {
                qps: 300.0,
                burst: 500
            }))
        );
        assert_eq!(
            manager_args(&["--kube-api-qps", "0"]).api.rate_limit(),
            Ok(None)
        );
        assert!(
            manager_args(&["--kube-api-qps=-1"])
                .api
                .rate_limit()
                .is_err()
        );
        assert!(Cli::try_parse_from(["kruise-rs", "manager", "--nodeimage-workers", "0"]).is_err());
    }

    #[test]
    fn no_registry_budget_unless_given() {
        assert_eq!(manager_args(&[]).max_pulls_per_registry, 0);
        assert_eq!(
            manager_args(&["--max-pulls-per-registry=20"]).max_pulls_per_registry,
            20
        );
        assert!(
            Cli::try_parse_from(["kruise-rs", "manager", "--max-pulls-per-registry", "-1"])
                .is_err()
        );
    }

    #[test]
    fn sidecarset_predownload_is_on_unless_turned_off() {
        assert!(manager_args(&[]).sidecarset_predownload);
        assert!(manager_args(&["--sidecarset-predownload"]).sidecarset_predownload);
        assert!(manager_args(&["--sidecarset-predownload=true"]).sidecarset_predownload);
        assert!(!manager_args(&["--sidecarset-predownload=false"]).sidecarset_predownload);
        for bad in [
            "--sidecarset-predownload=off",
            "--sidecarset-predownload=maybe",
        ] {
            assert!(
                Cli::try_parse_from(["kruise-rs", "manager", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_upgradable_condition_on_upgrade_is_off_unless_turned_on() {
        let on = |flags: &[&str]| manager_args(flags).sidecarset_upgradable_condition_on_upgrade;
        assert!(!on(&[]));
        assert!(on(&["--sidecarset-upgradable-condition-on-upgrade"]));
        assert!(on(&["--sidecarset-upgradable-condition-on-upgrade=true"]));
        assert!(!on(&["--sidecarset-upgradable-condition-on-upgrade=false"]));
    }

    #[test]
    fn patch_pod_metadata_defaults_are_refused_unless_allowed() {
        let allowed = |flags: &[&str]| {
            manager_args(flags)
                .webhook
                .options()
                .expect("webhooks on")
                .patch_pod_metadata_defaults_allowed
        };
        assert!(!allowed(&[]));
        assert!(allowed(&[
            "--sidecarset-patch-pod-metadata-defaults-allowed"
        ]));
        assert!(allowed(&[
            "--sidecarset-patch-pod-metadata-defaults-allowed=true"
        ]));
        assert!(!allowed(&[
            "--sidecarset-patch-pod-metadata-defaults-allowed=false"
        ]));
        assert!(
            Cli::try_parse_from([
                "kruise-rs",
                "manager",
                "--sidecarset-patch-pod-metadata-defaults-allowed=yes"
            ])
            .is_err()
        );
    }

    #[test]
    fn upstream_metric_names_only_when_asked() {
        assert_eq!(manager_args(&[]).metrics_compat, MetricsCompat::None);
        assert_eq!(
            manager_args(&["--metrics-compat=upstream"]).metrics_compat,
            MetricsCompat::Upstream
        );
        assert!(
            Cli::try_parse_from(["kruise-rs", "manager", "--metrics-compat=prometheus"]).is_err()
        );
    }

    #[test]
    fn sidecar_containers_are_sorted_by_name_only_when_asked() {
        let sorted = |flags: &[&str]| {
            manager_args(flags)
                .webhook
                .options()
                .expect("webhooks on")
                .sort_sidecar_containers_by_name
        };
        assert!(!sorted(&[]));
        assert!(sorted(&["--sidecarset-sort-containers-by-name"]));
        assert!(sorted(&["--sidecarset-sort-containers-by-name=true"]));
        assert!(!sorted(&["--sidecarset-sort-containers-by-name=false"]));
    }

    #[test]
    fn daemon_flags_and_defaults() {
        let cli = Cli::try_parse_from(["kruise-rs", "daemon", "--node-name", "n1"]).unwrap();
        let Command::Daemon(args) = cli.command else {
            panic!("not the daemon: {:?}", cli.command);
        };
        assert_eq!(args.node_name, "n1");
        assert_eq!(args.max_concurrent_pulls, 2);
        assert_eq!(args.host_run_dir, PathBuf::from("/var/run"));
        assert_eq!(args.cri_socket, None);
        assert_eq!(
            args.cri_liveness_timeout,
            kruise_rs_daemon::DEFAULT_CRI_LIVENESS_TIMEOUT
        );
        assert_eq!(args.plugin_config_file, None);
        assert_eq!(args.plugin_bin_dir, PathBuf::from("/kruise/plugins"));
        let cli = Cli::try_parse_from([
            "kruise-rs",
            "daemon",
            "--node-name",
            "n1",
            "--plugin-config-file",
            "/etc/kruise/providers.yaml",
            "--plugin-bin-dir",
            "/opt/plugins",
        ])
        .unwrap();
        let Command::Daemon(args) = cli.command else {
            panic!("not the daemon: {:?}", cli.command);
        };
        assert_eq!(
            args.plugin_config_file,
            Some(PathBuf::from("/etc/kruise/providers.yaml"))
        );
        assert_eq!(args.plugin_bin_dir, PathBuf::from("/opt/plugins"));
        let zero = [
            "kruise-rs",
            "daemon",
            "--node-name",
            "n1",
            "--max-concurrent-pulls",
            "0",
        ];
        assert!(Cli::try_parse_from(zero).is_err());
    }

    fn daemon_args(flags: &[&str]) -> Result<kruise_rs_daemon::DaemonArgs, clap::Error> {
        let cli = Cli::try_parse_from(
            ["kruise-rs", "daemon", "--node-name", "n1"]
                .iter()
                .chain(flags),
        )?;
        let Command::Daemon(args) = cli.command else {
            panic!("not the daemon: {:?}", cli.command);
        };
        Ok(args)
    }

    #[test]
    fn the_daemon_takes_upstreams_flag_names() {
        // What upstream's kruise-daemon DaemonSet passes.
        let options = daemon_args(&[
            "--max-workers-for-pull-image=5",
            "--rest-config-qps=7",
            "--rest-config-burst=9",
            "--socket-file=containerd/containerd.sock",
            "--host-run-dir=/hostvarrun",
        ])
        .unwrap()
        .options()
        .unwrap();
        assert_eq!(options.max_concurrent_pulls, 5);
        assert_eq!(
            options.kube_api_rate,
            kruise_rs_kube::RateLimit::from_flags(7.0, 9).unwrap()
        );
        assert_eq!(
            options.cri_socket,
            Some(PathBuf::from("/hostvarrun/containerd/containerd.sock"))
        );
        // Upstream's default -1: no bound.
        let unbounded = daemon_args(&["--max-workers-for-pull-image", "-1"]).unwrap();
        assert_eq!(unbounded.max_concurrent_pulls, u16::MAX);
        for bad in ["-2", "0", "65536", "two"] {
            let err = daemon_args(&["--max-workers-for-pull-image", bad]).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        // A socket outside the host run dir is --cri-socket's job, and both at once is an error.
        for outside in ["/run/containerd.sock", "../containerd.sock", "./"] {
            let err = daemon_args(&["--socket-file", outside])
                .unwrap()
                .options()
                .unwrap_err();
            assert!(
                err.contains("--socket-file") && err.contains("--cri-socket"),
                "{err}"
            );
        }
        assert!(daemon_args(&["--socket-file=a.sock", "--cri-socket=/b.sock"]).is_err());
    }

    #[test]
    fn the_image_fs_limit_defaults_to_the_kubelets_and_stays_a_percent() {
        let default = daemon_args(&[]).unwrap().options().unwrap();
        assert_eq!(default.image_fs_high_percent, 85);
        let off = daemon_args(&["--image-fs-high-threshold-percent=100"]).unwrap();
        assert_eq!(off.options().unwrap().image_fs_high_percent, 100);
        for bad in ["0", "101", "85%"] {
            let err = daemon_args(&["--image-fs-high-threshold-percent", bad]).unwrap_err();
            assert!(
                err.to_string()
                    .contains("--image-fs-high-threshold-percent"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn log_format_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "kruise-rs",
            "manager",
            "--log-format",
            "json",
            "--kubeconfig",
            "/tmp/k",
            "--probe-addr",
            "127.0.0.1:0",
        ])
        .unwrap();
        assert_eq!(cli.log_format, LogFormat::Json);
    }

    fn crds_args(flags: &[&str]) -> Result<CrdsArgs, clap::Error> {
        let cli = Cli::try_parse_from(["kruise-rs", "crds"].iter().chain(flags))?;
        let Command::Crds(args) = cli.command else {
            panic!("not crds: {:?}", cli.command);
        };
        Ok(args)
    }

    #[test]
    fn crds_prints_or_writes_a_directory() {
        let print = crds_args(&[]).unwrap();
        assert!(print.out_dir.is_none() && !print.install);
        let write = crds_args(&["--out-dir", "crds"]).unwrap();
        assert_eq!(write.out_dir.as_deref(), Some(std::path::Path::new("crds")));
        assert!(!write.install);
    }

    #[test]
    fn crds_install_takes_a_kubeconfig_and_a_timeout() {
        let install = crds_args(&["--install"]).unwrap();
        assert!(install.install);
        assert_eq!(install.kubeconfig, None);
        assert_eq!(install.timeout, Duration::from_secs(60));
        let tuned = crds_args(&["--install", "--kubeconfig", "/tmp/k", "--timeout", "2m"]).unwrap();
        assert_eq!(
            tuned.kubeconfig.as_deref(),
            Some(std::path::Path::new("/tmp/k"))
        );
        assert_eq!(tuned.timeout, Duration::from_secs(120));
        // Installing and writing files are different commands; the cluster flags need --install.
        assert!(crds_args(&["--install", "--out-dir", "crds"]).is_err());
        assert!(crds_args(&["--kubeconfig", "/tmp/k"]).is_err());
        assert!(crds_args(&["--timeout", "5s"]).is_err());
    }

    #[test]
    fn error_chain_skips_repeated_causes() {
        let inner = std::io::Error::other("disk on fire");
        let err = anyhow::Error::new(inner)
            .context("failed to read x: disk on fire")
            .context("cannot start");
        assert_eq!(
            error_chain(&err),
            "cannot start: failed to read x: disk on fire"
        );
    }
}
