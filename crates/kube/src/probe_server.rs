//! The probe and metrics server: `/healthz`, `/readyz` and `/metrics` over plain HTTP/1.1.

use std::{
    future::Future,
    io,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use tokio::net::TcpListener;

use super::metrics::{self, Metrics};

/// What `/healthz` asks at each request: `Err(why)` answers 503 with `why`.
pub type LivenessCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What the probe handlers read: readiness, liveness and the metrics. Cheap to clone.
#[derive(Clone)]
pub struct ProbeState {
    ready: Arc<AtomicBool>,
    liveness: Option<LivenessCheck>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for ProbeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeState")
            .field("ready", &self.is_ready())
            .field("liveness", &self.liveness.as_ref().map(|_| "check"))
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl ProbeState {
    /// Starts not ready.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        metrics.set_ready(false);
        Self {
            ready: Arc::new(AtomicBool::new(false)),
            liveness: None,
            metrics,
        }
    }

    /// `/healthz` answers 503 while `check` fails; without one it always answers 200.
    pub fn with_liveness(mut self, check: LivenessCheck) -> Self {
        self.liveness = Some(check);
        self
    }

    /// Flips `/readyz` and the `kruise_rs_ready` gauge together.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        self.metrics.set_ready(ready);
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

pub fn router(state: ProbeState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves [`router`] on `listener` until `stop` resolves, then stops accepting and waits for the
/// open connections to finish.
pub async fn serve(
    listener: TcpListener,
    state: ProbeState,
    stop: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(stop)
        .await
}

async fn healthz(State(state): State<ProbeState>) -> (StatusCode, String) {
    match state.liveness.as_deref().map_or(Ok(()), |check| check()) {
        Ok(()) => (StatusCode::OK, "ok".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn readyz(State(state): State<ProbeState>) -> (StatusCode, &'static str) {
    if state.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

async fn metrics(State(state): State<ProbeState>) -> Response {
    match state.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "cannot encode metrics");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics").into_response()
        }
    }
}

/// A minimal HTTP/1.1 client over `tokio::net::TcpStream`, for tests of the probe server.
#[cfg(test)]
pub(crate) mod test_client {
    use std::{io, net::SocketAddr, time::Duration};

    use tokio::net::TcpStream;

    /// `GET path` with `Connection: close`; returns the status code and the body. Panics (it is a
    /// test helper) on I/O errors, a malformed response, or no answer within five seconds.
    pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        tokio::time::timeout(Duration::from_secs(5), exchange(addr, path))
            .await
            .expect("no HTTP response within 5s")
            .expect("HTTP exchange failed")
    }

    async fn exchange(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
        let stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        let mut sent = 0;
        while sent < request.len() {
            stream.writable().await?;
            match stream.try_write(&request.as_bytes()[sent..]) {
                Ok(n) => sent += n,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }
        let mut response = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            stream.readable().await?;
            match stream.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
        }
        let response = String::from_utf8(response)
            .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no end of headers"))?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no status code"))?;
        Ok((status, body.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use tokio::sync::oneshot;

    use super::{test_client::get, *};

    async fn start() -> (
        ProbeState,
        SocketAddr,
        oneshot::Sender<()>,
        tokio::task::JoinHandle<io::Result<()>>,
    ) {
        let state = ProbeState::new(Arc::new(Metrics::new()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state.clone(), async move {
            let _ = stop_rx.await;
        }));
        (state, addr, stop_tx, server)
    }

    #[tokio::test]
    async fn healthz_is_always_ok() {
        let (state, addr, stop, server) = start().await;
        assert_eq!(get(addr, "/healthz").await, (200, "ok".to_owned()));
        state.set_ready(true);
        assert_eq!(get(addr, "/healthz").await, (200, "ok".to_owned()));
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn healthz_follows_a_liveness_check_when_given_one() {
        let live = Arc::new(AtomicBool::new(true));
        let check: LivenessCheck = {
            let live = live.clone();
            Arc::new(move || {
                if live.load(Ordering::SeqCst) {
                    Ok(())
                } else {
                    Err("the runtime is silent".to_owned())
                }
            })
        };
        let state = ProbeState::new(Arc::new(Metrics::new())).with_liveness(check);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, state, async move {
            let _ = stop_rx.await;
        }));
        assert_eq!(get(addr, "/healthz").await, (200, "ok".to_owned()));
        live.store(false, Ordering::SeqCst);
        assert_eq!(
            get(addr, "/healthz").await,
            (503, "the runtime is silent".to_owned())
        );
        live.store(true, Ordering::SeqCst);
        assert_eq!(get(addr, "/healthz").await.0, 200);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn readyz_follows_readiness() {
        let (state, addr, stop, server) = start().await;
        assert_eq!(get(addr, "/readyz").await, (503, "not ready".to_owned()));
        state.set_ready(true);
        assert_eq!(get(addr, "/readyz").await, (200, "ok".to_owned()));
        state.set_ready(false);
        assert_eq!(get(addr, "/readyz").await.0, 503);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn metrics_expose_build_info_and_readiness() {
        let (state, addr, stop, server) = start().await;
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("kruise_rs_build_info{version="), "{body}");
        assert!(body.contains("kruise_rs_ready 0"), "{body}");
        state.set_ready(true);
        assert!(get(addr, "/metrics").await.1.contains("kruise_rs_ready 1"));
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn unknown_path_is_404() {
        let (_state, addr, stop, server) = start().await;
        assert_eq!(get(addr, "/nope").await.0, 404);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn stops_accepting_after_stop() {
        let (_state, addr, stop, server) = start().await;
        assert_eq!(get(addr, "/healthz").await.0, 200);
        stop.send(()).unwrap();
        server.await.unwrap().unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
