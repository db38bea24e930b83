//! A flood of denies is a few log lines, and the counter has every deny.

use std::time::Duration;

use axum::body::Body;
use http::Request;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use tower::ServiceExt;

use crate::support::{events, metrics};

#[tokio::test]
async fn a_deny_flood_logs_once_a_second_per_rule_and_counts_every_deny() {
    metrics::snapshotter();
    let (events, _guard) = events::capture();
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "flood",
            KeyExtractor::everyone(),
            Quota::per_hour(1),
        ))
        .build()
        .unwrap();
    let svc = layer.layer(tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
    }));
    let call = || async {
        let req = Request::get("/").body(Body::empty()).unwrap();
        svc.clone().oneshot(req).await.unwrap().status().as_u16()
    };
    assert_eq!(call().await, 200);
    for _ in 0..500 {
        assert_eq!(call().await, 429);
    }
    let lines = events::with_message(&events, "rate limited");
    // 500 denies in well under a second here; a slow machine may cross one
    // second boundary, never many.
    assert!(
        (1..=3).contains(&lines.len()),
        "{} lines for 500 denies",
        lines.len()
    );
    assert_eq!(lines[0]["suppressed"], "0", "the first deny is logged");
    const DECISIONS: &str = "rate_limit_decisions_total";
    assert_eq!(metrics::counter(DECISIONS, "flood", "deny"), 500);

    // The next line, a second on, stands for the denies held back.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(call().await, 429);
    let lines = events::with_message(&events, "rate limited");
    let told: u64 = lines
        .iter()
        .map(|l| l["suppressed"].parse::<u64>().unwrap() + 1)
        .sum();
    assert_eq!(told, 501, "every deny is in a line's count: {lines:?}");
}

/// Every program a user copies (the README's example and every file in
/// examples/) installs a subscriber that shows WARN and INFO whatever
/// features are on. A bare `tracing_subscriber::fmt::init()` reads
/// `RUST_LOG` once tracing-subscriber's `env-filter` feature is on anywhere
/// in the build, and with `RUST_LOG` unset shows errors only: a gateway
/// copied from it logged nothing through a Redis outage.
#[test]
fn every_copied_program_shows_warn_and_info() {
    const FILTER: &str = r#"EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())"#;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut programs = vec![("README.md".to_owned(), readme)];
    for entry in std::fs::read_dir(root.join("examples")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        programs.push((path.display().to_string(), text));
    }
    for (name, text) in &programs {
        // The code without its comments; rustfmt may break a call over lines.
        let code = text.lines().filter(|l| !l.trim_start().starts_with("//"));
        let flat: String = code.flat_map(str::split_whitespace).collect();
        let filter: String = FILTER.split_whitespace().collect();
        assert!(text.contains("fn main("), "{name}: no main");
        assert!(flat.contains(&filter), "{name}: no `{FILTER}`");
        assert!(
            flat.contains(".with_env_filter("),
            "{name}: the filter is not installed"
        );
        for bare in ["fmt::init()", "fmt().init()"] {
            assert!(!flat.contains(bare), "{name}: `{bare}` shows errors only");
        }
    }
}
