use super::*;
use kruise_rs_kube::metrics::Metrics;

fn manager_text(manager: &ManagerMetrics) -> String {
    let metrics = Metrics::with(|registry| manager.register(registry));
    metrics.encode().unwrap()
}

#[test]
fn reconciles_start_at_zero_and_count_by_result() {
    let manager = ManagerMetrics::new();
    let text = manager_text(&manager);
    for controller in CONTROLLERS {
        let line =
            format!("kruise_rs_manager_reconcile_seconds_count{{controller=\"{controller}\"}} 0\n");
        assert!(text.contains(&line), "{text}");
        for result in ["ok", "error"] {
            let line = format!(
                "kruise_rs_manager_reconciles_total{{controller=\"{controller}\",result=\"{result}\"}} 0\n"
            );
            assert!(text.contains(&line), "{text}");
        }
    }
    manager.reconciled("sidecarset", true, 0.01);
    manager.reconciled("sidecarset", false, 0.02);
    manager.reconciled("sidecarset", true, 0.03);
    let text = manager_text(&manager);
    assert!(
        text.contains(
            "kruise_rs_manager_reconciles_total{controller=\"sidecarset\",result=\"ok\"} 2\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "kruise_rs_manager_reconciles_total{controller=\"sidecarset\",result=\"error\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("kruise_rs_manager_reconcile_seconds_count{controller=\"sidecarset\"} 3\n"),
        "{text}"
    );
}

#[tokio::test]
async fn timed_records_the_result() {
    let manager = ManagerMetrics::new();
    let ok: Result<u8, ()> = manager.timed("imagepulljob", async { Ok(1) }).await;
    assert_eq!(ok, Ok(1));
    let err: Result<u8, &str> = manager.timed("nodeimage", async { Err("x") }).await;
    assert_eq!(err, Err("x"));
    let text = manager_text(&manager);
    assert!(
        text.contains(
            "kruise_rs_manager_reconciles_total{controller=\"imagepulljob\",result=\"ok\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "kruise_rs_manager_reconciles_total{controller=\"nodeimage\",result=\"error\"} 1\n"
        ),
        "{text}"
    );
}

#[test]
fn admissions_count_by_kind_and_verdict() {
    let manager = ManagerMetrics::new();
    manager.admitted("pods", "patched", 0.001);
    manager.admitted("sidecarsets", "denied", 0.002);
    let text = manager_text(&manager);
    assert!(
        text.contains("kruise_rs_manager_admissions_total{kind=\"pods\",verdict=\"patched\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "kruise_rs_manager_admissions_total{kind=\"sidecarsets\",verdict=\"denied\"} 1\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("kruise_rs_manager_admission_seconds_count{kind=\"pods\"} 1\n"),
        "{text}"
    );
}

#[test]
fn sidecarset_series_go_with_the_sidecarset() {
    let manager = ManagerMetrics::new();
    manager.set_sidecarset_pods("a", [3, 2, 1, 1]);
    manager.set_sidecarset_pods("b", [5, 5, 5, 5]);
    let text = manager_text(&manager);
    assert!(
        text.contains("kruise_rs_manager_sidecarset_pods{sidecarset=\"a\",state=\"matched\"} 3\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "kruise_rs_manager_sidecarset_pods{sidecarset=\"a\",state=\"updated_ready\"} 1\n"
        ),
        "{text}"
    );
    manager.retain_sidecarsets(|name| name == "b");
    let text = manager_text(&manager);
    assert!(!text.contains("sidecarset=\"a\""), "{text}");
    assert!(
        text.contains("kruise_rs_manager_sidecarset_pods{sidecarset=\"b\",state=\"ready\"} 5\n"),
        "{text}"
    );
}

#[test]
fn leader_gauge_starts_at_zero_and_follows_leadership() {
    let manager = ManagerMetrics::new();
    assert!(manager_text(&manager).contains("kruise_rs_manager_leader 0\n"));
    manager.set_leader(true);
    assert!(manager_text(&manager).contains("kruise_rs_manager_leader 1\n"));
    manager.set_leader(false);
    assert!(manager_text(&manager).contains("kruise_rs_manager_leader 0\n"));
}

#[test]
fn forgetting_the_objects_drops_their_series() {
    let manager = ManagerMetrics::new();
    manager.set_sidecarset_pods("a", [1, 1, 1, 1]);
    manager.set_imagepulljob_nodes([4, 1, 2, 1]);
    manager.forget_objects();
    let text = manager_text(&manager);
    assert!(!text.contains("sidecarset=\"a\""), "{text}");
    for state in IMAGEPULLJOB_NODE_STATES {
        let line = format!("kruise_rs_manager_imagepulljob_nodes{{state=\"{state}\"}} 0\n");
        assert!(text.contains(&line), "{text}");
    }
}

#[test]
fn imagepulljob_nodes_by_state() {
    let manager = ManagerMetrics::new();
    assert!(
        manager_text(&manager)
            .contains("kruise_rs_manager_imagepulljob_nodes{state=\"desired\"} 0\n")
    );
    manager.set_imagepulljob_nodes([4, 1, 2, 1]);
    let text = manager_text(&manager);
    for (state, n) in [
        ("desired", 4),
        ("active", 1),
        ("succeeded", 2),
        ("failed", 1),
    ] {
        let line = format!("kruise_rs_manager_imagepulljob_nodes{{state=\"{state}\"}} {n}\n");
        assert!(text.contains(&line), "{text}");
    }
}

fn text_with_upstream_names(manager: &ManagerMetrics) -> String {
    let metrics = Metrics::with_unprefixed(
        |registry| manager.register(registry),
        Some(|registry: &mut Registry| manager.register_upstream_names(registry)),
    );
    metrics.encode().unwrap()
}

#[test]
fn upstream_names_are_served_only_when_asked_and_count_the_same_reconciles() {
    let plain = ManagerMetrics::new();
    plain.reconciled("sidecarset", true, 0.01);
    let text = text_with_upstream_names(&plain);
    assert!(!text.contains("controller_runtime_"), "{text}");
    assert!(!text.contains("kruise_manager_is_leader"), "{text}");

    let manager = ManagerMetrics::with_upstream_names();
    let text = text_with_upstream_names(&manager);
    for controller in [
        "sidecarset-controller",
        "imagepulljob-controller",
        "imagelistpulljob-controller",
        "nodeimage-controller",
    ] {
        for line in [
            format!(
                "controller_runtime_reconcile_total{{controller=\"{controller}\",result=\"success\"}} 0\n"
            ),
            format!(
                "controller_runtime_reconcile_total{{controller=\"{controller}\",result=\"error\"}} 0\n"
            ),
            format!("controller_runtime_reconcile_errors_total{{controller=\"{controller}\"}} 0\n"),
            format!(
                "controller_runtime_reconcile_time_seconds_count{{controller=\"{controller}\"}} 0\n"
            ),
            format!("controller_runtime_active_workers{{controller=\"{controller}\"}} 0\n"),
        ] {
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
    }
    assert!(text.contains("kruise_manager_is_leader 0\n"), "{text}");
    // Ours are still there, prefixed.
    assert!(
        text.contains(
            "kruise_rs_manager_reconciles_total{controller=\"sidecarset\",result=\"ok\"} 0\n"
        ),
        "{text}"
    );

    manager.reconciled("sidecarset", true, 0.01);
    manager.reconciled("sidecarset", false, 0.2);
    manager.set_leader(true);
    manager.set_workers("nodeimage", 16);
    let text = text_with_upstream_names(&manager);
    for line in [
        "controller_runtime_reconcile_total{controller=\"sidecarset-controller\",result=\"success\"} 1\n",
        "controller_runtime_reconcile_total{controller=\"sidecarset-controller\",result=\"error\"} 1\n",
        "controller_runtime_reconcile_errors_total{controller=\"sidecarset-controller\"} 1\n",
        "controller_runtime_reconcile_time_seconds_count{controller=\"sidecarset-controller\"} 2\n",
        // controller-runtime's buckets: 0.15 is one of them, not one of ours.
        "controller_runtime_reconcile_time_seconds_bucket{controller=\"sidecarset-controller\",le=\"0.15\"} 1\n",
        "controller_runtime_max_concurrent_reconciles{controller=\"nodeimage-controller\"} 16\n",
        "kruise_manager_is_leader 1\n",
        "kruise_rs_manager_reconciles_total{controller=\"sidecarset\",result=\"error\"} 1\n",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
}

#[tokio::test]
async fn a_running_reconcile_counts_as_an_active_worker_until_it_ends_or_is_dropped() {
    let manager = ManagerMetrics::with_upstream_names();
    let active = |manager: &ManagerMetrics| {
        let line = "controller_runtime_active_workers{controller=\"imagepulljob-controller\"} ";
        text_with_upstream_names(manager)
            .lines()
            .find_map(|l| l.strip_prefix(line).map(str::to_owned))
            .expect("the series")
    };
    let (release, wait) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(manager.timed("imagepulljob", async move {
        let _ = wait.await;
        Ok::<(), ()>(())
    }));
    // The reconcile has started once the gauge says so.
    while active(&manager) != "1" {
        tokio::task::yield_now().await;
    }
    release.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert_eq!(active(&manager), "0");
    // Dropped mid-way (a shutdown): no worker left counted.
    let pending = manager.timed("imagepulljob", std::future::pending::<Result<(), ()>>());
    let mut pending = Box::pin(pending);
    assert!(futures::poll!(&mut pending).is_pending());
    assert_eq!(active(&manager), "1");
    drop(pending);
    assert_eq!(active(&manager), "0");
}
