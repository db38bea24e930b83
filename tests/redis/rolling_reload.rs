//! A rolling reload: gateways on one Redis reload a rule's quota one at a
//! time, in every order, and those still on the old rules decide between
//! the others' reloads. Nobody gets a fresh quota: after 8 of 10 spent,
//! the whole fleet admits at most what the most generous quota in play
//! leaves (`Proportional`: a fifth of it), over HTTP, on every algorithm.

use crate::support::Backend as _;
use crate::support::gateway::HEALTHY_TIMEOUT;
use crate::support::{ALGORITHMS, get_with, ok_app, serve};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::rule::QuotaChange;
use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

fn rule(redis: &RedisBackend, algorithm: Algorithm, per_hour: u32) -> Rule {
    rule_with(redis, algorithm, per_hour, QuotaChange::Proportional)
}

/// `per_hour` on `algorithm`, converting usage as `how` says.
pub(crate) fn rule_with(
    redis: &RedisBackend,
    algorithm: Algorithm,
    per_hour: u32,
    how: QuotaChange,
) -> Rule {
    Rule::new(
        "api",
        KeyExtractor::header("x-api-key"),
        Quota::per_hour(per_hour),
    )
    .global(redis.clone())
    .algorithm(algorithm)
    .redis_timeout(HEALTHY_TIMEOUT)
    .on_quota_change(how)
}

/// Every order of `0..n`.
fn orders(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for rest in orders(n - 1) {
        for at in 0..=rest.len() {
            let mut o = rest.clone();
            o.insert(at, n - 1);
            out.push(o);
        }
    }
    out
}

/// Requests `key` from `url` until the first refusal (at most 30): how
/// many were admitted.
async fn drain(url: &str, key: &str) -> u32 {
    for n in 0..30 {
        if get_with(url, &[("x-api-key", key)]).await.status() != 200 {
            return n;
        }
    }
    panic!("30 admissions in a row");
}

/// `n` gateways spend 8 of 10 an hour on one key, then reload to `to` in
/// `order`, every gateway draining the key after each reload. What the
/// fleet admitted after the 8.
async fn admitted(server: &RedisServer, algorithm: Algorithm, order: &[usize], to: u32) -> u32 {
    let prefix = format!("roll-{algorithm}-{to}-{order:?}");
    let mut gateways = Vec::new();
    for _ in order {
        // Each gateway its own connection, as in a fleet.
        let redis = server.backend(&prefix).await;
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(rule(&redis, algorithm, 10))
            .build()
            .unwrap();
        let url = serve(ok_app(layer.clone())).await;
        gateways.push((redis, layer, url));
    }
    for i in 0..8 {
        let url = &gateways[i % gateways.len()].2;
        assert_eq!(get_with(url, &[("x-api-key", "k")]).await.status(), 200);
    }
    let mut total = 0;
    for &g in order {
        let (redis, layer, _) = &gateways[g];
        layer.reload([rule(redis, algorithm, to)]).unwrap();
        for (_, _, url) in &gateways {
            total += drain(url, "k").await;
        }
    }
    total
}

#[tokio::test]
async fn a_rolling_reload_hands_nobody_a_fresh_quota() {
    let server = RedisServer::start();
    for algorithm in ALGORITHMS {
        for n in [2, 3] {
            for order in orders(n) {
                // Lowered to 5: the old rules leave 2, the new ones 1.
                let low = admitted(&server, algorithm, &order, 5).await;
                assert!(
                    (1..=2).contains(&low),
                    "{algorithm}, {n} gateways reloading to 5 in order {order:?}: {low} admitted"
                );
                // Raised to 20: the new rules leave 4, the old ones 2.
                let high = admitted(&server, algorithm, &order, 20).await;
                assert!(
                    (2..=4).contains(&high),
                    "{algorithm}, {n} gateways reloading to 20 in order {order:?}: {high} admitted"
                );
            }
        }
    }
}

/// One step of a fleet: gateway `g` reloads to `QUOTAS[q]` when `q` is
/// set (or, when the flag is set, is replaced by a gateway started with
/// it: a rolling restart), then its control handle charges (`false`) or
/// gives back (`true`) units when set, then it asks for the key `n` times.
type Step = (usize, Option<(usize, bool)>, Option<(bool, u32)>, u32);

