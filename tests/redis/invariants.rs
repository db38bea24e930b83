//! Every Redis algorithm under random costs and gaps, on a private
//! `redis-server`: the units admitted never exceed what the algorithm
//! promises. Admission times are bracketed by Redis `TIME` read before and
//! after each call, so the checks hold whatever the network does.
//!
//! - GCRA and token bucket: between any two admissions, at most
//!   `burst + gap / interval` units (the gap taken at its longest).
//! - Fixed window: at most `limit` units per window, each admission
//!   placed in its window by the key's expiry.
//! - Sliding window: at most `limit` units per aligned window (its current
//!   count alone never passes the limit), for admissions whose window is
//!   certain.

use std::time::Duration;

use crate::support::Backend as _;
use crate::support::admits::{Admit, check, time_us};
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::{Algorithm, Key, Quota};
use keyed_rate_limit_testing::RedisServer;
use proptest::prelude::*;

/// Runs `ops` (gap in ms, cost) against one key; returns the admissions.
async fn run(
    server: &RedisServer,
    b: &RedisBackend,
    prefix: &str,
    algorithm: Algorithm,
    q: Quota,
    ops: &[(u64, u32)],
) -> Vec<Admit> {
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let key = Key::from("k");
    let mut out = Vec::new();
    for &(gap, cost) in ops {
        tokio::time::sleep(Duration::from_millis(gap)).await;
        let lo = time_us(&mut c).await;
        let d = b.check("r", &key, algorithm, &q, cost).await.unwrap();
        let hi = time_us(&mut c).await;
        if !d.is_allowed() {
            continue;
        }
        let window_end = if algorithm == Algorithm::FixedWindow {
            let window_us = q.window().as_micros();
            let k = format!(
                "{prefix}:{{1:r:k}}:fw:{}/{window_us}/{}",
                q.limit(),
                q.burst()
            );
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&k)
                .query_async(&mut c)
                .await
                .unwrap();
            let after = time_us(&mut c).await;
            Some(after + pttl as f64 * 1000.0)
        } else {
            None
        };
        out.push(Admit {
            lo,
            hi,
            cost,
            window_end,
        });
    }
    out
}

const ALL: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
];

/// A runner, not `proptest!`, so the server is a local that is stopped at
/// the end. Each case sleeps through its gaps (about a second, the
/// algorithms side by side): few cases, each long enough to cross several
/// windows.
#[test]
fn admitted_units_stay_within_the_promise() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let case = std::sync::atomic::AtomicUsize::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 8,
        max_shrink_iters: 0,
        ..ProptestConfig::default()
    });
    let cases = (
        2u32..=6,
        200u64..=400,
        0u32..=3,
        proptest::collection::vec((0u64..=120, 1u32..=9), 12..=24),
    );
    runner
        .run(&cases, |(limit, window_ms, extra_burst, ops)| {
            let case = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let server = &server;
            let results = runtime.block_on(async {
                let runs = ALL.map(|algorithm| {
                    let ops = ops.clone();
                    async move {
                        let q = Quota::new(limit, Duration::from_millis(window_ms));
                        let q = if algorithm.has_burst() {
                            q.with_burst(limit + extra_burst)
                        } else {
                            q
                        };
                        let prefix = format!("inv{case}-{algorithm}");
                        let b = server.backend(&prefix).await;
                        let capacity = algorithm.capacity(&q);
                        let ops: Vec<(u64, u32)> = ops
                            .iter()
                            .map(|&(gap, cost)| (gap, 1 + (cost - 1) % capacity))
                            .collect();
                        let admits = run(server, &b, &prefix, algorithm, q, &ops).await;
                        (algorithm, q, admits)
                    }
                });
                futures_util::future::join_all(runs).await
            });
            for (algorithm, q, admits) in results {
                prop_assert!(!admits.is_empty(), "{algorithm}: nothing admitted");
                if let Err(e) = check(algorithm, q, &admits) {
                    prop_assert!(false, "{algorithm} {q}: {e}");
                }
            }
            Ok(())
        })
        .unwrap();
}
