//! A reload that changes a global rule's quota: each key's state converts
//! in the script, on Redis time, at its next decision (exact or a lease's
//! grant), as the rule's `QuotaChange` says; over HTTP against a private
//! `redis-server`, for every algorithm.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::gateway::HEALTHY_TIMEOUT;
use crate::support::sf::member;
use crate::support::{ALGORITHMS, get_with, ok_app, serve};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::rule::{LeasePolicy, QuotaChange};
use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

fn rule(redis: &RedisBackend, algorithm: Algorithm, q: Quota, how: QuotaChange) -> Rule {
    Rule::new("api", KeyExtractor::header("x-api-key"), q)
        .global(redis.clone())
        .algorithm(algorithm)
        .redis_timeout(HEALTHY_TIMEOUT)
        .on_quota_change(how)
}

async fn get(url: &str) -> reqwest::Response {
    get_with(url, &[("x-api-key", "k")]).await
}

/// Spends 80 of 100 an hour over HTTP, reloads to `to`, and returns the
/// next request's status and `r`.
async fn after_reload(
    server: &RedisServer,
    algorithm: Algorithm,
    to: Quota,
    how: QuotaChange,
) -> (u16, Option<i64>) {
    let prefix = format!("qc-{algorithm}-{how:?}-{}", to.window().as_secs());
    spend_then_reload(
        server,
        &prefix,
        algorithm,
        (Quota::per_hour(100), 80),
        to,
        how,
    )
    .await
}

/// Spends `spent` of `from` over HTTP, reloads to `to`, and returns the
/// next request's status and `r`.
async fn spend_then_reload(
    server: &RedisServer,
    prefix: &str,
    algorithm: Algorithm,
    (from, spent): (Quota, u32),
    to: Quota,
    how: QuotaChange,
) -> (u16, Option<i64>) {
    let redis = server.backend(prefix).await;
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule(&redis, algorithm, from, how))
        .build()
        .unwrap();
    let url = serve(ok_app(layer.clone())).await;
    for _ in 0..spent {
        assert_eq!(get(&url).await.status(), 200);
    }
    layer.reload([rule(&redis, algorithm, to, how)]).unwrap();
    let res = get(&url).await;
    let r = (res.status() == 200)
        .then(|| member(&res, "ratelimit", "api").int("r"))
        .flatten();
    (res.status().as_u16(), r)
}

#[tokio::test]
async fn every_algorithm_keeps_usage_across_a_lowered_quota() {
    let server = RedisServer::start();
    // 10 of the new 50 left before this request, none, or all.
    let cases = [
        (QuotaChange::Proportional, (200, Some(9))),
        (QuotaChange::AsIs, (429, None)),
        (QuotaChange::Reset, (200, Some(49))),
    ];
    for algorithm in ALGORITHMS {
        for (how, want) in cases {
            let got = after_reload(&server, algorithm, Quota::per_hour(50), how).await;
            assert_eq!(got, want, "{algorithm}, {how:?}");
        }
    }
    // Another window: the smooth buckets and the fixed window convert; the
    // sliding window's counts are not comparable and start afresh.
    let window = Quota::new(50, Duration::from_secs(1800));
    for (algorithm, want) in [
        (Algorithm::Gcra, (200, Some(9))),
        (Algorithm::TokenBucket, (200, Some(9))),
        (Algorithm::FixedWindow, (200, Some(9))),
        (Algorithm::SlidingWindow, (200, Some(49))),
    ] {
        let got = after_reload(&server, algorithm, window, QuotaChange::Proportional).await;
        assert_eq!(got, want, "{algorithm}, a new window");
    }
}

/// A leasing rule converts in the lease's grant.
#[tokio::test]
async fn a_lease_grant_converts_too() {
    let server = RedisServer::start();
    for (how, want) in [(QuotaChange::AsIs, 429), (QuotaChange::Reset, 200)] {
        let redis = server.backend(&format!("qc-lease-{how:?}")).await;
        let leased = |q| {
            rule(&redis, Algorithm::Gcra, q, how).lease(LeasePolicy::new(Duration::from_millis(50)))
        };
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(leased(Quota::per_hour(100)))
            .build()
            .unwrap();
        let url = serve(ok_app(layer.clone())).await;
        for _ in 0..80 {
            assert_eq!(get(&url).await.status(), 200);
        }
        layer.reload([leased(Quota::per_hour(50))]).unwrap();
        assert_eq!(get(&url).await.status(), want, "{how:?}");
    }
}