const QUOTAS: [u32; 3] = [5, 10, 20];

/// Three gateways in this process on one private Redis, starting at 10 an
/// hour, run `steps` against one key: the admissions, and what the most
/// generous quota any gateway had meanwhile allows (with what the control
/// handles gave back, in that quota's units).
async fn fleet(
    server: &RedisServer,
    prefix: &str,
    algorithm: Algorithm,
    steps: &[Step],
) -> (u32, u32) {
    use tower::ServiceExt;
    let mut gateways = Vec::new();
    for _ in 0..3 {
        let redis = server.backend(prefix).await;
        let layer = RateLimitLayer::builder()
            .decision_extension(true)
            .rule(rule(&redis, algorithm, 10))
            .build()
            .unwrap();
        gateways.push((redis, layer));
    }
    let (mut admitted, mut most, mut quotas) = (0, 10, [10u32; 3]);
    // Given back, as fractions of a gateway's quota.
    let mut back = 0.0;
    for &(g, q, control, n) in steps {
        match q {
            Some((q, true)) => {
                let redis = server.backend(prefix).await;
                let layer = RateLimitLayer::builder()
                    .decision_extension(true)
                    .rule(rule(&redis, algorithm, QUOTAS[q]))
                    .build()
                    .unwrap();
                gateways[g] = (redis, layer);
            }
            Some((q, false)) => {
                let (redis, layer) = &gateways[g];
                layer.reload([rule(redis, algorithm, QUOTAS[q])]).unwrap();
            }
            None => {}
        }
        if let Some((q, _)) = q {
            most = most.max(QUOTAS[q]);
            quotas[g] = QUOTAS[q];
        }
        let layer = &gateways[g].1;
        match control {
            Some((false, units)) => {
                layer.control().penalize("api", "k", units).await.unwrap();
            }
            Some((true, units)) => {
                layer.control().reward("api", "k", units).await.unwrap();
                back += f64::from(units) / f64::from(quotas[g]);
            }
            None => {}
        }
        for _ in 0..n {
            let req = http::Request::get("/")
                .header("x-api-key", "k")
                .body(axum::body::Body::empty())
                .unwrap();
            let res = ok_app(layer.clone()).oneshot(req).await.unwrap();
            match res.status().as_u16() {
                200 => admitted += 1,
                429 => {}
                other => panic!("status {other}"),
            }
        }
    }
    (admitted, most + (back * f64::from(most)).ceil() as u32)
}

/// Random reloads, restarts with new rules and control operations
/// (charges, give-backs) on three gateways, with random requests between
/// them:
/// a key never gets more than the most generous quota in play would give
/// it alone (the fraction used is one state, whichever quota reads it; an
/// hour's quota gives nothing back within a case).
#[test]
fn random_rolling_reloads_and_restarts_never_admit_more_than_the_most_generous_quota() {
    use proptest::prelude::*;
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let case = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    });
    let change = proptest::option::of((0usize..3, proptest::bool::ANY));
    let control = proptest::option::weighted(0.3, (proptest::bool::ANY, 1u32..4));
    let steps = proptest::collection::vec((0usize..3, change, control, 0u32..8), 1..16);
    runner
        .run(&(0usize..4, steps), |(a, steps)| {
            let algorithm = ALGORITHMS[a];
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let prefix = format!("roll-prop-{n}");
            let (admitted, most) = runtime.block_on(fleet(&server, &prefix, algorithm, &steps));
            prop_assert!(
                admitted <= most,
                "{algorithm}: {admitted} admitted, the most generous quota (and what was given back) {most}: {steps:?}"
            );
            Ok(())
        })
        .unwrap();
}

/// Asks `layer` for the key until the first refusal (at most 30): how
/// many were admitted.
async fn drain_layer(layer: &RateLimitLayer) -> u32 {
    use tower::ServiceExt;
    for n in 0..30 {
        let req = http::Request::get("/")
            .header("x-api-key", "k")
            .body(axum::body::Body::empty())
            .unwrap();
        if ok_app(layer.clone()).oneshot(req).await.unwrap().status() != 200 {
            return n;
        }
    }
    panic!("30 admissions in a row");
}

