//! Lockouts, the control handle, refunds and response accounting
//! (`count_if`, `cost_from_response`), over HTTP, on local rules and on
//! every Redis algorithm (a private `redis-server`).

use std::time::Duration;

#[cfg(feature = "redis")]
use crate::support::Backend as _;
use crate::support::{client, header, serve};
use axum::{Extension, Router, routing::get};
use keyed_rate_limit::rate_limit::ControlError;
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, decision::RateLimitDecision};

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
    #[cfg(feature = "metrics")]
    crate::support::metrics::snapshotter();
    let (events, _guard) = crate::support::events::capture();
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
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
    let warned = crate::support::events::with_message(&events, "key locked out");
    assert_eq!(warned.len(), 1, "one warning, when the lock starts");
    assert_eq!(warned[0]["block_ms"], "900000");
    assert!(!warned[0]["key"].contains("mallory"), "a fingerprint");
    #[cfg(feature = "metrics")]
    assert!(crate::support::metrics::counter("rate_limit_decisions_total", "login", "locked") >= 2);
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

#[test]
fn settings_that_cannot_hold_are_build_errors() {
    use keyed_rate_limit::rule::OnDeny;
    let waits = login(Quota::per_minute(2)).on_deny(OnDeny::Wait {
        max: Duration::from_secs(1),
        queue: 10,
    });
    let err = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(waits)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("OnDeny::Wait"), "{err}");
    let free = Rule::new("free", KeyExtractor::everyone(), Quota::per_minute(2))
        .cost(0)
        .count_if(|_| true);
    let err = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(free)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("reservation"), "{err}");
    let never = Lockout::new(0, Duration::from_secs(1), Duration::from_secs(1));
    let err = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new("l", KeyExtractor::everyone(), Quota::per_minute(2)).lockout(never))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("lockout"), "{err}");
}

/// A client that goes away once the handler runs keeps its reservation:
/// hanging up must not start work for free.
#[tokio::test]
async fn a_request_dropped_in_the_handler_keeps_its_reservation() {
    use std::sync::Arc;
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(Rule::new("login", KeyExtractor::everyone(), Quota::per_hour(3)).count_if(|_| true))
        .build()
        .unwrap();
    let control = layer.control();
    let entered = Arc::new(tokio::sync::Notify::new());
    let e = entered.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let e = e.clone();
                async move {
                    e.notify_one();
                    std::future::pending::<()>().await;
                }
            }),
        )
        .layer(layer);
    let url = serve(app).await;
    let pending = tokio::spawn(async move { client().get(url).send().await });
    entered.notified().await;
    assert_eq!(
        control.peek("login", "*").await.unwrap().remaining(),
        2,
        "reserved"
    );
    pending.abort();
    // The connection closes and the server drops the request's future.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        control.peek("login", "*").await.unwrap().remaining(),
        2,
        "kept"
    );
}

