//! Lockouts, the control handle, refunds and response accounting on
//! every Redis algorithm (a private `redis-server`), over HTTP.

use std::time::Duration;

use crate::support::ALGORITHMS;
use crate::support::Backend as _;
use crate::support::accounting::{accounting_app, hit, login, login_as, spend_tokens, tokens_used};
use crate::support::source_app as app;
use crate::support::{client, serve};
use axum::{Router, routing::get};
use keyed_rate_limit::Algorithm;
use keyed_rate_limit::rate_limit::ControlError;

use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

/// Every algorithm with `quota`, then a fixed window with a calendar day
/// and an aligned week (envoyproxy/ratelimit's) of the same limit; each
/// with a name for messages and prefixes.
fn every_algorithm(quota: Quota) -> Vec<(Algorithm, Quota, String)> {
    let mut cases: Vec<(Algorithm, Quota)> = ALGORITHMS.iter().map(|a| (*a, quota)).collect();
    let week = Duration::from_secs(7 * 86_400);
    cases.push((
        Algorithm::FixedWindow,
        Quota::per_calendar_day(quota.limit()),
    ));
    cases.push((Algorithm::FixedWindow, Quota::aligned(quota.limit(), week)));
    cases
        .into_iter()
        .map(|(a, q)| (a, q, format!("{a:?}-{q}").replace(' ', "-")))
        .collect()
}

fn global(rule: Rule, redis: keyed_rate_limit::RedisBackend) -> Rule {
    rule.global(redis).redis_timeout(Duration::from_millis(500))
}

/// Every algorithm and the calendar quotas: read, charge, give back,
/// reset, block and unblock, as the layer then decides.
#[tokio::test]
async fn the_handle_works_on_every_redis_algorithm() {
    let server = RedisServer::start();
    for (algorithm, quota, what) in every_algorithm(Quota::per_minute(5)) {
        let rule = Rule::new("api", KeyExtractor::header("x-user"), quota)
            .algorithm(algorithm)
            .blockable(true);
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

/// A rule that cannot be locked reads no lock key: a lock another writer
/// left in Redis binds the blockable rule and not the other, and blocking
/// the other is an error rather than a block that would not hold.
#[tokio::test]
async fn only_a_blockable_rule_reads_locks() {
    let server = RedisServer::start();
    let redis = server.backend("locks").await;
    let rule = |name: &str, blockable| {
        let r = Rule::new(name, KeyExtractor::header("x-user"), Quota::per_minute(5))
            .blockable(blockable);
        global(r, redis.clone())
    };
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule("plain", false))
        .build()
        .unwrap();
    let blockable = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(rule("guarded", true))
        .build()
        .unwrap();
    let (plain_control, guarded_control) = (layer.control(), blockable.control());
    let err = plain_control
        .block("plain", "u", Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(matches!(err, ControlError::NotBlockable(ref r) if r == "plain"));
    // The lock keys, as the layout names them (`prefix:{len:rule:key}:lock`).
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for lock in ["locks:{5:plain:u}:lock", "locks:{7:guarded:u}:lock"] {
        let () = redis::cmd("SET")
            .arg(lock)
            .arg(1)
            .arg("PX")
            .arg(30_000)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let (plain, guarded) = (serve(app(layer)).await, serve(app(blockable)).await);
    let c = client();
    assert_eq!(hit(&c, &plain, "u").await.0, 200, "no lock read");
    let (status, retry) = hit(&c, &guarded, "u").await;
    assert_eq!(status, 429, "the lock binds a blockable rule");
    assert!((29..=30).contains(&retry.unwrap()));
    guarded_control.unblock("guarded", "u").await.unwrap();
    assert_eq!(hit(&c, &guarded, "u").await.0, 200);
}

/// The fixed window counts first and compares after: a one-unit deny
/// leaves its increment (read as the limit), a larger deny gives its units
/// back, and a refund after denies is exact.
#[tokio::test]
async fn the_fixed_windows_denies_leave_no_debt() {
    let server = RedisServer::start();
    let redis = server.backend("fw").await;
    let q = Quota::per_minute(5);
    let key = keyed_rate_limit::Key::from("u");
    let check = async |cost| {
        redis
            .check("api", &key, Algorithm::FixedWindow, &q, cost)
            .await
            .unwrap()
    };
    for _ in 0..3 {
        assert!(check(1).await.is_allowed());
    }
    assert!(!check(3).await.is_allowed(), "3 + 3 > 5");
    let d = check(2).await;
    assert!(d.is_allowed(), "the larger deny gave its units back");
    assert_eq!(d.remaining(), 0);
    for _ in 0..3 {
        assert!(!check(1).await.is_allowed());
    }
    let layer = RateLimitLayer::builder()
        .rule(global(
            Rule::new("api", KeyExtractor::header("x-user"), q).algorithm(Algorithm::FixedWindow),
            redis.clone(),
        ))
        .build()
        .unwrap();
    let control = layer.control();
    assert_eq!(control.peek("api", "u").await.unwrap().remaining(), 0);
    let d = control.reward("api", "u", 2).await.unwrap();
    assert_eq!(d.remaining(), 2, "the denies' residue reads as the limit");
    assert!(check(1).await.is_allowed());
    assert_eq!(check(1).await.remaining(), 0);
    assert!(!check(1).await.is_allowed());
}
