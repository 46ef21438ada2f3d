//! The Kubernetes client both components start from.

use std::path::{Path, PathBuf};

use kube::{
    Client, Config,
    client::ClientBuilder,
    config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError},
};
use tracing::info;

use super::rate_limit::{LimitWaits, RateLimit, RateLimitLayer};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot load the kubeconfig {}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error(
        "cannot find Kubernetes credentials: pass --kubeconfig, set KUBECONFIG, provide \
         ~/.kube/config, or run inside a cluster with a service account"
    )]
    InferConfig(#[source] InferConfigError),
    #[error("cannot create the Kubernetes client")]
    Client(#[source] kube::Error),
}

/// Builds a client the way `kube::Client::try_default` does, or from `kubeconfig` when given,
/// without a client-side rate limit. Nothing is sent to the API server yet.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, ConnectError> {
    client(load_config(kubeconfig).await?, None, &LimitWaits::default())
}

/// The client configuration `kube::Client::try_default` would use, or `kubeconfig`'s.
pub async fn load_config(kubeconfig: Option<&Path>) -> Result<Config, ConnectError> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig_error = |source| ConnectError::Kubeconfig {
                path: path.to_owned(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            let mut config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_error)?;
            config.apply_debug_overrides();
            config
        }
        None => Config::infer().await.map_err(ConnectError::InferConfig)?,
    };
    info!(server = %config.cluster_url, "using the Kubernetes API server");
    Ok(config)
}

/// A client for `config` whose requests (all its clones' together) are held to `limit` when
/// given: requests beyond it wait their turn, none fails, and `waits` counts the waiting.
/// Nothing is sent yet.
pub fn client(
    config: Config,
    limit: Option<RateLimit>,
    waits: &LimitWaits,
) -> Result<Client, ConnectError> {
    let builder = ClientBuilder::try_from(config).map_err(ConnectError::Client)?;
    Ok(match limit {
        Some(limit) => builder
            .with_layer(&RateLimitLayer::new(limit, waits.clone()))
            .build(),
        None => builder.build(),
    })
}
