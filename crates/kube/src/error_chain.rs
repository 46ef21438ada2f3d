//! One line for an error and its causes, for logs, events and conditions.

/// `outer: cause: cause …`, skipping a cause whose text is already in what came before (kube's
/// and tonic's errors often repeat their source in their own message).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = layer_text(err);
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = layer_text(cause);
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// One error's own text. kube prints an apiserver's refusal with the whole `Status` debug-printed
/// after its message (`ApiError: denied: Forbidden (Status { status: Some(Failure), … })`): its
/// message, reason and code say all of it.
fn layer_text(err: &(dyn std::error::Error + 'static)) -> String {
    match err.downcast_ref::<kube::Error>() {
        Some(kube::Error::Api(status)) if status.message.is_empty() => {
            format!("ApiError: {} ({})", status.reason, status.code)
        }
        Some(kube::Error::Api(status)) => {
            format!(
                "ApiError: {}: {} ({})",
                status.message, status.reason, status.code
            )
        }
        _ => err.to_string(),
    }
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
    fn an_apiservers_refusal_is_its_message_reason_and_code() {
        let refusal = |message: &str| {
            kube::Error::Api(
                kube::core::Status::failure(message, "Forbidden")
                    .with_code(403)
                    .boxed(),
            )
        };
        assert_eq!(
            error_chain(&refusal("pods is forbidden")),
            "ApiError: pods is forbidden: Forbidden (403)"
        );
        assert_eq!(error_chain(&refusal("")), "ApiError: Forbidden (403)");
        let wrapped = anyhow::Error::new(refusal("denied")).context("creating pod shop/web-1");
        assert_eq!(
            error_chain(wrapped.as_ref()),
            "creating pod shop/web-1: ApiError: denied: Forbidden (403)"
        );
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
