//! A slow registry for pull-timing tests and benches: a TCP proxy on loopback that throttles what
//! the registry sends back, and test images with one large random layer (which no compression
//! shrinks), built offline with umoci from the static busybox.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How a slow proxy shares its rate.
#[derive(Clone, Copy, Debug)]
enum Throttle {
    /// Each connection gets the rate: a registry far away.
    PerConnection(usize),
    /// All connections share it: a node's one narrow link.
    Shared(usize),
}

/// A TCP proxy on 127.0.0.1 forwarding to `upstream`, throttling what comes back.
/// `rate` is in bytes per second, per connection.
pub async fn slow_proxy(upstream: SocketAddr, rate: usize) -> SocketAddr {
    proxy(
        upstream,
        Throttle::PerConnection(rate),
        Delivered::default(),
    )
    .await
}

/// [`slow_proxy`], with a log of what it delivered and when: the truth a pull's progress is
/// measured against, whatever pace a busy machine let the proxy keep.
pub async fn slow_proxy_logged(upstream: SocketAddr, rate: usize) -> (SocketAddr, Delivered) {
    let delivered = Delivered::default();
    let addr = proxy(upstream, Throttle::PerConnection(rate), delivered.clone()).await;
    (addr, delivered)
}

/// The same, all connections together at `rate` bytes per second: what one node's link to the
/// registry gives every pull on it at once.
pub async fn slow_link(upstream: SocketAddr, rate: usize) -> SocketAddr {
    proxy(upstream, Throttle::Shared(rate), Delivered::default()).await
}

/// The bytes a proxy has handed to its clients' sockets over time, all connections together
/// (response bytes only: headers and bodies).
#[derive(Clone, Debug, Default)]
pub struct Delivered(Arc<Mutex<Vec<(SystemTime, u64)>>>);

impl Delivered {
    fn add(&self, bytes: usize) {
        let mut log = self.0.lock().expect("the delivery log");
        let total = log.last().map_or(0, |&(_, b)| b) + bytes as u64;
        log.push((SystemTime::now(), total));
    }

    /// All bytes delivered so far.
    pub fn total(&self) -> u64 {
        self.at(SystemTime::now())
    }

    /// The bytes delivered by `when`.
    pub fn at(&self, when: SystemTime) -> u64 {
        let log = self.0.lock().expect("the delivery log");
        let delivered = log.partition_point(|&(t, _)| t <= when);
        delivered.checked_sub(1).map_or(0, |i| log[i].1)
    }

    /// When the bytes delivered first reached `bytes`, if they have.
    pub fn reached(&self, bytes: u64) -> Option<SystemTime> {
        let log = self.0.lock().expect("the delivery log");
        log.iter().find(|&&(_, b)| b >= bytes).map(|&(t, _)| t)
    }
}

async fn proxy(upstream: SocketAddr, throttle: Throttle, delivered: Delivered) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding the proxy");
    let addr = listener.local_addr().expect("the proxy's address");
    // The shared link: when it is next free.
    let link = std::sync::Arc::new(tokio::sync::Mutex::new(tokio::time::Instant::now()));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let link = link.clone();
            let delivered = delivered.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    let _ = server_write.shutdown().await;
                });
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    let n = match server_read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    match throttle {
                        Throttle::PerConnection(rate) => {
                            if client_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                            delivered.add(n);
                            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64))
                                .await;
                        }
                        Throttle::Shared(rate) => {
                            // Take the link for the chunk's time, in turn with the others.
                            let done = {
                                let mut next = link.lock().await;
                                let start = (*next).max(tokio::time::Instant::now());
                                *next = start + Duration::from_secs_f64(n as f64 / rate as f64);
                                *next
                            };
                            tokio::time::sleep_until(done).await;
                            if client_write.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                            delivered.add(n);
                        }
                    }
                }
                let _ = client_write.shutdown().await;
            });
        }
    });
    addr
}

/// Busybox images, one per tag of `tags`, each with its own random layer of `layer_bytes`,
/// built with umoci into `dir/oci` (an OCI layout: `oci:<dir>/oci:<tag>` for skopeo).
pub fn build_large_images(dir: &Path, tags: &[&str], layer_bytes: usize) {
    build_images_with_layers(dir, tags, 1, layer_bytes);
}

/// The same with `layers` random layers of `layer_bytes` each (containerd downloads an image's
/// layers side by side).
pub fn build_images_with_layers(dir: &Path, tags: &[&str], layers: usize, layer_bytes: usize) {
    let layout = dir.join("oci");
    let image = |tag: &str| format!("{}:{tag}", layout.display());
    let run = |args: &[&str]| {
        let out = Command::new("umoci")
            .args(args)
            .output()
            .expect("running umoci");
        assert!(
            out.status.success(),
            "umoci {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["init", "--layout", layout.to_str().unwrap()]);
    run(&["new", "--image", &image("base")]);
    run(&[
        "insert",
        "--image",
        &image("base"),
        "/bin/busybox",
        "/bin/busybox",
    ]);
    run(&[
        "config",
        "--image",
        &image("base"),
        "--config.entrypoint=/bin/busybox",
        "--config.cmd=sleep",
        "--config.cmd=3600",
    ]);
    for tag in tags {
        run(&["tag", "--image", &image("base"), tag]);
        for layer in 0..layers {
            let blob = dir.join(format!("blob-{tag}-{layer}"));
            let mut bytes = vec![0u8; layer_bytes];
            // Cheap pseudo-random bytes (xorshift): gzip cannot shrink them.
            let mut x: u64 = tag
                .bytes()
                .chain(layer.to_le_bytes())
                .fold(0x9e37_79b9_7f4a_7c15, |x, b| {
                    x.rotate_left(8) ^ u64::from(b)
                });
            for chunk in bytes.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            std::fs::write(&blob, bytes).expect("writing the layer's file");
            // One `insert` is one layer.
            let target = if layer == 0 {
                "/large".to_owned()
            } else {
                format!("/large-{layer}")
            };
            run(&[
                "insert",
                "--image",
                &image(tag),
                blob.to_str().unwrap(),
                &target,
            ]);
        }
    }
}
