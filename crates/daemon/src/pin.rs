//! Pre-pulled images stay until they are used: an image the daemon pulled for a tag of its
//! NodeImage is *pinned* in containerd (the label `io.cri-containerd.pinned=pinned`, which
//! containerd's CRI plugin from 1.7 reports as `Image.pinned`, and the kubelet's image GC never
//! removes a pinned image), and unpinned once no tag of the NodeImage's spec names it any more:
//! its job ended, or the SidecarSet's pre-download job was deleted once the rollout passed.
//!
//! The pin is written through containerd's own images API (`containerd.services.images.v1`),
//! which containerd serves on the same socket as CRI, in its `k8s.io` namespace: the daemon
//! mounts nothing more for it. A second label, [`OURS`], marks what the daemon pinned, so it
//! never unpins an image someone else pinned (containerd pins its sandbox image itself).
//! Runtimes without that API (CRI-O) answer `Unimplemented`: the daemon says so once in its log
//! and pulls as before, unpinned.
//!
//! Unpinning is level-based: after each change of the NodeImage, [`unpin_unwanted`] lists the
//! images carrying [`OURS`] and unpins those no spec tag names.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;

use super::containerd_api::ContainerdApi;
use super::cri::CriError;

/// Why a call to containerd's images API failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PinError {
    /// The runtime does not serve the API (`Unimplemented`: CRI-O, cri-dockerd).
    Unsupported(String),
    /// The image is not there (removed meanwhile).
    Gone(String),
    /// Any other failure; the message says what.
    Failed(String),
}

impl From<tonic::Status> for PinError {
    fn from(status: tonic::Status) -> Self {
        if status.code() == tonic::Code::Unimplemented {
            PinError::Unsupported(status.message().to_owned())
        } else if status.code() == tonic::Code::NotFound {
            PinError::Gone(status.message().to_owned())
        } else {
            PinError::Failed(CriError::from(status).message)
        }
    }
}

/// containerd's CRI label for an image its image GC and the kubelet's must keep.
const PINNED: &str = "io.cri-containerd.pinned";
/// Its value when pinned.
const PINNED_VALUE: &str = "pinned";
/// The label that says the daemon pinned the image.
const OURS: &str = "kruise-rs.io/pinned";

/// `containerd.services.images.v1.Image`: the fields the daemon reads and writes back.
#[derive(Clone, PartialEq, prost::Message)]
struct Image {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(map = "string, string", tag = "2")]
    labels: HashMap<String, String>,
    /// Sent back as read: containerd 2 dereferences it in every Update, whatever the mask
    /// (2.2.9 crashes on an Update without it).
    #[prost(message, optional, tag = "3")]
    target: Option<Descriptor>,
}

