//! `RateLimitLayer::describe`: the full Markdown and Mermaid output for a
//! known chain, with local, global, shadow and dynamic rules.

use std::time::Duration;

use http::StatusCode;
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::FailureMode;
use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

async fn layer(redis: RedisBackend) -> RateLimitLayer {
    RateLimitLayer::builder()
        .rule(
            Rule::new(
                "per-key",
                KeyExtractor::header("x-api-key"),
                Quota::per_minute(100).with_burst(20),
            )
            .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .rule(
            Rule::new(
                "per-route",
                KeyExtractor::matched_route().and(KeyExtractor::peer_ip()),
                Quota::new(1000, Duration::from_secs(10)),
            )
            .global(redis)
            .algorithm(Algorithm::SlidingWindow)
            .on_redis_failure(FailureMode::FailClosed)
            .redis_timeout(Duration::from_millis(20))
            .cost(2),
        )
        .rule(
            Rule::new(
                "plan",
                KeyExtractor::header("x-api-key"),
                Quota::per_second(1),
            )
            .quota_fn(|_| Quota::per_hour(10))
            .on_missing_key(OnMissingKey::Fallback(KeyExtractor::peer_ip()))
            .shadow(true),
        )
        .build()
        .unwrap()
}

const MARKDOWN: &str = "\
| # | rule | key | quota | algorithm | scope | failure mode | on deny |
|---|---|---|---|---|---|---|---|
| 1 | per-key | `header:x-api-key` | 100/min, burst 20 | gcra | local | n/a | 429 + Retry-After; missing key: 401 |
| 2 | per-route | `matched_route+peer_ip` | 1000/10s, cost 2 | sliding_window | global, coalesced | fail_closed, 20ms timeout | 429 + Retry-After; missing key: skip; 500 without an axum router or ConnectInfo |
| 3 | plan | `header:x-api-key` | per request (quota_fn) | gcra | local | n/a | log only (shadow); missing key: fallback: peer_ip |
";

const MERMAID: &str = r#"flowchart TD
    client([client]) --> gateway["gateway: RateLimitLayer"]
    gateway --> r1["1. per-key<br/>key: header:x-api-key<br/>100/min, burst 20 (gcra)"]
    r1 --> s1[("local store (governor)")]
    s1 --> d1{within quota?}
    r1 -->|missing key| m1["401"]
    d1 -->|no| deny
    d1 -->|yes| r2
    r2["2. per-route<br/>key: matched_route+peer_ip<br/>1000/10s, cost 2 (sliding_window)"]
    r2 --> s2[("Redis<br/>on failure: fail_closed, 20ms timeout")]
    s2 --> d2{within quota?}
    d2 -->|no| deny
    d2 -->|yes| r3
    r3["3. plan<br/>key: header:x-api-key<br/>per request (quota_fn) (gcra)"]
    r3 --> s3[("local store (governor)")]
    s3 --> d3{within quota?}
    d3 -.->|"no: shadow_deny"| metrics
    d3 -->|"yes, or no: log only (shadow)"| service[service]
    deny["429 Too Many Requests + Retry-After<br/>gRPC: RESOURCE_EXHAUSTED + grpc-retry-pushback-ms"]
    deny -.-> metrics[("metrics: rate_limit_decisions_total")]
"#;

#[tokio::test]
async fn renders_the_chain() {
    let server = RedisServer::start();
    let redis = RedisBackend::builder(server.url()).build().await.unwrap();
    let d = layer(redis).await.describe();
    assert_eq!(d.markdown(), MARKDOWN);
    assert_eq!(d.to_string(), MARKDOWN);
    assert_eq!(d.mermaid(), MERMAID);
    assert_eq!(
        d.rules()[1].failure_mode.as_deref(),
        Some("fail_closed, 20ms timeout")
    );
}
