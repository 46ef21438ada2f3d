//! How the controllers' watches get their first full list.
//!
//! A streaming list (the `WatchList` feature: one watch that replays every object, then a
//! bookmark) keeps no whole-list response in memory and avoids "too old resourceVersion"
//! re-lists, so the manager prefers it. But it is an optional server feature: Kubernetes 1.33
//! ships the `WatchList` gate off and answers `sendInitialEvents` with 422, and kube's watcher
//! does not fall back by itself (it retries the refused watch forever). So the manager asks the
//! API server once at start ([`detect`]), logs the answer, and every controller watch follows it
//! ([`InitialList::config`]); the classic paged list then watch works on every server.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, WatchEvent, WatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Client, Resource};

use kruise_rs_api::nodeimage::NodeImage;

/// A label no object carries: the probe watches stream nothing but their closing bookmark.
const PROBE_LABEL: &str = "kruise-rs.io/streaming-list-probe";

/// How long a probe waits for the API server's answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The annotation of the bookmark that ends a streaming list's initial events.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How every controller watch lists what exists before it watches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialList {
    /// A paged LIST, then a WATCH from its resourceVersion: served by every API server.
    #[default]
    ListThenWatch,
    /// One WATCH with `sendInitialEvents=true`: needs the `WatchList` feature on the server.
    Streaming,
}

impl InitialList {
    /// A watcher configuration (no selectors yet) that lists this way.
    pub fn config(self) -> watcher::Config {
        match self {
            Self::ListThenWatch => watcher::Config::default(),
            Self::Streaming => watcher::Config::default().streaming_lists(),
        }
    }

    /// The name logs and flags use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ListThenWatch => "list-then-watch",
            Self::Streaming => "streaming",
        }
    }
}

/// The `--streaming-lists` flag: ask the server, or decide without asking.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StreamingLists {
    /// Use streaming lists where the API server serves them (asked once at start).
    #[default]
    Auto,
    /// Always stream (watches fail where the server refuses; for tests of the fallback).
    Always,
    /// Never stream: list then watch.
    Never,
}

/// What one probe watch got from the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The watch was accepted and ended its initial events with the closing bookmark.
    Streamed,
    /// The server refused the streaming list (422 when the `WatchList` gate is off).
    Refused(String),
    /// No answer either way (timeout, connection, permissions): streaming is not relied on.
    Unknown(String),
}

/// The decision: stream only if every probed kind streamed; with the reason, for the log.
pub fn decide(outcomes: &[(&str, ProbeOutcome)]) -> (InitialList, String) {
    let mut reasons = Vec::new();
    for (kind, outcome) in outcomes {
        match outcome {
            ProbeOutcome::Streamed => {}
            ProbeOutcome::Refused(why) => reasons.push(format!("{kind}: refused: {why}")),
            ProbeOutcome::Unknown(why) => reasons.push(format!("{kind}: no answer: {why}")),
        }
    }
    if outcomes.is_empty() {
        return (InitialList::ListThenWatch, "nothing was probed".to_owned());
    }
    if reasons.is_empty() {
        (
            InitialList::Streaming,
            "the API server streams lists (WatchList)".to_owned(),
        )
    } else {
        (InitialList::ListThenWatch, reasons.join("; "))
    }
}

/// Reads a probe watch's first event: streaming works only if it is the closing bookmark.
pub(crate) fn judge_first_event<K>(
    event: Option<Result<WatchEvent<K>, kube::Error>>,
) -> ProbeOutcome
where
    K: Resource,
{
    match event {
        Some(Ok(WatchEvent::Bookmark(bookmark)))
            if bookmark
                .metadata
                .annotations
                .contains_key(INITIAL_EVENTS_END) =>
        {
            ProbeOutcome::Streamed
        }
        Some(Ok(WatchEvent::Bookmark(_))) => {
            ProbeOutcome::Refused("a bookmark without the initial-events-end mark".to_owned())
        }
        Some(Ok(WatchEvent::Error(status))) => {
            ProbeOutcome::Refused(format!("{} ({})", status.message, status.code))
        }
        Some(Ok(WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_))) => {
            ProbeOutcome::Refused("an object event before the closing bookmark".to_owned())
        }
        Some(Err(err)) => ProbeOutcome::Unknown(err.to_string()),
        None => ProbeOutcome::Refused("the watch ended without events".to_owned()),
    }
}

/// Sorts the error of a refused watch request: 4xx answers other than 401/403/429 are the
/// server saying no to the parameters; anything else says nothing about the feature.
pub(crate) fn judge_request_error(err: &kube::Error) -> ProbeOutcome {
    match err {
        kube::Error::Api(status)
            if (400..500).contains(&status.code) && ![401, 403, 429].contains(&status.code) =>
        {
            ProbeOutcome::Refused(format!("{} ({})", status.message, status.code))
        }
        other => ProbeOutcome::Unknown(other.to_string()),
    }
}

/// One streaming-list watch of `api` that matches nothing; what the server did with it.
async fn probe<K>(api: Api<K>) -> ProbeOutcome
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + 'static,
{
    let params = WatchParams::streaming_lists()
        .labels(PROBE_LABEL)
        .timeout(PROBE_TIMEOUT.as_secs() as u32);
    let attempt = async {
        match api.watch(&params, "0").await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream.into_stream());
                judge_first_event(stream.next().await)
            }
            Err(err) => judge_request_error(&err),
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| {
            ProbeOutcome::Unknown(format!("no answer within {}s", PROBE_TIMEOUT.as_secs()))
        })
}