/// The old state moves into the new: once the key is whole again under the
/// new quota, what it had used under the old one is not charged again.
#[tokio::test]
async fn a_converted_key_is_charged_once() {
    let server = RedisServer::start();
    let redis = server.backend("qc-once").await;
    let q = |n| Quota::new(n, Duration::from_secs(2));
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule(&redis, Algorithm::Gcra, q(10), QuotaChange::AsIs))
        .build()
        .unwrap();
    let url = serve(ok_app(layer.clone())).await;
    for _ in 0..8 {
        assert_eq!(get(&url).await.status(), 200);
    }
    // 8 used: 1.6 s to whole under the old quota, 0.8 s under the new one.
    layer
        .reload([rule(&redis, Algorithm::Gcra, q(20), QuotaChange::AsIs)])
        .unwrap();
    let res = get(&url).await;
    assert_eq!(member(&res, "ratelimit", "api").int("r"), Some(11));
    // Whole again under the new quota (0.9 s), the old state not yet
    // expired (1.6 s) had it stayed.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let res = get(&url).await;
    assert_eq!(member(&res, "ratelimit", "api").int("r"), Some(19));
}

/// A reload between quotas that span ages converts without overflowing
/// the conversion's end.
#[tokio::test]
async fn a_quota_of_ages_reloads() {
    let server = RedisServer::start();
    let redis = server.backend("qc-ages").await;
    let ages = |n| Quota::new(n, Duration::MAX);
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule(
            &redis,
            Algorithm::Gcra,
            ages(1),
            QuotaChange::Proportional,
        ))
        .build()
        .unwrap();
    layer
        .reload([rule(
            &redis,
            Algorithm::Gcra,
            ages(2),
            QuotaChange::Proportional,
        )])
        .unwrap();
    let url = serve(ok_app(layer)).await;
    assert_eq!(get(&url).await.status(), 200);
}

/// A calendar count on Redis converts as a local one does: 8 of 10 a day
/// (or an aligned week) is 4 of 5 or 16 of 20 (`Proportional`), 5 of 5 or
/// 8 of 20 (`AsIs`), none (`Reset`). An aligned window of another length
/// is another window: it starts afresh.
#[tokio::test]
async fn calendar_quotas_convert_in_every_mode() {
    let server = RedisServer::start();
    let day: fn(u32) -> Quota = Quota::per_calendar_day;
    let week: fn(u32) -> Quota = |n| Quota::aligned(n, Duration::from_secs(7 * 86_400));
    let cases = [
        (QuotaChange::Proportional, 5, (200, Some(0))),
        (QuotaChange::Proportional, 20, (200, Some(3))),
        (QuotaChange::AsIs, 5, (429, None)),
        (QuotaChange::AsIs, 20, (200, Some(11))),
        (QuotaChange::Reset, 5, (200, Some(4))),
        (QuotaChange::Reset, 20, (200, Some(19))),
    ];
    for (period, quota) in [("day", day), ("week", week)] {
        for (how, to, want) in cases {
            let prefix = format!("qc-cal-{period}-{how:?}-{to}");
            let got = spend_then_reload(
                &server,
                &prefix,
                Algorithm::Gcra,
                (quota(10), 8),
                quota(to),
                how,
            )
            .await;
            assert_eq!(got, want, "{how:?} to {to} a {period}");
        }
    }
    let hour = Quota::aligned(10, Duration::from_secs(3600));
    let got = spend_then_reload(
        &server,
        "qc-cal-week-to-hour",
        Algorithm::Gcra,
        (week(10), 8),
        hour,
        QuotaChange::AsIs,
    )
    .await;
    assert_eq!(got, (200, Some(9)), "a week's count is no hour's");
}
