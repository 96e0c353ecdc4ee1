use super::*;

/// What a scrape of a fleetd that has done nothing yet shows.
fn first_scrape() -> String {
    let metrics = Metrics::new("1.2.3");
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, &metrics.exposed).unwrap();
    text
}

#[test]
fn failure_counters_are_served_at_zero_before_the_first_failure() {
    let text = first_scrape();
    for series in [
        r#"fleet_engine_reconcile_failure_count_total{type="registry"} 0"#,
        r#"fleet_engine_reconcile_failure_count_total{type="lost_leadership"} 0"#,
        r#"fleet_engine_task_failure_count_total{type="schedule"} 0"#,
        r#"fleet_engine_scheduling_decisions_total{outcome="waiting"} 0"#,
        r#"fleet_agent_task_count_total{kind="start",result="failed"} 0"#,
        r#"fleet_agent_dbus_errors_total{type="start"} 0"#,
        r#"fleet_agent_units{state="failed"} 0"#,
        r#"fleet_registry_operation_failed_count_total{type="txn"} 0"#,
        r#"fleet_registry_etcd_errors_total{type="txn",error="unavailable"} 0"#,
        r#"fleet_registry_etcd_errors_total{type="keep_alive",error="permission_denied"} 0"#,
        r#"fleet_api_held_view_pages_total{served="behind"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == series), "no {series} in\n{text}");
    }
}

#[test]
fn build_info_and_the_standard_process_metrics_are_served() {
    let text = first_scrape();
    assert!(
        text.lines()
            .any(|l| l == r#"fleet_build_info{version="1.2.3"} 1"#),
        "{text}"
    );
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_open_fds",
        "process_max_fds",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "no {name} in\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# TYPE {name} "))),
            "no TYPE of {name}"
        );
    }
}
