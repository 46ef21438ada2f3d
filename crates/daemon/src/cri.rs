//! The node's CRI ImageService, reached over its unix socket.
//!
//! Only the image half of CRI is used: `PullImage`, `ImageStatus` (which answers for tags and
//! digests alike, so `IfNotPresent` needs no client-side name matching) and `ImageFsInfo`, the
//! cheapest call that proves the image service answers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{
    AuthConfig, ImageFsInfoRequest, ImageSpec, ImageStatusRequest, PodSandboxConfig,
    PullImageRequest,
};
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use kruise_rs_kube::error_chain::error_chain;

/// Sockets tried, relative to the host's run directory, when none is given: containerd, CRI-O,
/// cri-dockerd, each at its flat and its nested path (upstream kruise-daemon's list).
pub const CANDIDATE_SOCKETS: &[&str] = &[
    "containerd/containerd.sock",
    "containerd.sock",
    "crio/crio.sock",
    "crio.sock",
    "cri-dockerd.sock",
    "cri-dockerd/cri-dockerd.sock",
];

/// How long connecting to a socket and the probe call may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// CRI responses (ImageStatus with its info map) can be large; the kubelet allows 16 MiB.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// A CRI call that failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{message}")]
pub struct CriError {
    /// The runtime's own text (or the transport's, when the call never reached it).
    pub message: String,
    /// The runtime could not be reached (the connection failed or broke), so the call says
    /// nothing about the image: the runtime is down or restarting.
    pub unreachable: bool,
}

impl CriError {
    /// A failure the runtime reported, or one of ours: not a sign that the runtime is down.
    pub fn answered(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            unreachable: false,
        }
    }
}

impl From<tonic::Status> for CriError {
    fn from(status: tonic::Status) -> Self {
        let message = if status.message().is_empty() {
            format!("CRI call failed: {:?}", status.code())
        } else {
            status.message().to_owned()
        };
        Self {
            message,
            unreachable: is_unreachable(&status),
        }
    }
}

/// Whether the call failed on the connection rather than in the runtime. A status the runtime
/// sent carries no source, whatever its code (even `Unavailable`, which a runtime may send about
/// a registry): that is its verdict on the pull. tonic builds a status from a connection that
/// could not be made (`Unavailable`, over a [`tonic::ConnectError`]) or that broke mid-call (a
/// transport error, often `Unknown`), and keeps that error as the source; an I/O error down its
/// chain is what tells the two kinds apart from codec errors.
fn is_unreachable(status: &tonic::Status) -> bool {
    use std::error::Error;
    let mut source = status.source();
    while let Some(err) = source {
        if err.is::<tonic::ConnectError>() || err.is::<std::io::Error>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// No CRI image service could be reached.
#[derive(Debug, thiserror::Error)]
#[error("no CRI image service answered; tried: {}", tried.iter().map(|(path, why)| format!("{} ({why})", path.display())).collect::<Vec<_>>().join(", "))]
pub struct DetectError {
    /// Every socket tried, with why it was refused.
    pub tried: Vec<(PathBuf, String)>,
}

/// A connected image service. Cheap to clone; a dropped connection is re-established on the
/// next call (a runtime restart needs nothing from us).
#[derive(Clone, Debug)]
pub struct Cri {
    socket: PathBuf,
    client: ImageServiceClient<Channel>,
    channel: Channel,
}

/// What the runtime says about one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PresentImage {
    /// The runtime's image id (`sha256:` of the config).
    pub id: String,
    /// `name@sha256:…` references the image is known by.
    pub repo_digests: Vec<String>,
}

impl Cri {
    /// Connects to `socket` and checks that the image service answers.
    pub async fn connect(socket: &Path) -> Result<Self, CriError> {
        let path = socket.to_owned();
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        });
        // The URI is required by the API and ignored by the connector.
        let channel = Endpoint::from_static("http://[::1]:50051")
            .connect_timeout(CONNECT_TIMEOUT)
            .connect_with_connector(connector)
            .await
            .map_err(|err| CriError {
                message: format!("cannot connect: {}", error_chain(&err)),
                unreachable: true,
            })?;
        let client = ImageServiceClient::new(channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let cri = Self {
            socket: socket.to_owned(),
            client,
            channel,
        };
        cri.check().await?;
        Ok(cri)
    }

    /// The given socket only, or else the first of [`CANDIDATE_SOCKETS`] under `run_dir` that
    /// answers. The error lists every path tried and why it was refused.
    pub async fn detect(socket: Option<&Path>, run_dir: &Path) -> Result<Self, DetectError> {
        let candidates: Vec<PathBuf> = match socket {
            Some(socket) => vec![socket.to_owned()],
            None => CANDIDATE_SOCKETS.iter().map(|s| run_dir.join(s)).collect(),
        };
        let mut tried = Vec::new();
        for path in candidates {
            if !path.exists() {
                tried.push((path, "no such file".to_owned()));
                continue;
            }
            match Self::connect(&path).await {
                Ok(cri) => return Ok(cri),
                Err(err) => tried.push((path, err.message)),
            }
        }
        Err(DetectError { tried })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// containerd's images API on the same socket (for pins).
    pub(crate) fn containerd_images(&self) -> super::pin::ContainerdImages {
        super::pin::ContainerdImages::new(self.containerd_api())
    }

    /// The connection to the runtime, for its other services.
    pub(crate) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// containerd's own services on the same socket.
    pub(crate) fn containerd_api(&self) -> super::containerd_api::ContainerdApi {
        super::containerd_api::ContainerdApi::new(self.channel.clone())
    }

    /// Whether the image service answers (`ImageFsInfo`) within the connect timeout: a runtime
    /// that hangs does not answer either.
    pub async fn check(&self) -> Result<(), CriError> {
        let mut client = self.client.clone();
        let call = client.image_fs_info(ImageFsInfoRequest {});
        match tokio::time::timeout(CONNECT_TIMEOUT, call).await {
            Ok(answer) => answer.map(drop).map_err(CriError::from),
            Err(_elapsed) => Err(CriError {
                message: format!("ImageFsInfo did not answer within {CONNECT_TIMEOUT:?}"),
                unreachable: true,
            }),
        }
    }

    /// Where the runtime keeps its images: the mountpoints `ImageFsInfo` names (paths on the
    /// host).
    pub async fn image_filesystems(&self) -> Result<Vec<String>, CriError> {
        let response = self
            .client
            .clone()
            .image_fs_info(ImageFsInfoRequest {})
            .await?
            .into_inner();
        Ok(response
            .image_filesystems
            .into_iter()
            .filter_map(|fs| fs.fs_id.map(|id| id.mountpoint))
            .filter(|m| !m.is_empty())
            .collect())
    }

    /// `ImageStatus` of `image` (a tag or digest reference); `None` when the runtime lacks it.
    pub async fn image_status(&self, image: &str) -> Result<Option<PresentImage>, CriError> {
        let response = self
            .client
            .clone()
            .image_status(ImageStatusRequest {
                image: Some(image_spec(image)),
                verbose: false,
            })
            .await?
            .into_inner();
        Ok(response.image.map(|image| PresentImage {
            id: image.id,
            repo_digests: image.repo_digests,
        }))
    }

    /// `PullImage`; returns the runtime's image reference (its image id for containerd).
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<AuthConfig>,
        sandbox: PodSandboxConfig,
    ) -> Result<String, CriError> {
        let response = self
            .client
            .clone()
            .pull_image(PullImageRequest {
                image: Some(image_spec(image)),
                auth,
                sandbox_config: Some(sandbox),
            })
            .await?
            .into_inner();
        Ok(response.image_ref)
    }
}

