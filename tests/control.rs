//! Lockouts and the control handle, over HTTP, on local rules and on every
//! Redis algorithm (a private `redis-server`).

mod common;
mod support;

use std::time::Duration;

use axum::{Extension, Router, routing::get};
use common::{client, header, serve};
use keyed_rate_limit::error::ControlError;
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{Quota, RateLimitDecision, RateLimitLayer, Rule, key::KeyExtractor};

/// `GET /` answers with the source of the first rule's decision.
fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<RateLimitDecision>| async move {
                d.rules()[0].source.as_str().to_owned()
            }),
        )
        .layer(layer)
}

/// One request as `user`: status and `Retry-After` in seconds.
async fn hit(c: &reqwest::Client, url: &str, user: &str) -> (u16, Option<u64>) {
    let res = c.get(url).header("x-user", user).send().await.unwrap();
    let retry = header(&res, "retry-after").map(|v| v.parse().unwrap());
    (res.status().as_u16(), retry)
}

const BLOCK: Duration = Duration::from_secs(900);

fn login(quota: Quota) -> Rule {
    Rule::new("login", KeyExtractor::header("x-user"), quota).lockout(Lockout::new(
        3,
        Duration::from_secs(60),
        BLOCK,
    ))
}

#[tokio::test]
async fn a_local_lockout_blocks_past_the_window_and_the_handle_lifts_it() {
    let layer = RateLimitLayer::builder()
        .rule(login(Quota::per_minute(2)))
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(app(layer)).await;
    let c = client();
    assert_eq!(hit(&c, &url, "mallory").await.0, 200);
    assert_eq!(hit(&c, &url, "mallory").await.0, 200);
    // Two denies with the quota's own wait, then the third locks.
    for _ in 0..2 {
        let (status, retry) = hit(&c, &url, "mallory").await;
        assert_eq!(status, 429);
        assert!(retry.unwrap() <= 60);
    }
    assert_eq!(hit(&c, &url, "mallory").await, (429, Some(900)));
    let (status, retry) = hit(&c, &url, "mallory").await;
    assert_eq!(status, 429);
    assert!(
        (899..=900).contains(&retry.unwrap()),
        "the block's time left"
    );
    assert_eq!(hit(&c, &url, "alice").await.0, 200, "other keys are free");
    let peek = control.peek("login", "mallory").await.unwrap();
    assert!(peek.retry_after().unwrap() > Duration::from_secs(890));

    // Unblocked, the key is back to its quota, which it had spent.
    control.unblock("login", "mallory").await.unwrap();
    let (status, retry) = hit(&c, &url, "mallory").await;
    assert_eq!(status, 429);
    assert!(retry.unwrap() <= 60, "the quota's wait, not the block's");
    control.reset("login", "mallory").await.unwrap();
    assert_eq!(hit(&c, &url, "mallory").await.0, 200);

    control
        .block("login", "alice", Duration::from_secs(30))
        .await
        .unwrap();
    let (status, retry) = hit(&c, &url, "alice").await;
    assert_eq!(status, 429);
    assert!((29..=30).contains(&retry.unwrap()));
}