/// `containerd.types.Descriptor`.
#[derive(Clone, PartialEq, prost::Message)]
struct Descriptor {
    #[prost(string, tag = "1")]
    media_type: String,
    #[prost(string, tag = "2")]
    digest: String,
    #[prost(int64, tag = "3")]
    size: i64,
    #[prost(map = "string, string", tag = "5")]
    annotations: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetImageRequest {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct GetImageResponse {
    #[prost(message, optional, tag = "1")]
    image: Option<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct UpdateImageRequest {
    #[prost(message, optional, tag = "1")]
    image: Option<Image>,
    #[prost(message, optional, tag = "2")]
    update_mask: Option<prost_types::FieldMask>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct UpdateImageResponse {
    #[prost(message, optional, tag = "1")]
    image: Option<Image>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListImagesRequest {
    #[prost(string, repeated, tag = "1")]
    filters: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListImagesResponse {
    #[prost(message, repeated, tag = "1")]
    images: Vec<Image>,
}

/// containerd's images API on the runtime's socket.
#[derive(Clone, Debug)]
pub(crate) struct ContainerdImages {
    api: ContainerdApi,
}

impl ContainerdImages {
    pub(crate) fn new(api: ContainerdApi) -> Self {
        Self { api }
    }

    async fn call<Req, Resp>(&self, method: &'static str, message: Req) -> Result<Resp, PinError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        Ok(self.api.unary(method, message).await?)
    }

    /// Pins (or with `pin` false, unpins) the image named `name`: both labels set, or both
    /// removed (containerd drops a label the mask names and the image lacks). The image is read
    /// first and written back whole, as containerd's own clients do; only the labels' mask is
    /// applied.
    pub(crate) async fn set_pinned(&self, name: &str, pin: bool) -> Result<(), PinError> {
        let current: GetImageResponse = self
            .call(
                "/containerd.services.images.v1.Images/Get",
                GetImageRequest {
                    name: name.to_owned(),
                },
            )
            .await?;
        let Some(mut image) = current.image else {
            return Err(PinError::Gone(format!("containerd has no image {name}")));
        };
        pinned_labels(&mut image.labels, pin);
        let request = UpdateImageRequest {
            image: Some(image),
            update_mask: Some(prost_types::FieldMask {
                paths: vec![format!("labels.{PINNED}"), format!("labels.{OURS}")],
            }),
        };
        let _: UpdateImageResponse = self
            .call("/containerd.services.images.v1.Images/Update", request)
            .await?;
        Ok(())
    }

    /// The names of the images the daemon pinned.
    pub(crate) async fn pinned_by_us(&self) -> Result<Vec<String>, PinError> {
        let request = ListImagesRequest {
            filters: vec![format!("labels.\"{OURS}\"==true")],
        };
        let response: ListImagesResponse = self
            .call("/containerd.services.images.v1.Images/List", request)
            .await?;
        Ok(response.images.into_iter().map(|i| i.name).collect())
    }
}

/// Sets both pin labels in `labels`, or removes both.
fn pinned_labels(labels: &mut HashMap<String, String>, pin: bool) {
    if pin {
        labels.insert(PINNED.to_owned(), PINNED_VALUE.to_owned());
        labels.insert(OURS.to_owned(), "true".to_owned());
    } else {
        labels.remove(PINNED);
        labels.remove(OURS);
    }
}

/// The images `pinned` (by the daemon) that no name in `wanted` asks for any more.
pub(crate) fn unwanted<'a>(pinned: &'a [String], wanted: &BTreeSet<String>) -> Vec<&'a str> {
    pinned
        .iter()
        .filter(|name| !wanted.contains(name.as_str()))
        .map(String::as_str)
        .collect()
}

/// Unpins what the daemon pinned and no spec tag (`wanted`) names any more; returns how many
/// were unpinned. A runtime without containerd's images API has nothing pinned.
pub(crate) async fn unpin_unwanted(
    images: &ContainerdImages,
    wanted: &BTreeSet<String>,
) -> Result<usize, PinError> {
    let pinned = images.pinned_by_us().await?;
    let mut unpinned = 0;
    for name in unwanted(&pinned, wanted) {
        match images.set_pinned(name, false).await {
            // Removed since the list: nothing left to unpin.
            Err(PinError::Gone(_)) => continue,
            answer => answer?,
        }
        tracing::info!(
            image = name,
            "unpinned: no tag of the NodeImage names it any more"
        );
        unpinned += 1;
    }
    Ok(unpinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_images_no_tag_names_are_unpinned() {
        let pinned = vec![
            "r/a:v1".to_owned(),
            "r/b:v1".to_owned(),
            "r/a:v2".to_owned(),
        ];
        let wanted = BTreeSet::from(["r/a:v1".to_owned(), "r/c:v1".to_owned()]);
        assert_eq!(unwanted(&pinned, &wanted), ["r/b:v1", "r/a:v2"]);
        assert!(unwanted(&pinned, &pinned.iter().cloned().collect()).is_empty());
    }

    /// A runtime that takes the connection and never answers: the call gives up, as
    /// unreachable, instead of holding the worker that pinned.
    #[tokio::test]
    async fn a_call_that_is_never_answered_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("silent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                open.push(stream);
            }
        });
        let path = socket.clone();
        let channel = tonic::transport::Endpoint::from_static("http://[::1]:50051")
            .connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }));
        let images = ContainerdImages::new(ContainerdApi::with_timeout(
            channel,
            std::time::Duration::from_millis(300),
        ));
        let err = images.set_pinned("r/a:v1", true).await.unwrap_err();
        assert!(
            matches!(&err, PinError::Failed(m) if m.contains("did not answer within 300ms")),
            "{err:?}"
        );
        held.abort();
    }

    #[test]
    fn a_runtime_without_the_api_is_told_apart_by_the_code_not_the_words() {
        let missing = "unknown service containerd.services.images.v1.Images";
        assert_eq!(
            PinError::from(tonic::Status::unimplemented(missing)),
            PinError::Unsupported(missing.into())
        );
        // A message that merely mentions the word is another failure.
        let other = "image \"Unimplemented\": write failed";
        assert_eq!(
            PinError::from(tonic::Status::internal(other)),
            PinError::Failed(other.into())
        );
    }

    #[test]
    fn an_image_removed_meanwhile_is_gone_not_failed() {
        assert_eq!(
            PinError::from(tonic::Status::not_found("image \"r/a:v1\": not found")),
            PinError::Gone("image \"r/a:v1\": not found".into())
        );
    }

    #[test]
    fn pinning_sets_and_unpinning_removes_both_labels_and_keeps_the_others() {
        let mut labels = HashMap::from([("other".to_owned(), "x".to_owned())]);
        pinned_labels(&mut labels, true);
        assert_eq!(labels.get(PINNED).map(String::as_str), Some("pinned"));
        assert_eq!(labels.get(OURS).map(String::as_str), Some("true"));
        pinned_labels(&mut labels, false);
        assert_eq!(
            labels,
            HashMap::from([("other".to_owned(), "x".to_owned())])
        );
    }

    /// The target read by Get goes back in the Update: containerd 2 decodes it unconditionally.
    #[test]
    fn the_target_read_is_written_back_as_containerd_encodes_it() {
        use prost::Message;
        // containerd's Image{name: "n", target{media_type: "m", digest: "d", size: 5}} as
        // protoc encodes it.
        let image = Image {
            name: "n".into(),
            labels: HashMap::new(),
            target: Some(Descriptor {
                media_type: "m".into(),
                digest: "d".into(),
                size: 5,
                annotations: HashMap::new(),
            }),
        };
        let bytes = image.encode_to_vec();
        assert_eq!(
            bytes,
            [
                0x0a, 0x01, b'n', // name
                0x1a, 0x08, // target, 8 bytes
                0x0a, 0x01, b'm', 0x12, 0x01, b'd', 0x18, 0x05,
            ]
        );
        assert_eq!(Image::decode(bytes.as_slice()).unwrap(), image);
    }

    #[test]
    fn a_pass_runs_when_the_wanted_references_change_or_the_last_one_failed() {
        let pins = Pins::default();
        let a = BTreeSet::from(["r/a:v1".to_owned()]);
        assert!(pins.wanted_changed(&a), "the first");
        assert!(!pins.wanted_changed(&a), "nothing changed");
        pins.forget();
        assert!(pins.wanted_changed(&a), "after a failed pass");
        assert!(pins.wanted_changed(&BTreeSet::new()), "every tag gone");
    }

    #[test]
    fn the_messages_encode_as_containerds() {
        use prost::Message;
        // containerd's UpdateImageRequest{image{name: "n", labels{"k": "v"}}, update_mask{["labels.k"]}}
        // as protoc encodes it.
        let request = UpdateImageRequest {
            image: Some(Image {
                name: "n".into(),
                labels: HashMap::from([("k".into(), "v".into())]),
                target: None,
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["labels.k".into()],
            }),
        };
        assert_eq!(
            request.encode_to_vec(),
            [
                0x0a, 0x0b, // image, 11 bytes
                0x0a, 0x01, b'n', // name
                0x12, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v', // a labels entry
                0x12, 0x0a, 0x0a, 0x08, b'l', b'a', b'b', b'e', b'l', b's', b'.',
                b'k', // mask
            ]
        );
    }
}