/// Asks the API server whether it streams lists, for a core kind (pods) and one of ours
/// (NodeImages, served by the apiextensions server), and decides.
pub async fn detect(client: &Client) -> (InitialList, String) {
    let (pods, nodeimages) = futures::join!(
        probe(Api::<PartialObjectMeta<Pod>>::all(client.clone())),
        probe(Api::<NodeImage>::all(client.clone())),
    );
    decide(&[("pods", pods), ("nodeimages", nodeimages)])
}

/// The mode the flag fixes without asking the server; `None` for `Auto`.
pub(crate) fn forced(flag: StreamingLists) -> Option<(InitialList, String)> {
    match flag {
        StreamingLists::Auto => None,
        StreamingLists::Always => Some((
            InitialList::Streaming,
            "--streaming-lists=always".to_owned(),
        )),
        StreamingLists::Never => Some((
            InitialList::ListThenWatch,
            "--streaming-lists=never".to_owned(),
        )),
    }
}

/// The initial-list mode the flag asks for, with the reason: `Auto` asks the server.
pub async fn choose(client: &Client, flag: StreamingLists) -> (InitialList, String) {
    match forced(flag) {
        Some(choice) => choice,
        None => detect(client).await,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube::core::Status;

    use super::*;

    fn bookmark(annotations: &[(&str, &str)]) -> WatchEvent<NodeImage> {
        let annotations: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        serde_json::from_value(serde_json::json!({
            "type": "BOOKMARK",
            "object": {
                "apiVersion": "apps.kruise.io/v1beta1",
                "kind": "NodeImage",
                "metadata": {"resourceVersion": "42", "annotations": annotations},
            }
        }))
        .unwrap()
    }

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(Status::failure(message, "Invalid").with_code(code).boxed())
    }

    #[test]
    fn configs_differ_only_in_the_initial_list_strategy() {
        let streaming = InitialList::Streaming.config();
        let plain = InitialList::ListThenWatch.config();
        assert_eq!(
            streaming.initial_list_strategy,
            watcher::InitialListStrategy::StreamingList
        );
        assert_eq!(
            plain.initial_list_strategy,
            watcher::InitialListStrategy::ListWatch
        );
        assert_eq!(InitialList::default(), InitialList::ListThenWatch);
    }

    #[test]
    fn streams_only_when_every_kind_streamed() {
        let (mode, why) = decide(&[
            ("pods", ProbeOutcome::Streamed),
            ("nodeimages", ProbeOutcome::Streamed),
        ]);
        assert_eq!(mode, InitialList::Streaming, "{why}");

        let (mode, why) = decide(&[
            ("pods", ProbeOutcome::Streamed),
            ("nodeimages", ProbeOutcome::Refused("no (422)".to_owned())),
        ]);
        assert_eq!(mode, InitialList::ListThenWatch);
        assert_eq!(why, "nodeimages: refused: no (422)");

        let (mode, why) = decide(&[
            ("pods", ProbeOutcome::Unknown("timeout".to_owned())),
            ("nodeimages", ProbeOutcome::Streamed),
        ]);
        assert_eq!(mode, InitialList::ListThenWatch);
        assert_eq!(why, "pods: no answer: timeout");

        assert_eq!(decide(&[]).0, InitialList::ListThenWatch);
    }

    #[test]
    fn the_closing_bookmark_means_streaming_works() {
        let event = bookmark(&[(INITIAL_EVENTS_END, "true")]);
        assert_eq!(judge_first_event(Some(Ok(event))), ProbeOutcome::Streamed);
    }

    #[test]
    fn anything_else_first_means_it_does_not() {
        // A plain bookmark (a server that ignored sendInitialEvents) is not the end mark.
        assert!(matches!(
            judge_first_event(Some(Ok(bookmark(&[])))),
            ProbeOutcome::Refused(_)
        ));
        let error: WatchEvent<NodeImage> = WatchEvent::Error(
            Status::failure("sendInitialEvents is forbidden", "Invalid")
                .with_code(422)
                .boxed(),
        );
        assert_eq!(
            judge_first_event(Some(Ok(error))),
            ProbeOutcome::Refused("sendInitialEvents is forbidden (422)".to_owned())
        );
        assert!(matches!(
            judge_first_event::<NodeImage>(None),
            ProbeOutcome::Refused(_)
        ));
        assert!(matches!(
            judge_first_event::<NodeImage>(Some(Err(api_error(500, "boom")))),
            ProbeOutcome::Unknown(_)
        ));
    }

    #[test]
    fn a_422_refuses_and_permission_errors_say_nothing() {
        let refused = judge_request_error(&api_error(
            422,
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        ));
        assert!(
            matches!(&refused, ProbeOutcome::Refused(why) if why.contains("WatchList feature gate") && why.ends_with("(422)")),
            "{refused:?}"
        );
        assert!(matches!(
            judge_request_error(&api_error(400, "bad")),
            ProbeOutcome::Refused(_)
        ));
        for code in [401, 403, 429, 500, 503] {
            assert!(
                matches!(
                    judge_request_error(&api_error(code, "x")),
                    ProbeOutcome::Unknown(_)
                ),
                "{code}"
            );
        }
    }

    #[test]
    fn only_auto_asks_the_server() {
        assert_eq!(StreamingLists::default(), StreamingLists::Auto);
        assert_eq!(forced(StreamingLists::Auto), None);
        assert_eq!(
            forced(StreamingLists::Always).map(|(mode, _)| mode),
            Some(InitialList::Streaming)
        );
        assert_eq!(
            forced(StreamingLists::Never).map(|(mode, _)| mode),
            Some(InitialList::ListThenWatch)
        );
    }
}
