//! Group commit (`Rule::coalesce`) on a private `redis-server`: a crowd of
//! concurrent requests, for one key or many, on one gateway and on four,
//! is decided exactly as single calls would decide it, for every
//! algorithm and a calendar quota, with far fewer script calls; a failed
//! call fails its batch once.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use crate::support::Backend as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::{BreakerConfig, BreakerState};
use keyed_rate_limit::{
    Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule, decision::RateLimitDecision,
    failure::FailureMode,
};
use keyed_rate_limit_testing::RedisServer;
use tower::{ServiceExt, service_fn};

pub(crate) fn coalescing(redis: RedisBackend, algorithm: Algorithm, q: Quota) -> RateLimitLayer {
    RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("r", KeyExtractor::header("x-key"), q)
                .global(redis)
                .algorithm(algorithm)
                // The default, said for the reader.
                .coalesce(true)
                .on_redis_failure(FailureMode::FailClosed)
                // A loaded CI machine must not fail the crowd's calls.
                .redis_timeout(Duration::from_secs(2)),
        )
        .build()
        .unwrap()
}

/// `n` requests at once for one key, spread over `layers`: the
/// `remaining` each admitted one was told.
async fn crowd(layers: &[RateLimitLayer], n: usize) -> Vec<u32> {
    crowd_over(layers, n, |_| "k".to_owned())
        .await
        .into_iter()
        .filter_map(|(_, told)| told)
        .collect()
}