/// The control handle on a gateway still on the old rules, after another
/// reloaded and moved the key: its operations are made where the state
/// went (converted), and the tombstone stays, so that gateway keeps
/// following the move instead of getting a fresh quota.
#[tokio::test]
async fn control_operations_follow_a_moved_key_and_keep_its_tombstone() {
    let server = RedisServer::start();
    for algorithm in ALGORITHMS {
        let prefix = format!("buried-{algorithm}");
        let (ra, rb) = (server.backend(&prefix).await, server.backend(&prefix).await);
        let build = |redis: &RedisBackend| {
            RateLimitLayer::builder()
                .rule(rule(redis, algorithm, 10))
                .build()
                .unwrap()
        };
        let (a, b) = (build(&ra), build(&rb));
        a.control().penalize("api", "k", 8).await.unwrap();
        // B reloads to 5 and moves the key (4 of 5 used), spending the last.
        b.reload([rule(&rb, algorithm, 5)]).unwrap();
        assert_eq!(drain_layer(&b).await, 1, "{algorithm}: 1 of 5 left");
        // A gives 2 of its 10 back: 1 of B's 5.
        let left = a.control().reward("api", "k", 2).await.unwrap().remaining();
        assert!(left <= 2, "{algorithm}: A reads the moved state: {left}");
        let after = drain_layer(&a).await + drain_layer(&b).await;
        assert!(
            (1..=2).contains(&after),
            "{algorithm}: 2 of 10 given back, {after} admitted"
        );
        // A resets the key: the moved state, for everyone (read from Redis:
        // B's deny cache holds its last refusal).
        a.control().reset("api", "k").await.unwrap();
        let fresh = b.control().peek("api", "k").await.unwrap().remaining();
        assert_eq!(fresh, 5, "{algorithm}: B's state reset");
        // A still follows: its requests spend B's state.
        let on_a = drain_layer(&a).await;
        let left = b.control().peek("api", "k").await.unwrap().remaining();
        assert!(
            on_a <= 10 && left == 0,
            "{algorithm}: {on_a} on A left {left}"
        );
    }
}

/// A rolling reload of a leasing rule, on keys no deny cache has seen: the
/// gateway that reloads converts in its grant, the other follows, and the
/// fleet admits no more than the old quota left (8 of 10 spent: 2), on
/// every algorithm. A fresh key per round keeps the deny caches out.
#[tokio::test]
async fn a_rolling_reload_of_a_leasing_rule_hands_nobody_a_fresh_quota() {
    use keyed_rate_limit::rule::LeasePolicy;
    use std::time::Duration;
    use tower::ServiceExt;
    let server = RedisServer::start();
    let ask = |layer: &RateLimitLayer, key: &str| {
        let req = http::Request::get("/")
            .header("x-api-key", key)
            .body(axum::body::Body::empty())
            .unwrap();
        ok_app(layer.clone()).oneshot(req)
    };
    for algorithm in ALGORITHMS {
        for (round, to) in [5u32, 20].into_iter().enumerate() {
            let prefix = format!("roll-lease-{algorithm}-{to}");
            let leased = |redis: &RedisBackend, q| {
                rule(redis, algorithm, q).lease(LeasePolicy::new(Duration::from_secs(30)))
            };
            let (ra, rb) = (server.backend(&prefix).await, server.backend(&prefix).await);
            let build = |r: Rule| RateLimitLayer::builder().rule(r).build().unwrap();
            let (a, b) = (build(leased(&ra, 10)), build(leased(&rb, 10)));
            let key = format!("k{round}");
            for _ in 0..8 {
                assert_eq!(ask(&a, &key).await.unwrap().status(), 200);
            }
            b.reload([leased(&rb, to)]).unwrap();
            let mut admitted = 0;
            for layer in [&b, &a, &b, &a] {
                for _ in 0..30 {
                    if ask(layer, &key).await.unwrap().status() != 200 {
                        break;
                    }
                    admitted += 1;
                }
            }
            assert!(
                admitted <= 2 + to / 10,
                "{algorithm}, leased, reloaded to {to}: {admitted} after 8 of 10"
            );
            assert!(admitted >= 1, "{algorithm}: something was left");
        }
    }
}