#[tokio::test]
async fn the_handle_moves_a_local_bucket_within_empty_and_whole() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
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
    use crate::support::ALGORITHMS;
    use keyed_rate_limit::Algorithm;
    use keyed_rate_limit_testing::RedisServer;

    /// Every algorithm with `quota`, then a fixed window with a calendar
    /// quota of the same limit; each with a name for messages and prefixes.
    fn every_algorithm(quota: Quota) -> Vec<(Algorithm, Quota, String)> {
        let mut cases: Vec<(Algorithm, Quota)> = ALGORITHMS.iter().map(|a| (*a, quota)).collect();
        cases.push((Algorithm::FixedWindow, Quota::per_day(quota.limit())));
        cases
            .into_iter()
            .map(|(a, q)| (a, q, format!("{a:?}-{q}").replace(' ', "-")))
            .collect()
    }

    fn global(rule: Rule, redis: keyed_rate_limit::RedisBackend) -> Rule {
        rule.global(redis).redis_timeout(Duration::from_millis(500))
    }

    /// Every algorithm and a calendar quota: read, charge, give back,
    /// reset, block and unblock, as the layer then decides.
    #[tokio::test]
    async fn the_handle_works_on_every_redis_algorithm() {
        let server = RedisServer::start();
        for (algorithm, quota, what) in every_algorithm(Quota::per_minute(5)) {
            let rule = Rule::new("api", KeyExtractor::header("x-user"), quota).algorithm(algorithm);
            let layer = RateLimitLayer::builder()
                .decision_extension(true)
                .rule(global(rule, server.backend(&what).await))
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
                .decision_extension(true)
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
        let (calls, since) = (server.script_calls(), std::time::Instant::now());
        for url in [a, b] {
            let (status, retry) = hit(&c, url, "mallory").await;
            assert_eq!(status, 429);
            assert!(retry.unwrap() >= 898, "the lock's true time left");
        }
        // Within a second of learning it, a gateway answers from its copy.
        if since.elapsed() < Duration::from_millis(800) {
            assert_eq!(server.script_calls(), calls, "locked: no Redis call");
        }
        let locks = server.keys("lockout:*:lock");
        assert_eq!(locks.len(), 1, "one lock key in Redis");
        // Reset through either handle clears it in Redis; the other gateway
        // drops its copy of the lock within a second.
        controls[1].reset("login", "mallory").await.unwrap();
        assert!(server.keys("lockout:*:lock").is_empty());
        let d = controls[0].peek("login", "mallory").await.unwrap();
        assert_eq!(d.remaining(), 2);
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(hit(&c, a, "mallory").await.0, 200, "gateway a let go");
        // A block set through one gateway's handle is enforced by the
        // script on the other.
        controls[0]
            .block("login", "eve", Duration::from_secs(30))
            .await
            .unwrap();
        let (status, retry) = hit(&c, b, "eve").await;
        assert_eq!(status, 429);
        assert!((29..=30).contains(&retry.unwrap()), "lock.lua's time left");
    }

    /// Polls `peek` until `want` units are left: refunds and charges in
    /// Redis go out after the response.
    async fn until_left(
        control: &keyed_rate_limit::rate_limit::Control,
        rule: &str,
        key: &str,
        want: u32,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let left = control
                .peek(rule, key.to_owned())
                .await
                .unwrap()
                .remaining();
            if left == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{rule}/{key}: {left} left, want {want}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every algorithm and a calendar quota: a later rule's deny gives the
    /// unit back in Redis, and `count_if` gives back a request that does
    /// not count.
    #[tokio::test]
    async fn refunds_and_count_if_settle_in_redis_on_every_algorithm() {
        let server = RedisServer::start();
        for (algorithm, quota, what) in every_algorithm(Quota::per_hour(5)) {
            let redis = server.backend(&what).await;
            let layer = RateLimitLayer::builder()
                .decision_extension(true)
                .rule(
                    global(
                        Rule::new("login", KeyExtractor::header("x-user"), quota),
                        redis.clone(),
                    )
                    .algorithm(algorithm)
                    .count_if(|res| res.status == http::StatusCode::UNAUTHORIZED),
                )
                .rule(Rule::new(
                    "everyone",
                    KeyExtractor::everyone(),
                    Quota::per_hour(3),
                ))
                .build()
                .unwrap();
            let control = layer.control();
            let url = serve(accounting_app(layer)).await;
            let c = client();
            assert_eq!(login_as(&c, &url, "wrong").await, 401, "{what}");
            until_left(&control, "login", "alice", 4).await;
            assert_eq!(login_as(&c, &url, "right").await, 200, "{what}");
            until_left(&control, "login", "alice", 4).await;
            assert_eq!(login_as(&c, &url, "wrong").await, 401, "{what}");
            until_left(&control, "login", "alice", 3).await;
            // `everyone` is spent: its deny gives `login`'s unit back.
            assert_eq!(login_as(&c, &url, "wrong").await, 429, "{what}");
            until_left(&control, "login", "alice", 3).await;
        }
    }

    /// `cost_from_response` on every algorithm and a calendar quota.
    #[tokio::test]
    async fn cost_from_response_settles_in_redis_on_every_algorithm() {
        let server = RedisServer::start();
        for (algorithm, quota, what) in every_algorithm(Quota::per_hour(100)) {
            let rule = Rule::new("tokens", KeyExtractor::header("x-user"), quota)
                .algorithm(algorithm)
                .cost_from_response(tokens_used);
            let layer = RateLimitLayer::builder()
                .decision_extension(true)
                .rule(global(rule, server.backend(&what).await))
                .build()
                .unwrap();
            let control = layer.control();
            let url = serve(accounting_app(layer)).await;
            let c = client();
            let spend = |n| spend_tokens(&c, &url, n);
            assert_eq!(spend("40").await.unwrap().status(), 200, "{what}");
            until_left(&control, "tokens", "u", 60).await;
            assert_eq!(spend("0").await.unwrap().status(), 200, "{what}");
            until_left(&control, "tokens", "u", 60).await;
            assert_eq!(spend("1000").await.unwrap().status(), 200, "{what}");
            until_left(&control, "tokens", "u", 0).await;
            assert_eq!(spend("1").await.unwrap().status(), 429, "{what}: saturated");
        }
    }

    /// Redis dies while the handler runs: the response is out whole, and
    /// the refund that could not reach Redis is logged and counted.
    #[cfg(feature = "metrics")]
    #[tokio::test]
    async fn a_redis_failure_while_settling_never_fails_the_response() {
        use std::sync::Arc;
        crate::support::metrics::snapshotter();
        let mut server = RedisServer::start();
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(global(
                Rule::new("settle-down", KeyExtractor::everyone(), Quota::per_hour(5))
                    .count_if(|_| false),
                server.backend("settle").await,
            ))
            .build()
            .unwrap();
        let release = Arc::new(tokio::sync::Notify::new());
        let entered = Arc::new(tokio::sync::Notify::new());
        let (r, e) = (release.clone(), entered.clone());
        let app = Router::new()
            .route(
                "/",
                get(move || {
                    let (r, e) = (r.clone(), e.clone());
                    async move {
                        e.notify_one();
                        r.notified().await;
                        "answered"
                    }
                }),
            )
            .layer(layer);
        let url = serve(app).await;
        let pending = tokio::spawn(async move { client().get(url).send().await.unwrap() });
        entered.notified().await;
        server.kill();
        release.notify_one();
        let res = pending.await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.text().await.unwrap(), "answered");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while crate::support::metrics::counter(
            "rate_limit_decisions_total",
            "settle-down",
            "settle_failed",
        ) == 0
        {
            assert!(tokio::time::Instant::now() < deadline, "never counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A lock learned from Redis holds to its end while Redis cannot
    /// answer: the failure mode does not unlock a locked-out key.
    #[tokio::test]
    async fn a_learned_lock_holds_while_redis_is_stopped() {
        let server = RedisServer::start();
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(
                login(Quota::per_minute(2))
                    .global(server.backend("held").await)
                    .redis_timeout(Duration::from_millis(50)),
            )
            .instances(1)
            .build()
            .unwrap();
        let url = serve(app(layer)).await;
        let c = client();
        for _ in 0..4 {
            hit(&c, &url, "mallory").await;
        }
        assert_eq!(hit(&c, &url, "mallory").await, (429, Some(900)), "locked");
        server.pause();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        for _ in 0..3 {
            let (status, retry) = hit(&c, &url, "mallory").await;
            assert_eq!(status, 429, "the local fallback would admit it");
            assert!(retry.unwrap() >= 897, "{retry:?}");
        }
        assert_eq!(hit(&c, &url, "alice").await.0, 200, "others fall back");
        server.resume();
    }

    #[tokio::test]
    async fn a_redis_failure_is_a_typed_error() {
        let mut server = RedisServer::start();
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(global(
                Rule::new("api", KeyExtractor::everyone(), Quota::per_second(5)),
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

/// `POST /login` answers 401 unless `x-pass` is `right`; `/tokens` reports
/// the tokens its answer cost in `x-tokens-used`.
/// One request of [`accounting_app`]'s `/tokens` for user `u` that
/// reports `n` tokens used.
fn spend_tokens(
    c: &reqwest::Client,
    url: &str,
    n: &str,
) -> impl Future<Output = reqwest::Result<reqwest::Response>> {
    c.get(format!("{url}/tokens"))
        .header("x-user", "u")
        .header("x-spend", n)
        .send()
}

fn accounting_app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/login",
            get(|headers: http::HeaderMap| async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                if headers.get("x-pass").is_some_and(|p| p == "right") {
                    http::StatusCode::OK
                } else {
                    http::StatusCode::UNAUTHORIZED
                }
            }),
        )
        .route(
            "/tokens",
            get(|headers: http::HeaderMap| async move {
                let used = headers
                    .get("x-spend")
                    .map_or("1".to_owned(), |v| v.to_str().unwrap().to_owned());
                ([("x-tokens-used", used)], "done")
            }),
        )
        .layer(layer)
}

/// What `/tokens` reports it cost, 1 without the header.
fn tokens_used(res: &http::response::Parts) -> u32 {
    res.headers
        .get("x-tokens-used")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

async fn login_as(c: &reqwest::Client, url: &str, pass: &str) -> u16 {
    let res = c
        .get(format!("{url}/login"))
        .header("x-user", "alice")
        .header("x-pass", pass)
        .send()
        .await
        .unwrap();
    res.status().as_u16()
}

#[tokio::test]
async fn count_if_counts_failed_logins_only_and_a_burst_cannot_overshoot() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("login", KeyExtractor::header("x-user"), Quota::per_hour(3))
                .count_if(|res| res.status == http::StatusCode::UNAUTHORIZED),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(accounting_app(layer)).await;
    let c = client();
    for _ in 0..5 {
        assert_eq!(login_as(&c, &url, "right").await, 200);
    }
    assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 3);
    // Ten wrong passwords at once: each reserves its unit before the
    // handler answers, so three get through to fail and seven are refused.
    let attempts: Vec<_> = (0..10)
        .map(|_| {
            let (c, url) = (c.clone(), url.clone());
            tokio::spawn(async move { login_as(&c, &url, "wrong").await })
        })
        .collect();
    let mut statuses = Vec::new();
    for a in attempts {
        statuses.push(a.await.unwrap());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [401, 401, 401, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(login_as(&c, &url, "right").await, 429, "spent on failures");
}

#[tokio::test]
async fn cost_from_response_charges_what_the_handler_reports() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new(
                "tokens",
                KeyExtractor::header("x-user"),
                Quota::per_hour(100),
            )
            .cost_from_response(tokens_used),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(accounting_app(layer)).await;
    let c = client();
    let spend = |n| spend_tokens(&c, &url, n);
    let res = spend("40").await.unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.text().await.unwrap(), "done", "the body is untouched");
    assert_eq!(control.peek("tokens", "u").await.unwrap().remaining(), 60);
    assert_eq!(spend("0").await.unwrap().status(), 200);
    assert_eq!(
        control.peek("tokens", "u").await.unwrap().remaining(),
        60,
        "a reported 0 gives the reservation back"
    );
    // Past the bucket: saturated, the next request waits.
    assert_eq!(spend("1000").await.unwrap().status(), 200);
    assert!(!control.peek("tokens", "u").await.unwrap().is_allowed());
    assert_eq!(spend("1").await.unwrap().status(), 429);
}

#[tokio::test]
async fn a_panicking_closure_keeps_the_reservation_and_the_layer_works() {
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("login", KeyExtractor::header("x-user"), Quota::per_hour(3)).count_if(
                |res| {
                    assert!(res.status != http::StatusCode::OK, "boom");
                    true
                },
            ),
        )
        .build()
        .unwrap();
    let control = layer.control();
    let url = serve(accounting_app(layer)).await;
    let c = client();
    assert_eq!(
        login_as(&c, &url, "right").await,
        200,
        "the response is out"
    );
    assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 2);
    assert_eq!(login_as(&c, &url, "wrong").await, 401);
    assert_eq!(control.peek("login", "alice").await.unwrap().remaining(), 1);
}

#[tokio::test]
async fn a_later_deny_gives_back_what_earlier_rules_spent() {
    for refunds in [true, false] {
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(Rule::new(
                "per-user",
                KeyExtractor::header("x-user"),
                Quota::per_hour(10),
            ))
            .rule(Rule::new(
                "everyone",
                KeyExtractor::everyone(),
                Quota::per_hour(1),
            ))
            .refunds(refunds)
            .build()
            .unwrap();
        let control = layer.control();
        let url = serve(app(layer)).await;
        let c = client();
        assert_eq!(hit(&c, &url, "u").await.0, 200);
        for _ in 0..3 {
            assert_eq!(hit(&c, &url, "u").await.0, 429);
        }
        let left = control.peek("per-user", "u").await.unwrap().remaining();
        assert_eq!(left, if refunds { 9 } else { 6 }, "refunds: {refunds}");
    }
}

#[path = "../../examples/admin.rs"]
#[allow(dead_code)]
mod admin;

/// The login recipe and the admin API of `examples/admin.rs`, served.
#[tokio::test]
async fn the_admin_example_locks_out_forgives_and_answers_operators() {
    let url = serve(admin::app().unwrap()).await;
    let c = client();
    let login = |user: &'static str, pass: &'static str| {
        c.get(format!("{url}/login"))
            .header("x-user", user)
            .header("x-pass", pass)
            .send()
    };
    let admin = |method: reqwest::Method, path: &str, token: &str| {
        c.request(method, format!("{url}/admin/limits/{path}"))
            .header("x-admin-token", token)
            .send()
    };
    for _ in 0..3 {
        assert_eq!(login("alice", "wrong").await.unwrap().status(), 401);
    }
    let peek = admin(reqwest::Method::GET, "login/alice", admin::ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(peek.status(), 200);
    let body: serde_json::Value = peek.json().await.unwrap();
    assert_eq!(body["remaining"], 2);
    // A successful login forgives the failures.
    assert_eq!(login("alice", "secret").await.unwrap().status(), 200);
    let body: serde_json::Value = admin(reqwest::Method::GET, "login/alice", admin::ADMIN_TOKEN)
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["remaining"], admin::FAILURES);
    // Brute force: five failures spend the quota, five refusals lock.
    for _ in 0..admin::FAILURES {
        assert_eq!(login("bob", "guess").await.unwrap().status(), 401);
    }
    for _ in 0..5 {
        assert_eq!(login("bob", "guess").await.unwrap().status(), 429);
    }
    let res = login("bob", "guess").await.unwrap();
    assert_eq!(res.status(), 429);
    let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
    assert!(retry > 800 && retry <= admin::LOCKOUT.as_secs(), "{retry}");
    // The operator lifts it.
    let res = admin(reqwest::Method::POST, "login/bob/reset", admin::ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(login("bob", "guess").await.unwrap().status(), 401);
    // Without the token, or for an unknown rule.
    let res = admin(reqwest::Method::POST, "login/bob/reset", "nope")
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let res = admin(reqwest::Method::GET, "nope/bob", admin::ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    let res = admin(
        reqwest::Method::POST,
        "login/carol/block?secs=60",
        admin::ADMIN_TOKEN,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(login("carol", "secret").await.unwrap().status(), 429);
}
