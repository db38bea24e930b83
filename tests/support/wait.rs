//! Requests over the quota that wait for their unit, served over HTTP: what
//! tests/local/wait.rs and tests/redis/wait.rs share.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{client, serve};
use axum::{Router, routing::get};
use http::StatusCode;
use keyed_rate_limit::{Quota, RateLimitLayer, Rule, rule::OnDeny};

/// Over HTTP: five requests at once against one unit per 100 ms (burst 1)
/// all pass, each no earlier than its slot.
pub async fn admitted_at_their_slots(rule: Rule) {
    const N: usize = 5;
    let interval = Duration::from_millis(100);
    let layer = RateLimitLayer::builder()
        .rule(rule.on_deny(OnDeny::Wait {
            max: Duration::from_secs(5),
            queue: 10,
        }))
        .instances(1)
        .build()
        .unwrap();
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let seen = admitted.clone();
    let app = Router::new()
        .route(
            "/",
            get(move || {
                seen.lock().unwrap().push(Instant::now());
                async { "ok" }
            }),
        )
        .layer(layer);
    let url = serve(app).await;
    let c = client();
    let calls: Vec<_> = (0..N)
        .map(|_| {
            let req = c.get(&url).send();
            tokio::spawn(async move { req.await.unwrap().status() })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), StatusCode::OK, "waited, not refused");
    }
    let mut at = admitted.lock().unwrap().clone();
    at.sort();
    assert_eq!(at.len(), N);
    // Never early: the k-th unit exists k intervals after the first (a few
    // ms of slack for the first handler's own scheduling).
    for (k, t) in at.iter().enumerate() {
        let since = t.duration_since(at[0]);
        assert!(
            since + Duration::from_millis(20) >= interval * k as u32,
            "admission {k} after {since:?}: {at:?}"
        );
    }
}

pub fn ten_per_second() -> Quota {
    Quota::new(10, Duration::from_secs(1)).with_burst(1)
}
