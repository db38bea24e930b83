//! Every duration a global rule, its backend or a global concurrency limit
//! takes, at `Duration::ZERO` and at `Duration::MAX`: a build error, or a
//! 2xx or a 429, soon; never a panic.

use crate::support::durations::*;
use std::time::Duration;

use crate::support::ALGORITHMS;
use crate::support::Backend as _;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::failure::BreakerConfig;
use keyed_rate_limit::rule::LeasePolicy;
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer};
use keyed_rate_limit_testing::{RedisServer, free_port};

/// A backend whose server refuses every connection.
async fn dead() -> RedisBackend {
    RedisBackend::builder(format!("redis://127.0.0.1:{}", free_port()))
        .connect_lazily()
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn global_quota_windows_and_lockouts() {
    let server = RedisServer::start();
    for window in EXTREMES {
        for algorithm in ALGORITHMS {
            let what = format!("global {algorithm:?} 1 per {window:?}");
            let prefix = format!("w{algorithm:?}{}", window.is_zero());
            let redis = server.backend(&prefix).await;
            no_panic(&what, async {
                let r = rule(Quota::new(1, window)).algorithm(algorithm);
                let s = run(r.global(redis.clone()), window.is_zero(), 3).await;
                if !window.is_zero() {
                    assert_eq!(s, [200, 429, 429], "{what}");
                }
            })
            .await;
            for block_for in EXTREMES {
                let what = format!("{what}, locked for {block_for:?}");
                let redis = server
                    .backend(&format!("{prefix}{}", block_for.is_zero()))
                    .await;
                no_panic(&what, async {
                    let r = rule(Quota::new(1, Duration::from_secs(3600)))
                        .algorithm(algorithm)
                        .lockout(Lockout::new(1, window, block_for))
                        .global(redis);
                    let refused = window.is_zero() || block_for.is_zero();
                    let s = run(r, refused, 3).await;
                    if !refused {
                        assert_eq!(s[0], 200, "{what}");
                    }
                })
                .await;
            }
        }
    }
}

#[tokio::test]
async fn redis_timeouts_and_breakers() {
    let server = RedisServer::start();
    for d in EXTREMES {
        for (alive, redis) in [(true, server.backend("t").await), (false, dead().await)] {
            let what = format!("timeout {d:?}, alive {alive}");
            no_panic(&what, async {
                let r = rule(Quota::per_second(1)).global(redis.clone());
                run(r.redis_timeout(d), d.is_zero(), 3).await;
            })
            .await;
            let what = format!("open for {d:?}, alive {alive}");
            no_panic(&what, async {
                let breaker = BreakerConfig::default().failure_threshold(1).open_for(d);
                let r = rule(Quota::per_second(1))
                    .global(redis.clone())
                    .redis_timeout(Duration::from_millis(200))
                    .circuit_breaker(breaker);
                run(r, false, 3).await;
            })
            .await;
        }
    }
}

#[tokio::test]
async fn lease_ttls() {
    let server = RedisServer::start();
    let redis = server.backend("lease").await;
    for ttl in EXTREMES {
        no_panic(&format!("lease ttl {ttl:?}"), async {
            let r = rule(Quota::per_second(1000))
                .global(redis.clone())
                .lease(LeasePolicy::new(ttl));
            run(r, true, 0).await;
        })
        .await;
    }
    no_panic("a lease of a quota over Duration::MAX", async {
        let r = rule(Quota::new(u32::MAX, Duration::MAX))
            .global(redis.clone())
            .lease(LeasePolicy::new(Duration::from_millis(100)));
        let b = RateLimitLayer::builder().rule(r).instances(1);
        if let Ok(layer) = b.build() {
            statuses(&app(layer, Hold::default()), 3).await;
        }
    })
    .await;
}

#[tokio::test]
async fn live_instance_ttls() {
    let server = RedisServer::start();
    for ttl in EXTREMES {
        no_panic(&format!("live instances ttl {ttl:?}"), async {
            let built = RedisBackend::builder(server.url())
                .prefix("live")
                .live_instances(ttl)
                .build()
                .await;
            match built {
                Err(_) => assert!(ttl.is_zero()),
                Ok(redis) => {
                    let b =
                        RateLimitLayer::builder().rule(rule(Quota::per_second(1)).global(redis));
                    assert_eq!(run_with(b, false, 2).await, [200, 429]);
                }
            }
        })
        .await;
    }
}

#[tokio::test]
async fn global_control_blocks() {
    let server = RedisServer::start();
    for d in EXTREMES {
        no_panic(&format!("global block for {d:?}"), async {
            let layer = RateLimitLayer::builder()
                .rule(
                    rule(Quota::per_second(5))
                        .blockable(true)
                        .global(server.backend("block").await),
                )
                .instances(1)
                .build()
                .unwrap();
            let control = layer.control();
            let app = app(layer, Hold::default());
            let _ = control.block("r", "alice", d).await;
            let s = statuses(&app, 2).await;
            if !d.is_zero() {
                assert_eq!(s, [429, 429]);
            }
            let _ = control.unblock("r", "alice").await;
        })
        .await;
    }
}

#[tokio::test]
async fn global_concurrency_durations() {
    let server = RedisServer::start();
    let alive = server.backend("conc").await;
    let limit = || ConcurrencyLimitLayer::builder("c", KeyExtractor::header("x-user"), 1);
    for d in EXTREMES {
        let cases = [
            ("slot ttl", limit().global(alive.clone()).slot_ttl(d)),
            ("retry after", limit().global(alive.clone()).retry_after(d)),
            ("timeout", limit().global(alive.clone()).redis_timeout(d)),
            (
                "open for",
                limit()
                    .global(dead().await)
                    .redis_timeout(Duration::from_millis(200))
                    .circuit_breaker(BreakerConfig::default().failure_threshold(1).open_for(d)),
            ),
        ];
        for (what, b) in cases {
            let what = format!("global concurrency, {what} {d:?}");
            no_panic(&what, async {
                match b.instances(1).build() {
                    Err(e) => assert!(d.is_zero(), "{what}: {e}"),
                    Ok(layer) if what.contains("open for") => {
                        let app = app(layer, Hold::default());
                        statuses(&app, 3).await;
                    }
                    Ok(layer) => held_then_refused(layer).await,
                }
            })
            .await;
        }
    }
}