fn image_spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_owned(),
        ..ImageSpec::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn detection_lists_every_path_tried_and_why() {
        let dir = tempfile::tempdir().unwrap();
        // A plain file where a socket is expected: connecting fails.
        std::fs::create_dir_all(dir.path().join("containerd")).unwrap();
        std::fs::write(dir.path().join("containerd/containerd.sock"), b"").unwrap();
        let err = Cri::detect(None, dir.path()).await.unwrap_err();
        assert_eq!(err.tried.len(), CANDIDATE_SOCKETS.len());
        let text = err.to_string();
        for candidate in CANDIDATE_SOCKETS {
            assert!(
                text.contains(&*dir.path().join(candidate).to_string_lossy()),
                "{text}"
            );
        }
        assert!(text.contains("crio.sock (no such file)"), "{text}");
        assert!(text.contains("containerd.sock (cannot connect"), "{text}");
    }

    #[tokio::test]
    async fn a_given_socket_is_the_only_one_tried() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("missing.sock");
        let err = Cri::detect(Some(&socket), Path::new("/run"))
            .await
            .unwrap_err();
        assert_eq!(err.tried, vec![(socket, "no such file".to_owned())]);
    }

    /// A connection to `socket` whose next call fails as the test's `server` makes it.
    async fn call_through(socket: &Path) -> CriError {
        let channel =
            Endpoint::from_static("http://[::1]:50051").connect_with_connector_lazy({
                let path = socket.to_owned();
                tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                })
            });
        let cri = Cri {
            socket: socket.to_owned(),
            client: ImageServiceClient::new(channel.clone()),
            channel,
        };
        cri.image_status("x").await.unwrap_err()
    }

    #[tokio::test]
    async fn a_runtime_that_is_not_listening_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let err = call_through(&dir.path().join("gone.sock")).await;
        assert!(err.unreachable, "{err:?}");
    }

    #[tokio::test]
    async fn a_runtime_that_dies_mid_call_is_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("dies.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        // Accepts, reads the start of the call, and closes: a runtime killed mid-call.
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let _ = conn.read(&mut buf).await;
        });
        let err = call_through(&socket).await;
        assert!(err.unreachable, "{err:?}");
    }

    #[test]
    fn a_status_the_runtime_sent_is_its_answer_whatever_its_code() {
        for status in [
            tonic::Status::unavailable("registry unavailable"),
            tonic::Status::unknown("failed to resolve reference"),
            tonic::Status::not_found("image not found"),
        ] {
            assert!(!CriError::from(status).unreachable);
        }
    }

    #[test]
    fn a_status_without_message_names_its_code() {
        let err = CriError::from(tonic::Status::unavailable(""));
        assert_eq!(err.message, "CRI call failed: Unavailable");
        let err = CriError::from(tonic::Status::not_found("image \"x\" not found"));
        assert_eq!(err.message, "image \"x\" not found");
    }
}
