//! `OnDeny::Wait`: requests over the quota wait for their unit instead of
//! being refused, within a bound, in a bounded queue, and a waiter whose
//! client goes away frees its place.

use std::convert::Infallible;
use std::time::Duration;

use crate::support::wait::{admitted_at_their_slots, ten_per_second};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule, rule::OnDeny};
use tower::{ServiceExt, service_fn};

type Body = Full<bytes::Bytes>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_requests_over_the_quota_are_admitted_at_their_slots() {
    admitted_at_their_slots(Rule::new(
        "jobs",
        KeyExtractor::everyone(),
        ten_per_second(),
    ))
    .await;
}

fn svc(
    layer: &RateLimitLayer,
) -> impl tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible, Future: Send>
+ Clone
+ Send
+ 'static {
    layer.layer(service_fn(|_req: Request<Body>| async {
        Ok::<_, Infallible>(Response::new(Body::default()))
    }))
}

fn request() -> Request<Body> {
    Request::new(Body::default())
}

/// At the service: a full queue refuses at once, a deny too far away is
/// refused, and dropping the waiters frees the queue.
#[tokio::test]
async fn the_queue_is_bounded_and_cancelled_waiters_leave_it() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "slow",
                KeyExtractor::everyone(),
                Quota::new(1, Duration::from_secs(10)),
            )
            .on_deny(OnDeny::Wait {
                max: Duration::from_secs(30),
                queue: 2,
            }),
        )
        .build()
        .unwrap();
    let s = svc(&layer);
    assert_eq!(
        s.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    // Two wait for the unit 10 s away...
    let waiting: Vec<_> = (0..2)
        .map(|_| tokio::spawn(s.clone().oneshot(request())))
        .collect();
    // Let them run until they sleep in the queue (current-thread runtime:
    // spawned tasks run when this one yields).
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // ...so a third finds the queue full and is refused at once.
    let full = tokio::time::timeout(Duration::from_secs(5), s.clone().oneshot(request()))
        .await
        .ok()
        .map(Result::unwrap);
    let full = full.expect("a full queue answers at once");
    assert_eq!(full.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(full.headers().contains_key("retry-after"));

    // The clients go away: their places are free again.
    for w in &waiting {
        w.abort();
    }
    for w in waiting {
        assert!(w.await.unwrap_err().is_cancelled());
    }
    let fresh =
        tokio::time::timeout(Duration::from_millis(300), s.clone().oneshot(request())).await;
    assert!(
        fresh.is_err(),
        "a new request waits instead of being refused"
    );

    // A wait longer than `max` is refused at once.
    let short = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "short",
                KeyExtractor::everyone(),
                Quota::new(1, Duration::from_secs(10)),
            )
            .on_deny(OnDeny::Wait {
                max: Duration::from_secs(1),
                queue: 10,
            }),
        )
        .build()
        .unwrap();
    let s = svc(&short);
    assert_eq!(
        s.clone().oneshot(request()).await.unwrap().status(),
        StatusCode::OK
    );
    let res = tokio::time::timeout(Duration::from_secs(5), s.oneshot(request())).await;
    assert_eq!(
        res.expect("refused at once").unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[test]
fn wait_needs_a_positive_max_and_queue() {
    for bad in [
        OnDeny::Wait {
            max: Duration::ZERO,
            queue: 1,
        },
        OnDeny::Wait {
            max: Duration::from_secs(1),
            queue: 0,
        },
    ] {
        let rule = Rule::new("r", KeyExtractor::everyone(), Quota::per_second(1)).on_deny(bad);
        assert!(
            RateLimitLayer::builder().rule(rule).build().is_err(),
            "{bad:?}"
        );
    }
}
