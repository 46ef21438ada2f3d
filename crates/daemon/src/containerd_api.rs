//! containerd's own gRPC services (images, content), which containerd serves on the same socket
//! as CRI: the daemon reaches them over the CRI channel it already has, in CRI's namespace
//! `k8s.io`, so it mounts nothing more (decision 0036). The messages are declared by hand with
//! prost, field by field as containerd's protos number them, where they are used.

use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

/// The containerd namespace CRI keeps its images and content in.
const NAMESPACE: &str = "k8s.io";
/// How long one call may take: a runtime that accepts and never answers does not keep a worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of containerd's services on the runtime's socket.
#[derive(Clone, Debug)]
pub(crate) struct ContainerdApi {
    channel: Channel,
    timeout: Duration,
}

impl ContainerdApi {
    pub(crate) fn new(channel: Channel) -> Self {
        Self::with_timeout(channel, CALL_TIMEOUT)
    }

    pub(crate) fn with_timeout(channel: Channel, timeout: Duration) -> Self {
        Self { channel, timeout }
    }

    fn request<Req>(message: Req) -> tonic::Request<Req> {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert("containerd-namespace", NAMESPACE.parse().expect("ASCII"));
        request
    }

    async fn ready(&self) -> Result<tonic::client::Grpc<Channel>, tonic::Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| {
            tonic::Status::unavailable(format!("containerd's API is not ready: {e}"))
        })?;
        Ok(grpc)
    }

    fn timed_out(&self, method: &str) -> tonic::Status {
        tonic::Status::deadline_exceeded(format!(
            "{method} did not answer within {:?}",
            self.timeout
        ))
    }

    /// One unary call of `method` (`/package.Service/Method`).
    pub(crate) async fn unary<Req, Resp>(
        &self,
        method: &'static str,
        message: Req,
    ) -> Result<Resp, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let call = async {
            let mut grpc = self.ready().await?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            let path = PathAndQuery::from_static(method);
            Ok(grpc
                .unary(Self::request(message), path, codec)
                .await?
                .into_inner())
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(method)))
    }

    /// A server-streaming call of `method`, every message of the stream collected (each of the
    /// daemon's is small: a page of content infos, a chunk of a manifest).
    pub(crate) async fn collect<Req, Resp>(
        &self,
        method: &'static str,
        message: Req,
    ) -> Result<Vec<Resp>, tonic::Status>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let call = async {
            let mut grpc = self.ready().await?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            let path = PathAndQuery::from_static(method);
            let mut stream = grpc
                .server_streaming(Self::request(message), path, codec)
                .await?
                .into_inner();
            let mut all = Vec::new();
            while let Some(next) = stream.message().await? {
                all.push(next);
            }
            Ok(all)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|_| Err(self.timed_out(method)))
    }
}
