//! The Kubernetes client both components start from.

use std::path::{Path, PathBuf};

use kube::{
    Client, Config,
    config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError},
};
use tracing::info;

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

/// Builds a client the way `kube::Client::try_default` does, or from `kubeconfig` when given.
/// Nothing is sent to the API server yet.
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, ConnectError> {
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
    Client::try_from(config).map_err(ConnectError::Client)
}
