//! Refunds bound to their window on Redis: a refund that arrives after
//! the window it was charged in has ended is void, on the fixed window,
//! the sliding window and a calendar day (tests/support/late_refund.rs).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::Backend as _;
use crate::support::late_refund::{late_refund, midnight_in, refunding};
use keyed_rate_limit::{Algorithm, KeyExtractor, Quota, RateLimitLayer, Rule};
use keyed_rate_limit_testing::RedisServer;

async fn layer(
    server: &RedisServer,
    name: &str,
    algorithm: Algorithm,
    quota: Quota,
) -> RateLimitLayer {
    let rule = Rule::new(name, KeyExtractor::header("x-key"), quota)
        .algorithm(algorithm)
        .global(server.backend(name).await)
        .redis_timeout(Duration::from_millis(500));
    RateLimitLayer::builder()
        .rule(refunding(rule))
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_refund_after_its_window_ended_never_credits_the_next() {
    let server = RedisServer::start();
    let two_s = Quota::new(2, Duration::from_secs(2));
    let day = Quota::per_calendar_day(2).with_utc_offset(midnight_in(Duration::from_secs(2)));
    let fixed = layer(&server, "late-fw", Algorithm::FixedWindow, two_s).await;
    let sliding = layer(&server, "late-sw", Algorithm::SlidingWindow, two_s).await;
    let calendar = layer(&server, "late-cal", Algorithm::FixedWindow, day).await;
    let (fixed, sliding, calendar) = tokio::join!(
        // Started by the held request's charge.
        late_refund(
            fixed,
            "late-fw",
            || SystemTime::now() + Duration::from_secs(2),
            false
        ),
        // Aligned on the clock (Redis's is this machine's).
        late_refund(
            sliding,
            "late-sw",
            || {
                let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
                UNIX_EPOCH + Duration::from_secs(now.as_secs() / 2 * 2 + 2)
            },
            true
        ),
        late_refund(
            calendar,
            "late-cal",
            || day.calendar_window(SystemTime::now()).unwrap().1,
            false
        ),
    );
    assert_eq!(fixed, (2, 0), "fixed window: the next one keeps its count");
    assert!(sliding.0 >= 1, "sliding window: {sliding:?}");
    assert_eq!(
        calendar,
        (2, 0),
        "calendar day: the next one keeps its count"
    );
}
