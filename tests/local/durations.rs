//! Every duration a user can set, at `Duration::ZERO` and at
//! `Duration::MAX`: the build refuses it, or the layer answers each request
//! with a 2xx or a 429, soon. Never a panic: not on the request path, and
//! not on a task the layer spawns (counted by a panic hook, per thread: a
//! `#[tokio::test]` runtime runs its tasks on the test's thread).

use std::time::Duration;

use keyed_rate_limit::rule::Lockout;
use keyed_rate_limit::{
    Algorithm, ConcurrencyLimitLayer, KeyExtractor, Quota, RateLimitLayer,
    headers::{HeaderStyle, ResetFormat},
    rule::OnDeny,
};
use tower::ServiceExt;

use crate::support::durations::*;

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
                .rule(rule(Quota::per_second(5)).blockable(true))
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