/// `n` requests at once, request `i` for key `key(i)`, spread over
/// `layers`: each one's key and, when admitted, the `remaining` it was told.
pub(crate) async fn crowd_over(
    layers: &[RateLimitLayer],
    n: usize,
    key: impl Fn(usize) -> String,
) -> Vec<(String, Option<u32>)> {
    let calls = (0..n).map(|i| {
        let svc =
            layers[i % layers.len()].layer(service_fn(|req: Request<Full<Bytes>>| async move {
                let remaining = req
                    .extensions()
                    .get::<RateLimitDecision>()
                    .and_then(|d| d.rules().first().map(|r| r.decision.remaining()));
                let mut res = Response::new(Full::<Bytes>::default());
                res.extensions_mut().insert(remaining);
                Ok::<_, Infallible>(res)
            }));
        let key = key(i);
        tokio::spawn(async move {
            let req = Request::get("/")
                .header("x-key", &key)
                .body(Full::default())
                .unwrap();
            let res = svc.oneshot(req).await.unwrap();
            let told = res.extensions().get::<Option<u32>>().copied().flatten();
            (key, told)
        })
    });
    let mut out = Vec::new();
    for r in futures_util::future::join_all(calls).await {
        out.push(r.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_on_one_key_is_decided_exactly_in_few_calls() {
    let server = RedisServer::start();
    let cases = [
        (Algorithm::Gcra, Quota::per_hour(30)),
        (Algorithm::TokenBucket, Quota::per_hour(30)),
        (Algorithm::FixedWindow, Quota::per_hour(30)),
        (Algorithm::SlidingWindow, Quota::per_hour(30)),
        (Algorithm::Gcra, Quota::per_calendar_day(30)),
    ];
    for (i, (algorithm, q)) in cases.into_iter().enumerate() {
        for gateways in [1, 4] {
            let prefix = format!("co{i}-{gateways}");
            let mut layers = Vec::new();
            for _ in 0..gateways {
                layers.push(coalescing(server.backend(&prefix).await, algorithm, q));
            }
            let admitted = crowd(&layers, 400).await;
            let what = format!("{algorithm} {q} on {gateways} gateway(s)");
            // Single calls admit exactly the 30, whatever the order.
            assert_eq!(admitted.len(), 30, "{what}: {admitted:?}");
            // Each its own decision: 29 left, then 28, ... then none.
            let told: BTreeSet<u32> = admitted.iter().copied().collect();
            assert_eq!(told, (0..30).collect(), "{what}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_within_its_quota_takes_a_few_script_calls() {
    let server = RedisServer::start();
    for algorithm in [Algorithm::Gcra, Algorithm::SlidingWindow] {
        let prefix = format!("few-{algorithm}");
        let layer = coalescing(
            server.backend(&prefix).await,
            algorithm,
            Quota::per_hour(1000),
        );
        let before = server.script_calls();
        let admitted = crowd(std::slice::from_ref(&layer), 200).await;
        let calls = server.script_calls() - before;
        // No deny to cache: without coalescing, 200 calls.
        assert_eq!(admitted.len(), 200);
        let told: BTreeSet<u32> = admitted.iter().copied().collect();
        assert_eq!(told, (800..1000).collect(), "{algorithm}");
        assert!(
            calls <= 50,
            "{algorithm}: {calls} script calls for 200 requests"
        );
        eprintln!("{algorithm}: {calls} script calls for 200 concurrent requests");
    }
}

/// Many keys in one script call: each key's requests decided in arrival
/// order, each told its own `remaining`, as separate calls would be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_over_many_keys_is_decided_exactly_per_key() {
    let server = RedisServer::start();
    let cases = [
        (Algorithm::Gcra, Quota::per_hour(5)),
        (Algorithm::TokenBucket, Quota::per_hour(5)),
        (Algorithm::FixedWindow, Quota::per_hour(5)),
        (Algorithm::SlidingWindow, Quota::per_hour(5)),
        (Algorithm::Gcra, Quota::per_calendar_day(5)),
    ];
    for (i, (algorithm, q)) in cases.into_iter().enumerate() {
        for gateways in [1, 4] {
            let prefix = format!("many{i}-{gateways}");
            let mut layers = Vec::new();
            for _ in 0..gateways {
                layers.push(coalescing(server.backend(&prefix).await, algorithm, q));
            }
            // 16 keys, 12 requests each, interleaved.
            let got = crowd_over(&layers, 192, |i| format!("key{}", i % 16)).await;
            let what = format!("{algorithm} {q} on {gateways} gateway(s)");
            for k in 0..16 {
                let key = format!("key{k}");
                let told: Vec<u32> = got
                    .iter()
                    .filter(|(g, _)| *g == key)
                    .filter_map(|(_, t)| *t)
                    .collect();
                let told_set: BTreeSet<u32> = told.iter().copied().collect();
                assert_eq!(told.len(), 5, "{what}, {key}: {told:?}");
                assert_eq!(told_set, (0..5).collect(), "{what}, {key}");
            }
        }
    }
}

/// Distinct keys share script calls: one call per round trip, not one per
/// key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_of_distinct_keys_takes_a_few_script_calls() {
    let server = RedisServer::start();
    for algorithm in [Algorithm::Gcra, Algorithm::FixedWindow] {
        let prefix = format!("distinct-{algorithm}");
        let layer = coalescing(
            server.backend(&prefix).await,
            algorithm,
            Quota::per_hour(10),
        );
        let before = server.script_calls();
        let got = crowd_over(std::slice::from_ref(&layer), 200, |i| format!("d{i}")).await;
        let calls = server.script_calls() - before;
        // Each key's first request: 9 left. Alone, 200 calls.
        assert!(got.iter().all(|(_, told)| *told == Some(9)), "{got:?}");
        assert!(
            calls <= 50,
            "{algorithm}: {calls} script calls for 200 keys"
        );
        eprintln!("{algorithm}: {calls} script calls for 200 concurrent distinct keys");
    }
}

/// A call that fails fails its batch once: the waiters behind it take the
/// failure mode at once, and the breaker counts one failure, not one per
/// waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_call_fails_its_batch_once() {
    let server = RedisServer::start();
    let layer = RateLimitLayer::builder()
        .decision_extension(true)
        .rule(
            Rule::new("r", KeyExtractor::header("x-key"), Quota::per_hour(10))
                .global(server.backend("fail-once").await)
                .on_redis_failure(FailureMode::FailClosed)
                .redis_timeout(Duration::from_millis(300))
                .circuit_breaker(BreakerConfig::default().failure_threshold(3)),
        )
        .build()
        .unwrap();
    // Connected and loaded before the pause.
    assert_eq!(
        crowd_over(std::slice::from_ref(&layer), 1, |_| "warm".into())
            .await
            .len(),
        1
    );
    server.pause();
    let got = crowd_over(std::slice::from_ref(&layer), 60, |i| format!("f{i}")).await;
    server.resume();
    assert!(
        got.iter().all(|(_, told)| told.is_none()),
        "fail closed: {got:?}"
    );
    let breakers = layer.breakers();
    assert_eq!(
        breakers[0].state,
        BreakerState::Closed,
        "60 requests behind at most two failed calls: {breakers:?}"
    );
}
