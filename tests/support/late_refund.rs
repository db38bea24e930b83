//! A refund that arrives after the window it was charged in has ended: a
//! request charged near a window's end is held by its handler until the
//! next window has been spent, then answers 500, which the rule's
//! `count_if` gives back. The refund is void (`outcome="refund_void"`):
//! it never credits the window that follows.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::{Router, http::StatusCode, routing::get};
use keyed_rate_limit::{RateLimitLayer, Rule};
use tokio::sync::Notify;

use super::metrics::{counter, snapshotter};
use super::{client, serve};

/// `rule` made to refund a request whose response is a 5xx.
pub fn refunding(rule: Rule) -> Rule {
    rule.count_if(|res| !res.status.is_server_error())
}

/// An offset east of UTC that puts the next midnight `ahead` from now, for
/// a calendar day that ends during the test.
pub fn midnight_in(ahead: Duration) -> i32 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let at = (now + ahead).as_secs();
    i32::try_from((86_400 - at % 86_400) % 86_400).unwrap()
}

/// Whole seconds since the epoch to a `SystemTime`.
pub fn at_secs(s: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s)
}

/// Runs the case on `layer` (one rule named `rule`, keyed by `x-key`,
/// allowing `limit` per window): the held request is charged now, and its
/// window ends at what `window_end` says once it is charged. Returns how
/// many requests the next window admitted before and after the refund.
pub async fn late_refund(
    layer: RateLimitLayer,
    rule: &str,
    window_end: impl FnOnce() -> SystemTime,
    decay: bool,
) -> (u32, u32) {
    snapshotter();
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (e, r) = (entered.clone(), release.clone());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/held",
            get(move || async move {
                e.notify_one();
                r.notified().await;
                StatusCode::INTERNAL_SERVER_ERROR
            }),
        )
        .layer(layer);
    let url = serve(app).await;
    let c = client();
    let held = {
        let (c, url) = (c.clone(), url.clone());
        tokio::spawn(async move {
            c.get(format!("{url}/held"))
                .header("x-key", "k")
                .send()
                .await
        })
    };
    entered.notified().await;
    let end = window_end();
    let wait = end.duration_since(SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(300)).await;
    let ask = || async {
        c.get(&url)
            .header("x-key", "k")
            .send()
            .await
            .unwrap()
            .status()
    };
    let mut before = 0;
    while ask().await == 200 {
        before += 1;
        assert!(before < 100, "the next window never refused");
    }
    let void = counter(
        keyed_rate_limit::observe::DECISIONS_TOTAL,
        rule,
        "refund_void",
    );
    release.notify_one();
    assert_eq!(held.await.unwrap().unwrap().status(), 500);
    // Redis refunds after the response, off the request.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while counter(
        keyed_rate_limit::observe::DECISIONS_TOTAL,
        rule,
        "refund_void",
    ) == void
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no refund_void counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A sliding window's previous count decays meanwhile: only the count.
    let after = if decay {
        0
    } else {
        u32::from(ask().await == 200)
    };
    (before, after)
}
