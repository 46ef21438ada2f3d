//! Real pull progress: while a tag pulls, the daemon reads containerd's download state and
//! writes the tag's `progress` (0–100) as it rises.
//!
//! CRI's `PullImage` says nothing until it returns, so the state comes from containerd's content
//! store on the same socket (decision 0037):
//! - **what to download**: the manifest. containerd commits it, labels it with its children
//!   (`containerd.io/gc.ref.content.config`, `…l.<i>`) and with where it came from
//!   (`containerd.io/distribution.source.<registry host, no port>=<repository>,…`) before it
//!   fetches any layer,
//!   so the manifests of the tag's repository labelled since the pull began are the ones being
//!   pulled (one per pull; two tags of one repository pulling at once are counted together);
//!   their JSON gives every blob's size;
//! - **how far**: a blob already in the store counts whole; one being downloaded counts its
//!   ingest's offset (`ListStatuses`; containerd 1.6's pull and 2.x's transfer service both leave
//!   the expected digest empty and name the blob in the ref, `layer-sha256:…`).
//!
//! The bytes are counted, not the unpacking that follows them, so progress stops at 99 until the
//! pull returns and the worker writes 100. It never goes down (a retried blob starts its ingest
//! again), and is written at most every [`MIN_WRITE_INTERVAL`] per tag, on top of the status
//! writer's own pace. A runtime without containerd's content API (CRI-O) leaves it unwritten
//! until the pull ends, as before.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use kruise_rs_api::image::ImageRef;

use super::containerd_api::ContainerdApi;

/// How often the download state is read while a tag pulls.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The least time between two progress writes of one tag.
pub(crate) const MIN_WRITE_INTERVAL: Duration = Duration::from_secs(2);
/// The largest manifest the daemon reads (a real one is a few KiB).
const MAX_MANIFEST_BYTES: usize = 4 << 20;

const CONFIG_LABEL: &str = "containerd.io/gc.ref.content.config";
const SOURCE_LABEL_PREFIX: &str = "containerd.io/distribution.source.";

/// One blob the pull downloads: its digest and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blob {
    pub(crate) digest: String,
    pub(crate) size: u64,
}

#[derive(serde::Deserialize)]
struct ManifestJson {
    config: Option<DescriptorJson>,
    #[serde(default)]
    layers: Vec<DescriptorJson>,
}

#[derive(serde::Deserialize)]
struct DescriptorJson {
    digest: String,
    size: u64,
}

/// The blobs an image manifest (OCI or Docker schema 2) names: its config and layers.
pub(crate) fn manifest_blobs(json: &[u8]) -> Result<Vec<Blob>, String> {
    let manifest: ManifestJson =
        serde_json::from_slice(json).map_err(|e| format!("not an image manifest: {e}"))?;
    Ok(manifest
        .config
        .into_iter()
        .chain(manifest.layers)
        .map(|d| Blob {
            digest: d.digest,
            size: d.size,
        })
        .collect())
}