#[tokio::test]
async fn the_handle_moves_a_local_bucket_within_empty_and_whole() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "api",
            KeyExtractor::header("x-user"),
            Quota::per_minute(10),
        ))
        .rule(
            Rule::new("plan", KeyExtractor::header("x-user"), Quota::per_minute(1))
                .quota_fn(|_| Quota::per_minute(5)),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(app(layer)).await;
    let c = client();
    assert_eq!(control.peek("api", "u").await.unwrap().remaining(), 10);
    assert_eq!(
        control.penalize("api", "u", 4).await.unwrap().remaining(),
        6
    );
    let res = c.get(&url).header("x-user", "u").send().await.unwrap();
    let ratelimit = header(&res, "ratelimit").unwrap();
    assert!(
        ratelimit.starts_with("\"api\";r=5;t=6,"),
        "requests see the charge: {ratelimit}"
    );
    // Past empty saturates: the next unit waits one interval (6 s).
    let d = control.penalize("api", "u", 1000).await.unwrap();
    assert!(!d.is_allowed());
    assert!(d.retry_after().unwrap() <= Duration::from_secs(6));
    assert_eq!(hit(&c, &url, "u").await.0, 429);
    let d = control.reward("api", "u", 1000).await.unwrap();
    assert_eq!(d.remaining(), 10, "never past whole");
    assert_eq!(hit(&c, &url, "u").await.0, 200);

    let err = control.peek("plan", "u").await.unwrap_err();
    assert!(matches!(err, ControlError::DynamicQuota(ref r) if r == "plan"));
    control
        .block("plan", "u", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        hit(&c, &url, "u").await.0,
        429,
        "a quota_fn rule can be blocked"
    );
    let err = control.reset("nope", "u").await.unwrap_err();
    assert_eq!(err.to_string(), "no rule named \"nope\"");
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use common::ALGORITHMS;
    use keyed_rate_limit::Algorithm;
    use support::redis_server::RedisServer;

    fn global(rule: Rule, redis: keyed_rate_limit::backend::redis::RedisBackend) -> Rule {
        rule.global(redis).redis_timeout(Duration::from_millis(500))
    }

    /// Every algorithm and a calendar quota: read, charge, give back,
    /// reset, block and unblock, as the layer then decides.
    #[tokio::test]
    async fn the_handle_works_on_every_redis_algorithm() {
        let server = RedisServer::start();
        let mut cases: Vec<(Algorithm, Quota)> = ALGORITHMS
            .iter()
            .map(|a| (*a, Quota::per_minute(5)))
            .collect();
        cases.push((Algorithm::FixedWindow, Quota::per_day(5)));
        for (algorithm, quota) in cases {
            let what = format!("{algorithm:?} {quota}");
            let rule = Rule::new("api", KeyExtractor::header("x-user"), quota).algorithm(algorithm);
            let layer = RateLimitLayer::builder()
                .rule(global(rule, server.backend(&what.replace(' ', "-")).await))
                .build()
                .unwrap();
            let control = layer.control();
            let url = serve(app(layer)).await;
            let c = client();
            assert_eq!(
                control.peek("api", "u").await.unwrap().remaining(),
                5,
                "{what}"
            );
            assert_eq!(hit(&c, &url, "u").await.0, 200, "{what}");
            let d = control.penalize("api", "u", 2).await.unwrap();
            assert_eq!(d.remaining(), 2, "{what}: 5 - 1 - 2");
            let d = control.reward("api", "u", 1).await.unwrap();
            assert_eq!(d.remaining(), 3, "{what}");
            let d = control.penalize("api", "u", 1000).await.unwrap();
            assert!(!d.is_allowed(), "{what}: empty");
            assert_eq!(hit(&c, &url, "u").await.0, 429, "{what}");
            control.reset("api", "u").await.unwrap();
            assert_eq!(
                control.peek("api", "u").await.unwrap().remaining(),
                5,
                "{what}"
            );
            assert_eq!(hit(&c, &url, "u").await.0, 200, "{what}: reset");

            control
                .block("api", "u", Duration::from_secs(30))
                .await
                .unwrap();
            let d = control.peek("api", "u").await.unwrap();
            assert!(d.retry_after().unwrap() > Duration::from_secs(29), "{what}");
            let res = c.get(&url).header("x-user", "u").send().await.unwrap();
            assert_eq!(res.status(), 429, "{what}");
            control.unblock("api", "u").await.unwrap();
            let res = c.get(&url).header("x-user", "u").send().await.unwrap();
            assert_eq!(res.status(), 200, "{what}: unblocked");
        }
    }

    /// Denies on one gateway lock the key on every gateway: the lock is a
    /// key of its own in Redis.
    #[tokio::test]
    async fn a_lockout_in_redis_holds_on_every_gateway() {
        let server = RedisServer::start();
        let mut urls = Vec::new();
        let mut controls = Vec::new();
        for _ in 0..2 {
            let layer = RateLimitLayer::builder()
                .rule(global(
                    login(Quota::per_minute(2)),
                    server.backend("lockout").await,
                ))
                .build()
                .unwrap();
            controls.push(layer.control());
            urls.push(serve(app(layer)).await);
        }
        let c = client();
        let (a, b) = (&urls[0], &urls[1]);
        assert_eq!(hit(&c, a, "mallory").await.0, 200);
        assert_eq!(hit(&c, b, "mallory").await.0, 200);
        assert_eq!(hit(&c, a, "mallory").await.0, 429);
        assert_eq!(hit(&c, b, "mallory").await.0, 429);
        assert_eq!(
            hit(&c, a, "mallory").await,
            (429, Some(900)),
            "the third deny locks"
        );
        let (status, retry) = hit(&c, b, "mallory").await;
        assert_eq!(status, 429);
        assert!(
            (899..=900).contains(&retry.unwrap()),
            "the other gateway sees the lock"
        );
        let calls = server.script_calls();
        for url in [a, b] {
            assert_eq!(hit(&c, url, "mallory").await.0, 429);
        }
        assert_eq!(server.script_calls(), calls, "locked: no Redis call");
        let locks = server.keys("lockout:*:lock");
        assert_eq!(locks.len(), 1, "one lock key in Redis");
        // Reset through either handle clears it in Redis.
        controls[1].reset("login", "mallory").await.unwrap();
        assert!(server.keys("lockout:*:lock").is_empty());
        let d = controls[0].peek("login", "mallory").await.unwrap();
        assert_eq!(d.remaining(), 2);
    }

    #[tokio::test]
    async fn a_redis_failure_is_a_typed_error() {
        let mut server = RedisServer::start();
        let layer = RateLimitLayer::builder()
            .rule(global(
                Rule::new("api", KeyExtractor::global(), Quota::per_second(5)),
                server.backend("down").await,
            ))
            .build()
            .unwrap();
        let control = layer.control();
        server.kill();
        let err = control.peek("api", "k").await.unwrap_err();
        assert!(
            matches!(err, ControlError::Redis(_) | ControlError::Timeout(_)),
            "{err:?}"
        );
    }
}
