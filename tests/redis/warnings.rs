//! What the crate tells operators through `tracing`: build-time warnings
//! that name the rule, and failure-mode events with a stable `cause`.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::events::{capture, with_message};
use crate::support::{client, ok_app, serve};
use keyed_rate_limit::ConcurrencyLimitLayer;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

const UNSPLIT: &str = "local_fallback without instances(n)";
const EVICTS: &str = "may evict this rule's keys";

#[tokio::test]
async fn build_warns_by_rule_name_about_settings_that_let_a_fleet_over_admit() {
    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let server = RedisServer::start();
    let evicting = evicting.backend("w").await;
    let safe = server.backend("w").await;
    // Without the live count (on by default), nothing divides the fallback.
    let uncounted = RedisBackend::builder(server.url())
        .prefix("w")
        .without_live_instances()
        .build()
        .await
        .unwrap();
    let (events, _guard) = capture();

    let rule = |name: &str, redis| {
        Rule::new(name, KeyExtractor::everyone(), Quota::per_minute(10)).global(redis)
    };
    let _ = RateLimitLayer::builder()
        .rule(rule("unsplit", uncounted.clone()))
        .build()
        .unwrap();
    let _ = RateLimitLayer::builder()
        .rule(rule("evicted", evicting.clone()))
        .instances(3)
        .build()
        .unwrap();
    let _ = ConcurrencyLimitLayer::builder("exports", KeyExtractor::everyone(), 2)
        .global(uncounted.clone())
        .build()
        .unwrap();
    // Quiet: a live count, an instance count, a fail mode that doesn't
    // divide, noeviction.
    let _ = RateLimitLayer::builder()
        .rule(rule("counted", safe.clone()))
        .build()
        .unwrap();
    let _ = RateLimitLayer::builder()
        .rule(rule("split", safe.clone()))
        .instances(1)
        .build()
        .unwrap();
    let _ = RateLimitLayer::builder()
        .rule(rule("open", safe.clone()).on_redis_failure(FailureMode::FailOpen))
        .build()
        .unwrap();

    let named = |text| -> Vec<String> {
        with_message(&events, text)
            .iter()
            .map(|e| e["rule"].clone())
            .collect()
    };
    assert_eq!(named(UNSPLIT), ["unsplit", "exports"]);
    assert_eq!(named(EVICTS), ["evicted"]);
    assert_eq!(
        with_message(&events, EVICTS)[0]["maxmemory_policy"],
        "allkeys-lru"
    );
}

#[tokio::test]
async fn failure_mode_events_carry_a_stable_cause() {
    let mut server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("causes", KeyExtractor::everyone(), Quota::per_minute(10))
                .global(server.backend("causes").await)
                .on_redis_failure(FailureMode::FailOpen)
                .redis_timeout(Duration::from_millis(500))
                .circuit_breaker(
                    keyed_rate_limit::failure::BreakerConfig::default()
                        .open_for(Duration::from_secs(60)),
                ),
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let (events, _guard) = capture();
    server.kill();
    for _ in 0..3 {
        assert_eq!(client().get(&url).send().await.unwrap().status(), 200);
    }
    // One line a second per rule, standing for the decisions it held back.
    let failures = with_message(&events, "decided by its failure mode");
    assert_eq!(failures.len(), 1, "{events:?}");
    assert_eq!(failures[0]["suppressed"], "0");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(client().get(&url).send().await.unwrap().status(), 200);
    let failures = with_message(&events, "decided by its failure mode");
    assert_eq!(failures.len(), 2, "{events:?}");
    assert_eq!(failures[1]["suppressed"], "2");
    for e in &failures {
        assert_eq!(e["rule"], "causes");
        assert_eq!(e["mode"], "fail_open");
        assert!(
            ["error", "circuit_open"].contains(&e["cause"].as_str()),
            "{e:?}"
        );
        assert!(!e["detail"].is_empty());
    }
    // The lost connection opened the breaker: the later requests skipped Redis.
    assert_eq!(failures.last().unwrap()["cause"], "circuit_open");
    assert_eq!(
        with_message(&events, "circuit breaker opened")[0]["rule"],
        "causes"
    );
}

