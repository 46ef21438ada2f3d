//! A recording proxy for the CRI `ImageService`: the node daemon under test talks to
//! [`CriProxy::socket`] instead of containerd's socket, every call is forwarded to containerd
//! unchanged (errors included), and the test reads back what was asked.
//!
//! The proxy runs on a thread and runtime of its own, so it keeps serving while the test's
//! runtime is busy or blocked (a daemon child process does not stall on the test).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::{
    ImageFsInfoRequest, ImageFsInfoResponse, ImageStatusRequest, ImageStatusResponse,
    ListImagesRequest, ListImagesResponse, PullImageRequest, PullImageResponse, RemoveImageRequest,
    RemoveImageResponse,
};
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

/// A channel to the CRI server on the unix socket `socket`. Lazy: it connects on the first call
/// and reconnects on a later call after the server went away (a call made while it is down fails
/// with `Unavailable`). Needs a tokio runtime.
pub(crate) fn cri_channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::from_static("http://[::]").connect_with_connector_lazy(tower::service_fn(
        move |_: Uri| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        },
    ))
}

/// An `ImageService` client for the CRI server on the unix socket `socket` (see [`cri_channel`]).
pub(crate) fn image_client(socket: &Path) -> ImageServiceClient<Channel> {
    ImageServiceClient::new(cri_channel(socket))
}

#[derive(Debug, Default)]
struct Record {
    pulls: Vec<PullImageRequest>,
    calls: HashMap<&'static str, usize>,
}

/// The recording proxy; stops (and removes its socket) when dropped.
pub(crate) struct CriProxy {
    socket: PathBuf,
    record: Arc<Mutex<Record>>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl CriProxy {
    /// Serve the `ImageService` on a new unix socket, forwarding to the CRI server at
    /// `upstream_socket` (which need not be up yet, and may go away and come back).
    pub(crate) fn start(upstream_socket: &Path) -> CriProxy {
        let dir = tempfile::Builder::new()
            .prefix("kruise-rs-cri-proxy-")
            .tempdir()
            .expect("a temporary directory for the proxy socket");
        let socket = dir.path().join("cri.sock");
        // Bound here, so the socket accepts connections as soon as `start` returns.
        let listener = std::os::unix::net::UnixListener::bind(&socket)
            .unwrap_or_else(|e| panic!("binding {}: {e}", socket.display()));
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let record = Arc::new(Mutex::new(Record::default()));
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let upstream = upstream_socket.to_path_buf();
        let forwarder_record = Arc::clone(&record);
        let thread = std::thread::Builder::new()
            .name("cri-proxy".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the CRI proxy");
                runtime.block_on(async move {
                    let listener = tokio::net::UnixListener::from_std(listener)
                        .expect("a tokio unix listener");
                    let incoming = futures::stream::unfold(listener, |listener| async move {
                        let next = listener.accept().await.map(|(stream, _)| stream);
                        Some((next, listener))
                    });
                    let forwarder = Forwarder {
                        upstream: image_client(&upstream),
                        record: forwarder_record,
                    };
                    let server = Server::builder()
                        .serve_with_incoming(ImageServiceServer::new(forwarder), incoming);
                    // Dropping the server (rather than a graceful shutdown) does not wait for
                    // clients to hang up; the runtime's end cancels the open connections.
                    tokio::select! {
                        result = server => {
                            if let Err(e) = result {
                                eprintln!("cri proxy: serving failed: {e}");
                            }
                        }
                        _ = shutdown_rx => {}
                    }
                });
            })
            .expect("the CRI proxy thread starts");
        CriProxy {
            socket,
            record,
            shutdown: Some(shutdown),
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// The proxy's unix socket, to give to the daemon in place of containerd's.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Every `PullImage` request received so far, oldest first.
    pub(crate) fn pull_requests(&self) -> Vec<PullImageRequest> {
        self.record.lock().expect("record lock").pulls.clone()
    }

    /// How often `method` was called, by its gRPC name: `PullImage`, `ImageStatus`,
    /// `ListImages`, `RemoveImage`, `ImageFsInfo`.
    pub(crate) fn calls(&self, method: &str) -> usize {
        let record = self.record.lock().expect("record lock");
        record.calls.get(method).copied().unwrap_or(0)
    }
}

impl Drop for CriProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Forwarder {
    upstream: ImageServiceClient<Channel>,
    record: Arc<Mutex<Record>>,
}

impl Forwarder {
    fn count(&self, method: &'static str) {
        *self
            .record
            .lock()
            .expect("record lock")
            .calls
            .entry(method)
            .or_default() += 1;
    }
}

/// Only the message is forwarded (CRI uses no metadata); a `Status` from containerd or from the
/// connection to it is returned as it is.
#[tonic::async_trait]
impl ImageService for Forwarder {
    async fn list_images(
        &self,
        request: Request<ListImagesRequest>,
    ) -> Result<Response<ListImagesResponse>, Status> {
        self.count("ListImages");
        let response = self
            .upstream
            .clone()
            .list_images(request.into_inner())
            .await?;
        Ok(Response::new(response.into_inner()))
    }

    async fn image_status(
        &self,
        request: Request<ImageStatusRequest>,
    ) -> Result<Response<ImageStatusResponse>, Status> {
        self.count("ImageStatus");
        let response = self
            .upstream
            .clone()
            .image_status(request.into_inner())
            .await?;
        Ok(Response::new(response.into_inner()))
    }

    async fn pull_image(
        &self,
        request: Request<PullImageRequest>,
    ) -> Result<Response<PullImageResponse>, Status> {
        let request = request.into_inner();
        {
            let mut record = self.record.lock().expect("record lock");
            *record.calls.entry("PullImage").or_default() += 1;
            record.pulls.push(request.clone());
        }
        let response = self.upstream.clone().pull_image(request).await?;
        Ok(Response::new(response.into_inner()))
    }

    async fn remove_image(
        &self,
        request: Request<RemoveImageRequest>,
    ) -> Result<Response<RemoveImageResponse>, Status> {
        self.count("RemoveImage");
        let response = self
            .upstream
            .clone()
            .remove_image(request.into_inner())
            .await?;
        Ok(Response::new(response.into_inner()))
    }

    async fn image_fs_info(
        &self,
        request: Request<ImageFsInfoRequest>,
    ) -> Result<Response<ImageFsInfoResponse>, Status> {
        self.count("ImageFsInfo");
        let response = self
            .upstream
            .clone()
            .image_fs_info(request.into_inner())
            .await?;
        Ok(Response::new(response.into_inner()))
    }
}
