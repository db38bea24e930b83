//! Same-key coalescing (`Rule::coalesce`) on a private `redis-server`: a
//! crowd of concurrent requests for one key, on one gateway and on four,
//! is decided exactly as single calls would decide it, for every
//! algorithm and a calendar quota, with far fewer script calls.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use crate::support::Backend as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use keyed_rate_limit::backend::redis::RedisBackend;
use keyed_rate_limit::{
    Algorithm, FailureMode, Quota, RateLimitDecision, RateLimitLayer, Rule, key::KeyExtractor,
};
use keyed_rate_limit_testing::RedisServer;
use tower::{ServiceExt, service_fn};

fn coalescing(redis: RedisBackend, algorithm: Algorithm, q: Quota) -> RateLimitLayer {
    RateLimitLayer::builder()
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

/// `n` requests at once, spread over `layers`: the `remaining` each
/// admitted one was told.
async fn crowd(layers: &[RateLimitLayer], n: usize) -> Vec<u32> {
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
        tokio::spawn(async move {
            let req = Request::get("/")
                .header("x-key", "k")
                .body(Full::default())
                .unwrap();
            let res = svc.oneshot(req).await.unwrap();
            res.extensions().get::<Option<u32>>().copied().flatten()
        })
    });
    let mut admitted = Vec::new();
    for r in futures_util::future::join_all(calls).await {
        admitted.extend(r.unwrap());
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crowd_on_one_key_is_decided_exactly_in_few_calls() {
    let server = RedisServer::start();
    let cases = [
        (Algorithm::Gcra, Quota::per_hour(30)),
        (Algorithm::TokenBucket, Quota::per_hour(30)),
        (Algorithm::FixedWindow, Quota::per_hour(30)),
        (Algorithm::SlidingWindow, Quota::per_hour(30)),
        (Algorithm::Gcra, Quota::per_day(30)),
    ];
    for (i, (algorithm, q)) in cases.into_iter().enumerate() {
        for gateways in [1, 4] {
            let prefix = format!("co{i}-{gateways}");
            let mut layers = Vec::new();
            for _ in 0..gateways {
                layers.push(coalescing(server.backend(&prefix).await, algorithm, q));
            }
            let admitted = crowd(&layers, 200).await;
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