/// The host of a registry as containerd names it in its source label: without the port (a
/// label key holds no `:`), without an IPv6 address's brackets.
pub(crate) fn label_host(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match registry.rsplit_once(':') {
        Some((host, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => registry,
    }
}

/// Whether the label `value` of `containerd.io/distribution.source.<registry>` names
/// `repository` (containerd appends repositories, comma-separated, as a blob is pulled from more).
pub(crate) fn names_repository(value: &str, repository: &str) -> bool {
    value.split(',').any(|r| r == repository)
}

/// Bytes downloaded of `blobs` (those `present` whole, the others as far as their ingest got)
/// and their total.
pub(crate) fn downloaded(
    blobs: &[Blob],
    present: &HashSet<String>,
    ingests: &HashMap<String, u64>,
) -> (u64, u64) {
    let mut done = 0u64;
    let mut total = 0u64;
    let mut seen = HashSet::new();
    for blob in blobs {
        // A layer listed twice is downloaded once.
        if !seen.insert(blob.digest.as_str()) {
            continue;
        }
        total = total.saturating_add(blob.size);
        let got = if present.contains(&blob.digest) {
            blob.size
        } else {
            ingests
                .get(&blob.digest)
                .copied()
                .unwrap_or(0)
                .min(blob.size)
        };
        done = done.saturating_add(got);
    }
    (done, total)
}

/// The percentage `done` of `total` is, rounded down and held under 100: the pull has not
/// returned (its unpacking follows the bytes). `None` while nothing is known.
pub(crate) fn percent(done: u64, total: u64) -> Option<i32> {
    if total == 0 {
        return None;
    }
    let whole = (u128::from(done.min(total)) * 100 / u128::from(total)) as i32;
    Some(whole.min(99))
}

/// What was last written for one tag, to write only rises, and not too often.
#[derive(Debug, Default)]
pub(crate) struct Reporter {
    written: Option<(i32, Instant)>,
}

impl Reporter {
    /// The value to write now for a reading of `percent` at `now`, if any: higher than the last
    /// one written, and at least [`MIN_WRITE_INTERVAL`] after it.
    pub(crate) fn next(&mut self, percent: i32, now: Instant) -> Option<i32> {
        if let Some((last, at)) = self.written
            && (percent <= last || now.duration_since(at) < MIN_WRITE_INTERVAL)
        {
            return None;
        }
        self.written = Some((percent, now));
        Some(percent)
    }
}

// --- containerd's content API (`containerd.services.content.v1`), the fields read -------------

#[derive(Clone, PartialEq, prost::Message)]
struct Info {
    #[prost(string, tag = "1")]
    digest: String,
    #[prost(int64, tag = "2")]
    size: i64,
    #[prost(message, optional, tag = "3")]
    created_at: Option<prost_types::Timestamp>,
    #[prost(message, optional, tag = "4")]
    updated_at: Option<prost_types::Timestamp>,
    #[prost(map = "string, string", tag = "5")]
    labels: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListContentRequest {
    #[prost(string, repeated, tag = "1")]
    filters: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListContentResponse {
    #[prost(message, repeated, tag = "1")]
    info: Vec<Info>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct InfoRequest {
    #[prost(string, tag = "1")]
    digest: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct InfoResponse {
    #[prost(message, optional, tag = "1")]
    info: Option<Info>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ReadContentRequest {
    #[prost(string, tag = "1")]
    digest: String,
    #[prost(int64, tag = "2")]
    offset: i64,
    #[prost(int64, tag = "3")]
    size: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ReadContentResponse {
    #[prost(int64, tag = "1")]
    offset: i64,
    #[prost(bytes = "vec", tag = "2")]
    data: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListStatusesRequest {
    #[prost(string, repeated, tag = "1")]
    filters: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ListStatusesResponse {
    #[prost(message, repeated, tag = "1")]
    statuses: Vec<IngestStatus>,
}

/// `containerd.services.content.v1.Status`: one ingest under way.
#[derive(Clone, PartialEq, prost::Message)]
struct IngestStatus {
    #[prost(string, tag = "3")]
    r#ref: String,
    #[prost(int64, tag = "4")]
    offset: i64,
    #[prost(int64, tag = "5")]
    total: i64,
    #[prost(string, tag = "6")]
    expected: String,
}

/// When a blob was last written or labelled: containerd 1.6 lists no `updated_at` (Go's zero
/// time, before the epoch), 2.x lists both.
fn last_touched(info: &Info) -> Option<SystemTime> {
    let created = info.created_at.as_ref().and_then(to_system_time);
    let updated = info.updated_at.as_ref().and_then(to_system_time);
    created.max(updated)
}

/// The digest an ingest downloads: its expected digest, or, where a runtime leaves that empty,
/// the one its ref names (`layer-sha256:…`, containerd's `remotes.MakeRefKey`).
fn ingest_digest(status: &IngestStatus) -> Option<&str> {
    if !status.expected.is_empty() {
        return Some(&status.expected);
    }
    let (_, digest) = status.r#ref.split_once('-')?;
    digest.contains(':').then_some(digest)
}

fn to_system_time(t: &prost_types::Timestamp) -> Option<SystemTime> {
    let seconds = u64::try_from(t.seconds).ok()?;
    let nanos = u32::try_from(t.nanos).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::new(seconds, nanos))
}

/// Every ingest under way in containerd's content store.
async fn list_ingests(api: &ContainerdApi) -> Result<Vec<IngestStatus>, tonic::Status> {
    let response: ListStatusesResponse = api
        .unary(
            "/containerd.services.content.v1.Content/ListStatuses",
            ListStatusesRequest { filters: vec![] },
        )
        .await?;
    Ok(response.statuses)
}

/// Every ingest under way in containerd's content store: its ref and how far it got.
pub(crate) async fn ingest_offsets(
    api: &ContainerdApi,
) -> Result<HashMap<String, i64>, tonic::Status> {
    Ok(list_ingests(api)
        .await?
        .into_iter()
        .map(|s| (s.r#ref, s.offset))
        .collect())
}

/// The download state of one pull, read from containerd's content store.
pub(crate) struct PullWatch {
    api: ContainerdApi,
    registry: String,
    repository: String,
    since: SystemTime,
    /// The manifests found so far, and the blobs they name.
    manifests: HashSet<String>,
    blobs: Vec<Blob>,
    /// Blobs seen whole in the store: they stay.
    present: HashSet<String>,
}

impl PullWatch {
    /// Watches the pull of `image` that began at `since`.
    pub(crate) fn new(api: ContainerdApi, image: &ImageRef, since: SystemTime) -> Self {
        Self {
            api,
            registry: label_host(image.registry()).to_owned(),
            repository: image.repository().to_owned(),
            // containerd's clock and ours are one machine's; a second of slack for rounding.
            since: since.checked_sub(Duration::from_secs(1)).unwrap_or(since),
            manifests: HashSet::new(),
            blobs: Vec::new(),
            present: HashSet::new(),
        }
    }

    /// The manifests of the repository labelled since the pull began that are not known yet.
    async fn new_manifests(&self) -> Result<Vec<String>, tonic::Status> {
        let source = format!("{SOURCE_LABEL_PREFIX}{}", self.registry);
        let request = ListContentRequest {
            filters: vec![format!("labels.\"{source}\",labels.\"{CONFIG_LABEL}\"")],
        };
        let pages: Vec<ListContentResponse> = self
            .api
            .collect("/containerd.services.content.v1.Content/List", request)
            .await?;
        Ok(pages
            .into_iter()
            .flat_map(|p| p.info)
            .filter(|i| !self.manifests.contains(&i.digest))
            .filter(|i| {
                i.labels
                    .get(&source)
                    .is_some_and(|v| names_repository(v, &self.repository))
            })
            .filter(|i| last_touched(i).is_some_and(|t| t >= self.since))
            .map(|i| i.digest)
            .collect())
    }

    async fn read(&self, digest: &str) -> Result<Vec<u8>, tonic::Status> {
        let request = ReadContentRequest {
            digest: digest.to_owned(),
            offset: 0,
            size: 0,
        };
        let chunks: Vec<ReadContentResponse> = self
            .api
            .collect("/containerd.services.content.v1.Content/Read", request)
            .await?;
        let mut bytes = Vec::new();
        for chunk in chunks {
            bytes.extend_from_slice(&chunk.data);
            if bytes.len() > MAX_MANIFEST_BYTES {
                return Err(tonic::Status::out_of_range(format!(
                    "{digest} is larger than a manifest"
                )));
            }
        }
        Ok(bytes)
    }

    async fn is_present(&self, digest: &str) -> Result<bool, tonic::Status> {
        let request = InfoRequest {
            digest: digest.to_owned(),
        };
        match self
            .api
            .unary::<_, InfoResponse>("/containerd.services.content.v1.Content/Info", request)
            .await
        {
            Ok(_) => Ok(true),
            Err(status) if status.code() == tonic::Code::NotFound => Ok(false),
            Err(status) => Err(status),
        }
    }

    /// One reading: the percentage downloaded, `None` while no manifest is known.
    pub(crate) async fn reading(&mut self) -> Result<Option<i32>, tonic::Status> {
        for digest in self.new_manifests().await? {
            let json = self.read(&digest).await?;
            // An index or anything else labelled alike: not what downloads.
            if let Ok(blobs) = manifest_blobs(&json) {
                self.blobs.extend(blobs);
            }
            self.manifests.insert(digest);
        }
        if self.blobs.is_empty() {
            return Ok(None);
        }
        let ingests: HashMap<String, u64> = list_ingests(&self.api)
            .await?
            .iter()
            .filter_map(|s| {
                Some((
                    ingest_digest(s)?.to_owned(),
                    u64::try_from(s.offset).unwrap_or(0),
                ))
            })
            .collect();
        let missing: Vec<String> = self
            .blobs
            .iter()
            .filter(|b| !self.present.contains(&b.digest) && !ingests.contains_key(&b.digest))
            .map(|b| b.digest.clone())
            .collect();
        for digest in missing {
            if self.is_present(&digest).await? {
                self.present.insert(digest);
            }
        }
        let (done, total) = downloaded(&self.blobs, &self.present, &ingests);
        Ok(percent(done, total))
    }
}

/// Follows a pull until dropped (the pull returned): each rise of its progress is handed to
/// `write`, paced by [`Reporter`]. Errors of the content API end the following, said once.
pub(crate) async fn follow(mut watch: PullWatch, mut write: impl FnMut(i32)) {
    let mut reporter = Reporter::default();
    let mut ticks = tokio::time::interval(POLL_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match watch.reading().await {
            Ok(Some(percent)) => {
                if let Some(value) = reporter.next(percent, Instant::now()) {
                    write(value);
                }
            }
            Ok(None) => {}
            Err(status) => {
                tracing::debug!(
                    error = %status.message(),
                    "no pull progress: containerd's content API did not answer"
                );
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(digest: &str, size: u64) -> Blob {
        Blob {
            digest: digest.into(),
            size,
        }
    }

    #[test]
    fn a_manifest_names_its_config_and_layers_and_an_index_is_no_manifest() {
        let manifest = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",
            "config":{"mediaType":"c","digest":"sha256:c","size":10},
            "layers":[{"mediaType":"l","digest":"sha256:a","size":100},{"mediaType":"l","digest":"sha256:b","size":5}]}"#;
        assert_eq!(
            manifest_blobs(manifest).unwrap(),
            [
                blob("sha256:c", 10),
                blob("sha256:a", 100),
                blob("sha256:b", 5)
            ]
        );
        let index = br#"{"schemaVersion":2,"manifests":[{"digest":"sha256:m","size":3}]}"#;
        assert_eq!(manifest_blobs(index).unwrap(), []);
        assert!(manifest_blobs(b"not json").is_err());
        assert!(manifest_blobs(br#"{"layers":[{"digest":"sha256:a","size":-1}]}"#).is_err());
    }

    #[test]
    fn the_source_label_names_the_registry_host_without_its_port() {
        assert_eq!(label_host("127.0.0.1:5000"), "127.0.0.1");
        assert_eq!(label_host("docker.io"), "docker.io");
        assert_eq!(label_host("registry.example:443"), "registry.example");
        assert_eq!(label_host("[::1]:5000"), "::1");
        assert_eq!(label_host("[::1]"), "::1");
    }

    #[test]
    fn the_source_label_names_each_repository_a_blob_came_from() {
        assert!(names_repository("e2e/app", "e2e/app"));
        assert!(names_repository("other/x,e2e/app", "e2e/app"));
        assert!(!names_repository("e2e/app-two", "e2e/app"));
        assert!(!names_repository("e2e", "e2e/app"));
    }

    #[test]
    fn present_blobs_count_whole_and_ingests_as_far_as_they_got() {
        let blobs = [blob("c", 10), blob("a", 100), blob("b", 90)];
        let present = HashSet::from(["c".to_owned()]);
        let ingests = HashMap::from([("a".to_owned(), 40)]);
        assert_eq!(downloaded(&blobs, &present, &ingests), (50, 200));
        // An ingest that reports more than the manifest's size counts the size.
        let over = HashMap::from([("a".to_owned(), 500)]);
        assert_eq!(downloaded(&blobs, &present, &over), (110, 200));
        // A layer named twice downloads once.
        let twice = [blob("a", 100), blob("a", 100)];
        assert_eq!(downloaded(&twice, &HashSet::new(), &ingests), (40, 100));
    }

    #[test]
    fn percent_rounds_down_and_stays_under_100_until_the_pull_returns() {
        assert_eq!(percent(0, 0), None);
        assert_eq!(percent(0, 200), Some(0));
        assert_eq!(percent(199, 200), Some(99));
        assert_eq!(percent(200, 200), Some(99));
        assert_eq!(percent(1, 3), Some(33));
        assert_eq!(percent(u64::MAX, u64::MAX), Some(99));
    }

    #[test]
    fn only_rises_are_written_and_not_more_often_than_the_interval() {
        let t0 = Instant::now();
        let mut reporter = Reporter::default();
        assert_eq!(reporter.next(10, t0), Some(10), "the first reading");
        assert_eq!(
            reporter.next(30, t0 + Duration::from_secs(1)),
            None,
            "too soon"
        );
        assert_eq!(reporter.next(30, t0 + MIN_WRITE_INTERVAL), Some(30));
        assert_eq!(
            reporter.next(20, t0 + 3 * MIN_WRITE_INTERVAL),
            None,
            "a blob started again: never down"
        );
        assert_eq!(
            reporter.next(30, t0 + 4 * MIN_WRITE_INTERVAL),
            None,
            "no change"
        );
        assert_eq!(reporter.next(31, t0 + 5 * MIN_WRITE_INTERVAL), Some(31));
    }

    #[test]
    fn an_ingest_names_its_blob_by_expected_digest_or_by_ref() {
        let status = |r: &str, expected: &str| IngestStatus {
            r#ref: r.into(),
            offset: 0,
            total: 0,
            expected: expected.into(),
        };
        assert_eq!(
            ingest_digest(&status("layer-sha256:a", "")),
            Some("sha256:a")
        );
        assert_eq!(ingest_digest(&status("x", "sha256:b")), Some("sha256:b"));
        assert_eq!(
            ingest_digest(&status("manifest-sha256:c", "")),
            Some("sha256:c")
        );
        assert_eq!(ingest_digest(&status("some-upload", "")), None);
        assert_eq!(ingest_digest(&status("", "")), None);
    }

    #[test]
    fn a_blob_was_touched_when_created_or_updated_whichever_is_later() {
        let at = |seconds| Some(prost_types::Timestamp { seconds, nanos: 0 });
        let info = |created, updated| Info {
            created_at: created,
            updated_at: updated,
            ..Info::default()
        };
        let epoch = |s| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        // containerd 1.6 lists Go's zero time as updated_at.
        assert_eq!(
            last_touched(&info(at(100), at(-62_135_596_800))),
            Some(epoch(100))
        );
        assert_eq!(last_touched(&info(at(100), at(200))), Some(epoch(200)));
        assert_eq!(last_touched(&info(None, None)), None);
    }

    #[test]
    fn containerd_timestamps_read_as_system_time() {
        let t = prost_types::Timestamp {
            seconds: 10,
            nanos: 5,
        };
        assert_eq!(
            to_system_time(&t),
            Some(SystemTime::UNIX_EPOCH + Duration::new(10, 5))
        );
        let before_epoch = prost_types::Timestamp {
            seconds: -1,
            nanos: 0,
        };
        assert_eq!(to_system_time(&before_epoch), None);
    }

    #[test]
    fn the_status_message_decodes_as_containerd_encodes_it() {
        use prost::Message;
        // Status{ref: "r", offset: 3, total: 9, expected: "d"} as protoc encodes it.
        let bytes = [0x1a, 0x01, b'r', 0x20, 0x03, 0x28, 0x09, 0x32, 0x01, b'd'];
        assert_eq!(
            IngestStatus::decode(bytes.as_slice()).unwrap(),
            IngestStatus {
                r#ref: "r".into(),
                offset: 3,
                total: 9,
                expected: "d".into()
            }
        );
    }
}
