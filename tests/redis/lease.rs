//! Leased quota (`Rule::lease`) on a private `redis-server`: four gateways
//! (layers with their own connections) under random arrivals never admit
//! more than the exact algorithm promises; a lease outlives a Redis
//! restart and is given back when its layer is dropped.

use std::convert::Infallible;
use std::time::Duration;

use crate::support::Backend as _;
use crate::support::admits::{Admit, check, time_us};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::rule::LeasePolicy;
use keyed_rate_limit::{
    Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule,
    decision::{RateLimitDecision, Source},
    failure::FailureMode,
};
use keyed_rate_limit_testing::RedisServer;
use tower::{ServiceExt, service_fn};

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

fn leased(
    redis: RedisBackend,
    algorithm: Algorithm,
    q: Quota,
    ttl: Duration,
    mode: FailureMode,
) -> RateLimitLayer {
    RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("r", KeyExtractor::header("x-key"), q)
                .global(redis)
                .algorithm(algorithm)
                .lease(LeasePolicy::new(ttl))
                .on_redis_failure(mode),
        )
        .build()
        .unwrap()
}

/// One request through `layer`: whether it passed, and its rule's source.
async fn call(layer: &RateLimitLayer) -> (bool, Option<Source>) {
    let svc = layer.layer(service_fn(|req: Request<Full<Bytes>>| async move {
        let source = req
            .extensions()
            .get::<RateLimitDecision>()
            .and_then(|d| d.rules().first().map(|r| r.source));
        let mut res = Response::new(Full::<Bytes>::default());
        res.extensions_mut().insert(source);
        Ok::<_, Infallible>(res)
    }));
    let req = Request::get("/")
        .header("x-key", "k")
        .body(Full::default())
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    // A refusal never reaches the service: no source.
    let source = res.extensions().get::<Option<Source>>().copied().flatten();
    (res.status().is_success(), source)
}

/// A small deterministic generator: the arrivals of one seed repeat.
fn gaps(seed: u64, n: usize) -> Vec<u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Bursts and pauses: leases taken while the bucket fills are
            // spent late, beside the others' refills.
            if x.is_multiple_of(8) {
                30 + x % 40
            } else {
                x % 3
            }
        })
        .collect()
}

