use super::*;

#[test]
fn exposes_build_info_and_ready() {
    let metrics = Metrics::new();
    let text = metrics.encode().unwrap();
    let version_line = format!(
        "kruise_rs_build_info{{version=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&version_line), "{text}");
    assert!(text.contains("kruise_rs_ready 0\n"), "{text}");

    metrics.set_ready(true);
    assert!(metrics.encode().unwrap().contains("kruise_rs_ready 1\n"));
    metrics.set_ready(false);
    assert!(metrics.encode().unwrap().contains("kruise_rs_ready 0\n"));
}
