//! Exactness under stress with the shipped defaults: four gateways share one
//! healthy private `redis-server`, and bursts of concurrent requests for one
//! key must never admit more than the quota, whether the gateways share one
//! busy 2-worker runtime or run on their own. A Redis answer later than
//! the shipped 20 ms timeout (a loaded machine) is the failure mode's, and
//! the fallback admits each gateway's share on top of what Redis counted:
//! those admissions are counted apart and held to that documented bound.

use std::time::{Duration, Instant};

use axum::{Extension, Router, routing::get};
use keyed_rate_limit::decision::{RateLimitDecision, Source};

use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::{Algorithm, Quota};
use keyed_rate_limit::{KeyExtractor, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;
use keyed_rate_limit_testing::{runtime, serve_on};

const GATEWAYS: usize = 4;
const BURST: usize = 400;
const LIMIT: u32 = 50;
const WINDOW: Duration = Duration::from_secs(60);

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

/// Sends `BURST` concurrent requests for `key`, spread over the gateways;
/// returns how many Redis admitted, how many the fallback admitted, and
/// how long the burst took.
async fn burst(urls: &[String], key: &str) -> (u32, u32, Duration) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(BURST)
        .build()
        .unwrap();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..BURST {
        let (client, url, key) = (client.clone(), urls[i % urls.len()].clone(), key.to_owned());
        tasks.spawn(async move {
            let res = client
                .get(url)
                .header("x-api-key", key)
                .send()
                .await
                .unwrap();
            (res.status().as_u16(), res.text().await.unwrap())
        });
    }
    let (mut admitted, mut fallback) = (0, 0);
    while let Some(answer) = tasks.join_next().await {
        match answer.unwrap() {
            (200, body) if body == "fallback" => fallback += 1,
            (200, body) => {
                assert_eq!(body, "global");
                admitted += 1;
            }
            (429, _) => {}
            (other, _) => panic!("unexpected status {other}"),
        }
    }
    (admitted, fallback, start.elapsed())
}

/// Answers which source admitted the request.
fn source_app(layer: RateLimitLayer) -> Router {
    let source = |Extension(d): Extension<RateLimitDecision>| async move {
        match d.rules()[0].source {
            Source::Fallback => "fallback",
            _ => "global",
        }
    };
    Router::new().route("/", get(source)).layer(layer)
}

/// The quota plus what the algorithm earns back while the burst lasts.
fn bound(algo: Algorithm, elapsed: Duration) -> u32 {
    let earned = match algo {
        // A window's limit is the limit, however long the burst lasts (one window).
        Algorithm::FixedWindow | Algorithm::SlidingWindow => 0,
        _ => (elapsed.as_secs_f64() * f64::from(LIMIT) / WINDOW.as_secs_f64()).ceil() as u32,
    };
    LIMIT + earned
}

/// A gateway as users deploy one, on `rt`: its only rule is global, with
/// the shipped defaults (20 ms timeout, breaker, `LocalFallback`).
async fn gateway(
    url: String,
    prefix: String,
    algo: Algorithm,
    quota: Quota,
    instances: u32,
    rt: &tokio::runtime::Handle,
) -> String {
    serve_on(rt, move || async move {
        let redis = RedisBackend::builder(url).prefix(prefix).build().await;
        let rule = Rule::new("burst", KeyExtractor::header("x-api-key"), quota);
        let layer = RateLimitLayer::builder()
            .rule(rule.global(redis.unwrap()).algorithm(algo))
            .instances(instances)
            .decision_extension(true)
            .build();
        source_app(layer.unwrap())
    })
    .await
}

/// Bursts against four gateways per algorithm, the `i`th on `handle(i)`;
/// every burst within the bound, none trivially empty.
async fn bursts(label: &str, rounds: u32, handle: impl Fn(usize) -> tokio::runtime::Handle) {
    let server = RedisServer::start();
    let mut report = Vec::new();
    for algo in ALGORITHMS {
        let mut urls = Vec::new();
        for i in 0..GATEWAYS {
            let prefix = format!("{label}-{algo}");
            let quota = Quota::new(LIMIT, WINDOW);
            urls.push(
                gateway(
                    server.url(),
                    prefix,
                    algo,
                    quota,
                    GATEWAYS as u32,
                    &handle(i),
                )
                .await,
            );
        }
        for round in 0..rounds {
            let (admitted, fallback, elapsed) = burst(&urls, &format!("key-{round}")).await;
            report.push((algo, round, admitted, fallback, elapsed));
            assert!(
                admitted <= bound(algo, elapsed),
                "{label} {algo} burst {round}: Redis admitted {admitted} of {LIMIT} in {elapsed:?}; all: {report:?}"
            );
            // Each gateway's local share, `LIMIT / GATEWAYS` rounded up, and
            // what each earns back meanwhile (no more than the whole quota's).
            let shares =
                GATEWAYS as u32 * (LIMIT.div_ceil(GATEWAYS as u32) + bound(algo, elapsed) - LIMIT);
            assert!(
                fallback <= shares,
                "{label} {algo} burst {round}: the fallback admitted {fallback} past its shares {shares}; all: {report:?}"
            );
        }
    }
    // A burst that admitted nothing would pass the bound without testing it.
    assert!(report.iter().all(|r| r.2 + r.3 >= LIMIT / 2), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_gateways_on_one_busy_runtime_never_over_admit() {
    let shared = runtime();
    bursts("shared", 3, |_| shared.handle().clone()).await;
    shared.shutdown_background();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_gateways_on_their_own_runtimes_never_over_admit() {
    let runtimes: Vec<_> = (0..GATEWAYS).map(|_| runtime()).collect();
    bursts("own", 2, |i| runtimes[i].handle().clone()).await;
    for rt in runtimes {
        rt.shutdown_background();
    }
}
