//! One line for an error and its causes, for logs, events and conditions.

/// `outer: cause: cause …`, skipping a cause whose text is already in what came before (kube's
/// and tonic's errors often repeat their source in their own message).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct Layer {
        text: &'static str,
        #[source]
        source: Option<Box<Layer>>,
    }

    fn layers(texts: &[&'static str]) -> Layer {
        texts
            .iter()
            .rev()
            .fold(None, |source, text| {
                Some(Layer {
                    text,
                    source: source.map(Box::new),
                })
            })
            .expect("at least one layer")
    }

    #[test]
    fn every_cause_is_printed_after_its_parent() {
        let err = layers(&["upgrading pod shop/web-1", "ApiError: denied", "io error"]);
        assert_eq!(
            error_chain(&err),
            "upgrading pod shop/web-1: ApiError: denied: io error"
        );
    }

    #[test]
    fn a_cause_its_parent_already_printed_is_skipped() {
        let err = layers(&["connect failed: connection refused", "connection refused"]);
        assert_eq!(error_chain(&err), "connect failed: connection refused");
    }

    #[test]
    fn an_error_without_causes_is_its_message() {
        assert_eq!(error_chain(&layers(&["just this"])), "just this");
    }
}