/// One gateway's arrivals: admissions bracketed by Redis time.
async fn arrivals(
    server: &RedisServer,
    layer: RateLimitLayer,
    prefix: &str,
    gaps: Vec<u64>,
) -> Vec<Admit> {
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut out = Vec::new();
    for gap in gaps {
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let lo = time_us(&mut c).await;
        let (allowed, _) = call(&layer).await;
        let hi = time_us(&mut c).await;
        if !allowed {
            continue;
        }
        // A fixed window starts at its first unit: its end is the key's expiry.
        // The state key names the quota Redis counts the leases in.
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}:{{1:r:k}}:fw:*"))
            .query_async(&mut c)
            .await
            .unwrap();
        let pttl: i64 = match keys.first() {
            Some(k) => redis::cmd("PTTL").arg(k).query_async(&mut c).await.unwrap(),
            None => -2,
        };
        // Under load the window may end between the admission and this
        // read: that admission's window is then unknown, and `check` leaves
        // it out (it can only hide an excess, never invent one).
        let window_end = (pttl > 0).then_some(hi + pttl as f64 * 1000.0);
        out.push(Admit {
            lo,
            hi,
            cost: 1,
            window_end,
        });
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_leasing_gateways_never_admit_more_than_the_exact_rule() {
    let server = RedisServer::start();
    // 100 units/s with a burst of 20; a 100 ms lease holds back 10 of the
    // burst. Four gateways offer far more, at random.
    let q = Quota::new(20, Duration::from_millis(200));
    let ttl = Duration::from_millis(100);
    for seed in 1..=3u64 {
        let runs = ALL.map(|algorithm| {
            let server = &server;
            async move {
                let prefix = format!("lease{seed}-{algorithm}");
                let mut gateways = Vec::new();
                for g in 0..4 {
                    let layer = leased(
                        server.backend(&prefix).await,
                        algorithm,
                        q,
                        ttl,
                        FailureMode::FailClosed,
                    );
                    let gaps = gaps(seed * 10 + g, 60);
                    gateways.push(arrivals(server, layer, &prefix, gaps));
                }
                let admits: Vec<Admit> = futures_util::future::join_all(gateways)
                    .await
                    .into_iter()
                    .flatten()
                    .collect();
                (algorithm, admits)
            }
        });
        for (algorithm, admits) in futures_util::future::join_all(runs).await {
            assert!(
                admits.len() >= 10,
                "seed {seed}, {algorithm}: only {} admitted",
                admits.len()
            );
            if let Err(e) = check(algorithm, q, &admits) {
                panic!("seed {seed}, {algorithm} leased: {e}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_outlives_a_redis_restart_then_the_failure_mode_decides() {
    let mut server = RedisServer::start();
    let redis = RedisBackend::builder(server.url())
        .prefix("restart")
        .build()
        .await
        .unwrap();
    // 100/s with a burst of 100: a 500 ms lease holds back 50.
    let layer = leased(
        redis,
        Algorithm::Gcra,
        Quota::per_second(100),
        Duration::from_millis(500),
        FailureMode::FailOpen,
    );
    let mut sources = Vec::new();
    for _ in 0..20 {
        sources.push(call(&layer).await);
    }
    assert!(
        sources
            .iter()
            .all(|(a, s)| *a && *s == Some(Source::Leased))
    );
    let calls = server.script_calls();
    assert!(calls < 10, "20 requests took {calls} script calls");

    server.kill();
    let mut after = Vec::new();
    for _ in 0..60 {
        after.push(call(&layer).await);
    }
    let leased = after
        .iter()
        .take_while(|(a, s)| *a && *s == Some(Source::Leased))
        .count();
    assert!(leased >= 1, "the lease answered while Redis was down");
    assert!(
        after[leased..]
            .iter()
            .all(|(a, s)| *a && *s == Some(Source::FailOpen)),
        "then the failure mode, never the lease again: {after:?}"
    );
    assert!(leased < 60, "the lease ran out");

    server.restart();
    let mut back = false;
    for _ in 0..100 {
        if call(&layer).await == (true, Some(Source::Leased)) {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back, "leases resume once Redis is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_layer_gives_its_leases_back() {
    let server = RedisServer::start();
    // 10/s with a burst of 600: a 5 s lease holds back 50.
    let q = Quota::per_minute(600);
    let ttl = Duration::from_secs(5);
    let lease = |redis| leased(redis, Algorithm::Gcra, q, ttl, FailureMode::FailClosed);
    let a = lease(server.backend("drop").await);
    let b = lease(server.backend("drop").await);
    // Leases of 1, 8, 64, then the rest: each grows with the rate.
    for _ in 0..80 {
        assert!(call(&a).await.0);
    }
    let free = |layer: RateLimitLayer| async move {
        let d = layer.control().peek("r", "k").await.unwrap();
        d.remaining()
    };
    let before = free(b.clone()).await;
    assert!(before < 100, "a holds most of the bucket: {before} free");
    drop(a);
    let mut after = before;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = free(b.clone()).await;
        if after > before {
            break;
        }
    }
    // All but the eighty spent, in a bucket of 550.
    assert!(
        after >= 450,
        "given back: {before} free before, {after} after"
    );
}

/// The case the held-back burst exists for: a gateway leases a whole
/// bucket and spends it a lease later, just as another spends the units
/// that flowed in meanwhile. Without the hold-back this admits nearly two
/// bursts within a few milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_spent_late_beside_fresh_units_stays_within_the_bound() {
    let server = RedisServer::start();
    // 100 units/s with a burst of 40: a 100 ms lease holds back 10.
    let q = Quota::per_second(100).with_burst(40);
    let ttl = Duration::from_millis(100);
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let prefix = format!("late-{algorithm}");
        let lease = |redis| leased(redis, algorithm, q, ttl, FailureMode::FailClosed);
        let a = lease(server.backend(&prefix).await);
        let b = lease(server.backend(&prefix).await);
        let client = redis::Client::open(server.url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let mut admits = Vec::new();
        let burst = |layer: RateLimitLayer, n: usize| {
            let mut c = c.clone();
            async move {
                let mut out = Vec::new();
                for _ in 0..n {
                    let lo = time_us(&mut c).await;
                    let (allowed, _) = call(&layer).await;
                    let hi = time_us(&mut c).await;
                    if allowed {
                        out.push(Admit {
                            lo,
                            hi,
                            cost: 1,
                            window_end: None,
                        });
                    }
                }
                out
            }
        };
        // a learns a high rate, then waits for a full bucket.
        admits.extend(burst(a.clone(), 60).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
        // One request: a leases what its rate asks for, the bucket at most.
        admits.extend(burst(a.clone(), 1).await);
        tokio::time::sleep(ttl * 8 / 10).await;
        // b spends what flowed in; a spends its lease before it ends.
        let (from_b, from_a) = tokio::join!(burst(b.clone(), 40), burst(a.clone(), 40));
        admits.extend(from_b);
        admits.extend(from_a);
        assert!(admits.len() >= 40, "{algorithm}: {} admitted", admits.len());
        if let Err(e) = check(algorithm, q, &admits) {
            panic!("{algorithm} leased: {e}");
        }
        let _ = time_us(&mut c).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_lease_gives_back_in_the_next_grant() {
    let server = RedisServer::start();
    // 10/s with a burst of 600: a 200 ms lease holds back 2.
    let q = Quota::per_minute(600);
    let ttl = Duration::from_millis(200);
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let prefix = format!("back-{algorithm}");
        let lease = |redis| leased(redis, algorithm, q, ttl, FailureMode::FailClosed);
        let a = lease(server.backend(&prefix).await);
        let b = lease(server.backend(&prefix).await);
        for _ in 0..80 {
            assert!(call(&a).await.0);
        }
        let free = || async { b.control().peek("r", "k").await.unwrap().remaining() };
        let before = free().await;
        assert!(
            before < 100,
            "{algorithm}: a holds most of the bucket: {before} free"
        );
        tokio::time::sleep(ttl).await;
        // The lease has ended: this request's grant gives the rest back.
        let calls = server.script_calls();
        assert!(call(&a).await.0);
        assert_eq!(server.script_calls() - calls, 1, "{algorithm}: one call");
        let after = free().await;
        assert!(
            after >= 500,
            "{algorithm}: {before} free before, {after} after"
        );
    }
}

#[tokio::test]
async fn lease_settings_are_checked_at_build() {
    let server = RedisServer::start();
    let redis = server.backend("checks").await;
    let ttl = Duration::from_millis(100);
    let build = |rule: Rule| {
        RateLimitLayer::builder()
            .decision_extension(true)
            .rule(rule)
            .build()
            .err()
    };
    let rule = || Rule::new("r", KeyExtractor::header("x-key"), Quota::per_second(100));
    let cases = [
        (
            rule().lease(LeasePolicy::new(ttl)),
            "a lease needs a global rule",
        ),
        (
            rule()
                .global(redis.clone())
                .lease(LeasePolicy::new(ttl))
                .lockout(keyed_rate_limit::rule::Lockout::new(3, ttl, ttl)),
            "a lease and a lockout",
        ),
        (
            rule()
                .global(redis.clone())
                .lease(LeasePolicy::new(Duration::from_secs(1))),
            "cannot be leased",
        ),
        (
            rule()
                .global(redis.clone())
                .lease(LeasePolicy::new(ttl))
                .cost(95),
            "above what Redis counts leases in",
        ),
        (
            rule()
                .global(redis.clone())
                .lease(LeasePolicy::new(ttl).with_max_units(0)),
            "max_units of at least 1",
        ),
    ];
    for (rule, want) in cases {
        let err = build(rule).expect(want).to_string();
        assert!(err.contains(want), "{want:?} in {err}");
    }
    assert!(build(rule().global(redis).lease(LeasePolicy::new(ttl))).is_none());
}

/// A lease's unspent units go back only while the bucket has not refilled
/// them itself: given back after a pause, they would free the same units
/// twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_the_bucket_refilled_meanwhile_are_not_given_back() {
    let server = RedisServer::start();
    // 100/s with a burst of 100: a 100 ms lease holds back 10.
    let (q, ttl) = (Quota::per_second(100), Duration::from_millis(100));
    let lease = |redis| leased(redis, Algorithm::Gcra, q, ttl, FailureMode::FailClosed);
    let a = lease(server.backend("refilled").await);
    let b = lease(server.backend("refilled").await);
    // a leases 1, 8, then most of the bucket, and spends ten.
    for _ in 0..10 {
        assert!(call(&a).await.0);
    }
    // The bucket refills whole; b takes all of it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut taken = 0;
    while call(&b).await.0 {
        taken += 1;
        assert!(taken <= 200, "b never runs dry");
    }
    // a's next grant must not hand back what the refill already restored.
    call(&a).await;
    let free = b.control().peek("r", "k").await.unwrap().remaining();
    assert!(
        free <= 5,
        "{free} units freed after b took the bucket ({taken})"
    );
}

/// A block through the control handle reaches leasing gateways: the one
/// that blocks drops its lease at once, the others when theirs ends; no
/// gateway gets a new lease while the key is blocked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_key_gets_no_new_lease() {
    let server = RedisServer::start();
    let (q, ttl) = (Quota::per_second(1000), Duration::from_millis(100));
    let lease = |redis| {
        let rule = Rule::new("r", KeyExtractor::header("x-key"), q)
            .global(redis)
            .blockable(true)
            .lease(LeasePolicy::new(ttl))
            .on_redis_failure(FailureMode::FailClosed);
        RateLimitLayer::builder()
            .decision_extension(true)
            .rule(rule)
            .build()
            .unwrap()
    };
    let a = lease(server.backend("blocked").await);
    let b = lease(server.backend("blocked").await);
    for _ in 0..20 {
        assert!(call(&a).await.0 && call(&b).await.0);
    }
    a.control()
        .block("r", "k", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!call(&a).await.0, "the blocking gateway stops at once");
    tokio::time::sleep(ttl).await;
    for (name, layer) in [("a", &a), ("b", &b)] {
        for _ in 0..5 {
            assert!(
                !call(layer).await.0,
                "{name} is denied once its lease ended"
            );
        }
    }
}