/// The breaker speaks at its changes: opened once, a failed probe at most
/// once a minute, and closed with how long Redis was out.
#[tokio::test]
async fn the_breaker_logs_an_outage_once_when_it_begins_and_once_when_it_ends() {
    let mut server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("outage", KeyExtractor::everyone(), Quota::per_minute(1000))
                .global(server.backend("outage").await)
                .on_redis_failure(FailureMode::FailOpen)
                .circuit_breaker(
                    keyed_rate_limit::failure::BreakerConfig::default()
                        .open_for(Duration::from_millis(100)),
                ),
        )
        .build()
        .unwrap();
    let url = serve(ok_app(layer)).await;
    let (events, _guard) = capture();
    server.kill();
    // A second of requests: the breaker probes about ten times, each fails.
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    // When the test first sees the "opened" line, the breaker is open: a
    // lower bound of the outage that does not depend on how many failures
    // it took to open.
    let mut opened_by = None;
    while tokio::time::Instant::now() < until {
        assert_eq!(client().get(&url).send().await.unwrap().status(), 200);
        if opened_by.is_none() && !with_message(&events, "circuit breaker opened").is_empty() {
            opened_by = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(with_message(&events, "circuit breaker opened").len(), 1);
    let probes = with_message(&events, "half-open probe failed");
    assert_eq!(probes.len(), 1, "at most once a minute: {probes:?}");
    server.restart();
    // It can close only once Redis is back.
    let down_at_least = tokio::time::Instant::now() - opened_by.unwrap();
    let closed = loop {
        assert!(tokio::time::Instant::now() < until + Duration::from_secs(10));
        assert_eq!(client().get(&url).send().await.unwrap().status(), 200);
        let closed = with_message(&events, "circuit breaker closed");
        if !closed.is_empty() {
            break closed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(closed.len(), 1);
    let out_for: u64 = closed[0]["out_for_ms"].parse().unwrap();
    // `out_for_ms` is truncated to whole milliseconds.
    assert!(
        out_for + 1 >= down_at_least.as_millis() as u64,
        "the breaker was open at least {down_at_least:?}, logged {out_for} ms"
    );
    assert_eq!(with_message(&events, "circuit breaker opened").len(), 1);
}

/// Refunds that cannot reach Redis are counted each, and logged once a
/// second per rule with how many the line stands for.
#[tokio::test]
async fn unsettled_refunds_during_an_outage_log_once_a_second() {
    use axum::{Router, http::StatusCode, routing::get};

    let mut server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new("spent", KeyExtractor::everyone(), Quota::per_minute(1000))
                .global(server.backend("settle").await)
                .on_redis_failure(FailureMode::FailOpen)
                // A 404 is not counted: its unit goes back after the response.
                .count_if(|res| res.status.is_success()),
        )
        .instances(1)
        .build()
        .unwrap();
    // Decided while Redis is up; answered once it is gone.
    let app = Router::new()
        .route(
            "/",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                StatusCode::NOT_FOUND
            }),
        )
        .layer(layer);
    let url = serve(app).await;
    let c = client();
    let sent = 40;
    let requests: Vec<_> = (0..sent)
        .map(|_| tokio::spawn(c.get(&url).send()))
        .collect();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let (events, _guard) = capture();
    server.kill();
    for r in requests {
        assert_eq!(r.await.unwrap().unwrap().status(), 404);
    }
    // The refunds run after each response: give the last ones a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = with_message(&events, "units not settled in redis");
    assert!(
        (1..=2).contains(&lines.len()),
        "{} lines for {sent} unsettled refunds",
        lines.len()
    );
    let stood_for: u64 = lines.len() as u64
        + lines
            .iter()
            .map(|l| l["suppressed"].parse::<u64>().unwrap())
            .sum::<u64>();
    assert!(stood_for <= sent, "{stood_for} > {sent}");
}
