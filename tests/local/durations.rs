//! Every duration a user can set, at `Duration::ZERO` and at
//! `Duration::MAX`: the build refuses it, or the layer answers each request
//! with a 2xx or a 429, soon. Never a panic: not on the request path, and
//! not on a task the layer spawns (counted by a panic hook, per thread: a
//! `#[tokio::test]` runtime runs its tasks on the test's thread).

use std::cell::Cell;
use std::sync::{Arc, Once};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{
    Algorithm, ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer, Rule,
    headers::{HeaderStyle, ResetFormat},
    rule::OnDeny,
};
use tokio::sync::Notify;
use tower::ServiceExt;

const EXTREMES: [Duration; 2] = [Duration::ZERO, Duration::MAX];

/// How long a layer has to answer everything it is sent.
const SOON: Duration = Duration::from_secs(10);

thread_local! {
    static PANICS: Cell<usize> = const { Cell::new(0) };
}

/// Panics so far on this thread (the hook keeps printing them).
fn panics() -> usize {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.with(|n| n.set(n.get() + 1));
            prev(info);
        }));
    });
    PANICS.with(Cell::get)
}

/// A request held in its handler: `entered` when it is, answered when
/// `release` is notified.
#[derive(Clone, Default)]
struct Hold {
    entered: Arc<Notify>,
    release: Arc<Notify>,
}

/// `GET /` answering at once and `GET /hold` held by `hold`, behind `layer`.
fn app<L>(layer: L, hold: Hold) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request<Body>, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<Request<Body>>>::Response: axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<Request<Body>>>::Future: Send + 'static,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/hold",
            get(move || async move {
                hold.entered.notify_one();
                hold.release.notified().await;
                "ok"
            }),
        )
        .layer(layer)
}

fn get_req(path: &str) -> Request<Body> {
    Request::get(path)
        .header("x-user", "alice")
        .body(Body::empty())
        .unwrap()
}

/// Sends `n` requests one after the other; each must be a 2xx or a 429.
async fn statuses(app: &Router, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let res = tokio::time::timeout(SOON, app.clone().oneshot(get_req("/")))
            .await
            .expect("answered soon")
            .unwrap();
        assert_sane(res.status());
        out.push(res.status().as_u16());
    }
    out
}

fn assert_sane(s: StatusCode) {
    assert!(
        s.is_success() || s == StatusCode::TOO_MANY_REQUESTS,
        "a 2xx or a 429, not {s}"
    );
}

/// Runs `case` and checks that nothing panicked meanwhile on this thread,
/// a spawned task included (given a moment to run).
async fn no_panic<F: Future<Output = ()>>(what: &str, case: F) {
    let before = panics();
    tokio::time::timeout(SOON * 3, case)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done in time"));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(panics(), before, "{what}: a task panicked");
}

fn rule(quota: Quota) -> Rule {
    Rule::new("r", KeyExtractor::header("x-user"), quota)
}

/// Builds `rule`, expecting an error exactly when `refused`, and sends
/// `n` requests when it builds; returns their statuses.
async fn run(rule: Rule, refused: bool, n: usize) -> Vec<u16> {
    run_with(
        RateLimitLayer::builder().rule(rule).instances(1),
        refused,
        n,
    )
    .await
}

async fn run_with(
    b: keyed_rate_limit::rate_limit::RateLimitBuilder,
    refused: bool,
    n: usize,
) -> Vec<u16> {
    match b.build() {
        Err(e) => {
            assert!(refused, "refused: {e}");
            Vec::new()
        }
        Ok(layer) => {
            assert!(!refused, "built");
            statuses(&app(layer, Hold::default()), n).await
        }
    }
}

#[tokio::test]
async fn quota_windows() {
    for window in EXTREMES {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            for limit in [1, 7, u32::MAX] {
                for (style, reset) in [
                    (HeaderStyle::Draft, ResetFormat::DeltaSeconds),
                    (HeaderStyle::Both, ResetFormat::UnixSeconds),
                ] {
                    let what = format!("{algorithm:?} {limit} per {window:?}, {style:?} {reset:?}");
                    no_panic(&what, async {
                        let b = RateLimitLayer::builder()
                            .rule(rule(Quota::new(limit, window)).algorithm(algorithm))
                            .headers(style)
                            .legacy_reset(reset)
                            .instances(1);
                        let s = run_with(b, window.is_zero(), 3).await;
                        if !window.is_zero() {
                            assert_eq!(s[0], 200, "{what}");
                        }
                        if limit == 1 && !window.is_zero() {
                            assert_eq!(s, [200, 429, 429], "{what}");
                        }
                    })
                    .await;
                }
            }
        }
    }
}

