//! Kubernetes Events, published so that each distinct message stays readable.
//!
//! kube's [`kube::runtime::events::Recorder`] folds every event with the same type, reason,
//! action and objects into one series for six minutes and keeps the *first* note: a second
//! image pulled on a node, or a second ImagePullJob created for a SidecarSet, would show up as
//! `count: 2` of the first one's message. Upstream's client-go recorder keys on the message too.
//! This [`Recorder`] keeps one kube recorder per distinct note, so a repeated message still
//! becomes a series and a new message becomes an Event of its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, Reporter};

/// kube's recorder forgets a series after six minutes; so do we.
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// Publishes Events as `reporter`; cheap to share behind an `Arc`, as the contexts do.
/// Reporting controller of every event the manager's controllers publish.
pub(crate) const MANAGER_REPORTER: &str = "kruise-rs-manager";

pub struct Recorder {
    client: Client,
    reporter: Reporter,
    /// One kube recorder per note seen within the last [`SERIES_TTL`], with when it was used.
    by_note: Mutex<HashMap<Option<String>, (kube::runtime::events::Recorder, Instant)>>,
}

impl Recorder {
    /// The manager's controllers' recorder: reporting controller `MANAGER_REPORTER`, instance
    /// the pod (`POD_NAME`, set by the chart), when known.
    pub fn for_manager(client: Client) -> Self {
        Self::new(
            client,
            Reporter {
                controller: MANAGER_REPORTER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        )
    }

    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            by_note: Mutex::default(),
        }
    }

    /// Publishes `event` about `regarding`: a new Event, or the next of a series when the same
    /// event with the same note was published within six minutes.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let recorder = {
            let now = Instant::now();
            let mut by_note = self.by_note.lock().unwrap_or_else(|e| e.into_inner());
            by_note.retain(|_, (_, used)| now.duration_since(*used) < SERIES_TTL);
            let (recorder, used) = by_note.entry(event.note.clone()).or_insert_with(|| {
                (
                    kube::runtime::events::Recorder::new(
                        self.client.clone(),
                        self.reporter.clone(),
                    ),
                    now,
                )
            });
            *used = now;
            recorder.clone()
        };
        if event
            .note
            .as_ref()
            .is_some_and(|n| n.len() > MAX_NOTE_BYTES)
        {
            let shortened = Event {
                type_: event.type_,
                reason: event.reason.clone(),
                note: event.note.as_deref().map(truncate_note),
                action: event.action.clone(),
                secondary: event.secondary.clone(),
            };
            return recorder.publish(&shortened, regarding).await;
        }
        recorder.publish(event, regarding).await
    }
}

/// The apiserver refuses an event whose note is longer (events.k8s.io/v1 validation).
const MAX_NOTE_BYTES: usize = 1024;

/// `note` cut to [`MAX_NOTE_BYTES`] on a character boundary, ending in "…".
fn truncate_note(note: &str) -> String {
    const ELLIPSIS: &str = "…";
    let mut end = MAX_NOTE_BYTES - ELLIPSIS.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{ELLIPSIS}", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_note_is_cut_to_the_limit_on_a_character_boundary() {
        // Three-byte characters, so the cut falls inside one unless it is moved.
        let note = "é€".repeat(400);
        let cut = truncate_note(&note);
        assert!(cut.len() <= MAX_NOTE_BYTES, "{} bytes", cut.len());
        assert!(cut.ends_with('…'));
        assert!(note.starts_with(cut.trim_end_matches('…')));
    }
}
