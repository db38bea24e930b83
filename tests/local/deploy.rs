//! What ships in `deploy/` is tested like code: the alert and recording
//! rules with promtool and their unit tests, each alert's runbook entry,
//! and every dashboard query parsed by promtool and naming only metrics
//! the crate emits.

use std::path::{Path, PathBuf};

use crate::support::promtool::{emitted, metric_names, present, run};

fn deploy(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(dir)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The crate's series a rules file names (recorded series are `rule:…`).
fn series_in(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("rate_limit_"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn metric_names_finds_the_selectors_only() {
    let expr = r#"histogram_quantile(0.99, sum by (rule, le) (rate(rate_limit_backend_seconds_bucket{rule=~"a|b", x="y}"}[5m])))
        > 0.8 * max by (rule) (rate_limit_redis_timeout_seconds) or on (rule) rule:x:ratio offset 1h and bool 2"#;
    assert_eq!(
        metric_names(expr),
        [
            "rate_limit_backend_seconds_bucket",
            "rate_limit_redis_timeout_seconds",
            "rule:x:ratio"
        ]
    );
    assert!(emitted("rate_limit_backend_seconds_bucket"));
    assert!(!emitted("rate_limit_decisions_total_bucket"));
    assert!(!emitted("rate_limit_requests_total"));
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = deploy("prometheus");
    let rules = read(&dir.join("rate-limit.rules.yml"));
    let tests = read(&dir.join("rate-limit.rules.test.yml"));
    for name in series_in(&rules).iter().chain(&series_in(&tests)) {
        assert!(emitted(name), "{name} is not a metric the crate emits");
    }
    if !present() {
        return;
    }
    let out = run(&dir, &["check", "rules", "rate-limit.rules.yml"], "");
    assert!(out.contains("SUCCESS"), "{out}");
    let out = run(&dir, &["test", "rules", "rate-limit.rules.test.yml"], "");
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_is_tested_and_has_a_runbook_entry() {
    let dir = deploy("prometheus");
    let tests = read(&dir.join("rate-limit.rules.test.yml"));
    let runbook = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/observe.md"));
    let rules = read(&dir.join("rate-limit.rules.yml"));
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::trim)
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for alert in alerts {
        let tested = format!("alertname: {alert}\n");
        // Firing: a test expecting it with labels; not firing: `exp_alerts: []`.
        let cases: Vec<&str> = tests.split(&tested).skip(1).collect();
        assert!(
            cases
                .iter()
                .any(|c| c.trim_start().starts_with("exp_alerts:\n")),
            "{alert}: no firing case"
        );
        assert!(
            cases
                .iter()
                .any(|c| c.trim_start().starts_with("exp_alerts: []")),
            "{alert}: no case where it stays silent"
        );
        assert!(
            runbook.contains(&format!("### `{alert}`")),
            "{alert}: no runbook entry in docs/observe.md"
        );
    }
}

#[test]
fn every_dashboard_query_parses_and_names_only_crate_metrics() {
    let path = deploy("grafana").join("keyed-rate-limit.json");
    let dashboard: serde_json::Value = serde_json::from_str(&read(&path)).unwrap();
    // Grafana's variables, as a query over the last hour would have them.
    let expand = |expr: &str| {
        expr.replace("$__rate_interval", "5m")
            .replace("$__range", "1h")
            .replace("$__interval", "1m")
            .replace("${rule}", ".*")
            .replace("$rule", ".*")
    };
    let mut queries = Vec::new();
    let mut panels: Vec<&serde_json::Value> =
        dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        // Rows hold panels of their own.
        panels.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a PromQL target");
            queries.push((
                format!("{} {}", panel["title"], target["refId"]),
                expand(expr),
            ));
        }
    }
    assert!(queries.len() >= 10, "{queries:?}");
    // The panels the design asks for.
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for want in [
        "Decisions by outcome",
        "Deny share",
        "Fail-open",
        "Time decided by a failure mode",
        "Circuit breaker",
        "Redis decision latency",
        "Keys held",
    ] {
        assert!(
            titles.iter().any(|t| t.starts_with(want)),
            "no panel {want}: {titles:?}"
        );
    }
    for (panel, expr) in &queries {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{panel}: selects nothing: {expr}");
        for name in names {
            assert!(
                emitted(&name),
                "{panel}: {name} is not a metric the crate emits"
            );
        }
    }
    // The rule variable's query, `label_values(metric, label)`.
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["definition"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'));
            let metric = inner.and_then(|i| i.split(',').next()).unwrap_or(q).trim();
            assert!(emitted(metric), "variable {}: {q}", var["name"]);
        }
    }
    if !present() {
        return;
    }
    // promtool parses each query as a recording rule's expression (JSON is YAML).
    let rules: Vec<serde_json::Value> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": expr}))
        .collect();
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = std::env::temp_dir().join(format!("krl-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dashboard.rules.json"), file.to_string()).unwrap();
    let out = run(&dir, &["check", "rules", "dashboard.rules.json"], "");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