#[tokio::test]
async fn wait_max() {
    no_panic("wait zero", async {
        let wait = OnDeny::Wait {
            max: Duration::ZERO,
            queue: 10,
        };
        run(rule(Quota::per_second(1)).on_deny(wait), true, 0).await;
    })
    .await;
    let forever = OnDeny::Wait {
        max: Duration::MAX,
        queue: 10,
    };
    no_panic("wait for ever, a unit every 50 ms", async {
        let q = Quota::new(20, Duration::from_secs(1)).with_burst(1);
        assert_eq!(run(rule(q).on_deny(forever), false, 3).await, [200; 3]);
    })
    .await;
    // A unit decades away (governor's counters cap a window of
    // `Duration::MAX` at 146 years a bucket) is within a wait for ever: the
    // second request waits, as asked, and the third finds the queue full
    // and is refused at once.
    no_panic("wait for ever, a unit never", async {
        let forever = OnDeny::Wait {
            max: Duration::MAX,
            queue: 1,
        };
        let layer = RateLimitLayer::builder()
            .rule(rule(Quota::new(1, Duration::MAX)).on_deny(forever))
            .build()
            .unwrap();
        let app = app(layer, Hold::default());
        assert_eq!(statuses(&app, 1).await, [200]);
        let waiting = tokio::spawn(app.clone().oneshot(get_req("/")));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiting.is_finished(), "waits for its unit");
        assert_eq!(statuses(&app, 2).await, [429, 429], "the queue is full");
        waiting.abort();
        let _ = waiting.await;
        // The waiter gone, its place is free: the next one waits too.
        let next = app.clone().oneshot(get_req("/"));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), next)
                .await
                .is_err()
        );
    })
    .await;
}

#[tokio::test]
async fn lockouts() {
    let periods = [Duration::ZERO, Duration::from_secs(1), Duration::MAX];
    for within in periods {
        for block_for in periods {
            let refused = within.is_zero() || block_for.is_zero();
            let what = format!("lockout within {within:?} for {block_for:?}");
            no_panic(&what, async {
                let r = rule(Quota::new(1, Duration::from_secs(3600)))
                    .lockout(Lockout::new(1, within, block_for));
                let s = run(r, refused, 3).await;
                if !refused {
                    assert_eq!(s, [200, 429, 429], "{what}");
                }
            })
            .await;
        }
    }
}

#[tokio::test]
async fn cleanup_intervals() {
    for every in EXTREMES {
        no_panic(&format!("cleanup every {every:?}"), async {
            let b = RateLimitLayer::builder()
                .rule(rule(Quota::per_second(1)))
                .cleanup_interval(every);
            let s = run_with(b, every.is_zero(), 2).await;
            if !every.is_zero() {
                assert_eq!(s, [200, 429]);
            }
        })
        .await;
    }
}

#[tokio::test]
async fn control_blocks() {
    for d in EXTREMES {
        no_panic(&format!("block for {d:?}"), async {
            let layer = RateLimitLayer::builder()
                .rule(rule(Quota::per_second(5)))
                .build()
                .unwrap();
            let control = layer.control();
            let app = app(layer, Hold::default());
            // A zero block may be refused or may lock nothing; either is sane.
            let _ = control.block("r", "alice", d).await;
            let s = statuses(&app, 2).await;
            if !d.is_zero() {
                assert_eq!(s, [429, 429]);
            }
        })
        .await;
    }
}

/// One request held in flight, then another: the limit of one refuses it,
/// with whatever `Retry-After` the setting makes; then both are free.
async fn held_then_refused(layer: ConcurrencyLimitLayer) {
    let hold = Hold::default();
    let app = app(layer, hold.clone());
    let held = tokio::spawn(app.clone().oneshot(get_req("/hold")));
    tokio::time::timeout(SOON, hold.entered.notified())
        .await
        .expect("the held request is in soon");
    let res = tokio::time::timeout(SOON, app.clone().oneshot(get_req("/")))
        .await
        .expect("answered soon")
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    hold.release.notify_one();
    let res = tokio::time::timeout(SOON, held)
        .await
        .expect("answered soon")
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    drop(res); // Its body held the slot, given back on a task for Redis.
    for _ in 0..100 {
        if statuses(&app, 1).await == [200] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the slot is back soon");
}

#[tokio::test]
async fn concurrency_retry_after() {
    for wait in EXTREMES {
        no_panic(&format!("retry after {wait:?}"), async {
            let b = ConcurrencyLimitLayer::builder("c", KeyExtractor::header("x-user"), 1)
                .retry_after(wait);
            match b.build() {
                Err(_) => assert!(wait.is_zero()),
                Ok(layer) => held_then_refused(layer).await,
            }
        })
        .await;
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use crate::support::ALGORITHMS;
    use crate::support::Backend as _;
    use keyed_rate_limit::RedisBackend;
    use keyed_rate_limit::failure::BreakerConfig;
    use keyed_rate_limit::rule::LeasePolicy;
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
                        let b = RateLimitLayer::builder()
                            .rule(rule(Quota::per_second(1)).global(redis));
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
                    .rule(rule(Quota::per_second(5)).global(server.backend("block").await))
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
}