/// The daemon's bookkeeping of its pins.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    /// The spec's pull references at the last unpin pass: a pass runs when they change.
    last: std::sync::Mutex<Option<BTreeSet<String>>>,
    /// One pass at a time.
    pass: tokio::sync::Mutex<()>,
    /// The runtime has no containerd images API (said once).
    unsupported: std::sync::atomic::AtomicBool,
}

impl Pins {
    /// Whether `wanted` differs from what the last pass saw (and takes it as seen).
    pub(crate) fn wanted_changed(&self, wanted: &BTreeSet<String>) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref() == Some(wanted) {
            return false;
        }
        *last = Some(wanted.clone());
        true
    }

    /// Forgets what the last pass saw, so that the next change of the NodeImage runs one again
    /// (after a pass that failed).
    pub(crate) fn forget(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Runs `pass` once no other pass runs.
    pub(crate) async fn one_at_a_time<T>(&self, pass: impl Future<Output = T>) -> T {
        let _running = self.pass.lock().await;
        pass.await
    }

    /// Says why pinning failed: once for a runtime without containerd's images API, every time
    /// otherwise.
    pub(crate) fn failed(&self, what: &str, image: &str, err: &PinError) {
        use std::sync::atomic::Ordering;
        match err {
            PinError::Unsupported(message) => {
                if !self.unsupported.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %message,
                        "the runtime has no containerd images API: pre-pulled images are not \
                         pinned, and the kubelet's image GC may remove them before they are used"
                    );
                }
            }
            PinError::Failed(message) | PinError::Gone(message) => {
                tracing::warn!(image, error = %message, "cannot {what} the image");
            }
        }
    }
}
