//! A rule of burst [`BURST`] served over HTTP, and requests of any cost
//! against it: what tests/local/cost.rs and tests/redis/cost.rs share.

use crate::support::{client, header, ok_app, serve};
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

pub const BURST: u32 = 10;

pub fn rule() -> Rule {
    Rule::new(
        "cost",
        KeyExtractor::header("x-api-key"),
        Quota::per_hour(BURST),
    )
    .cost_fn(|p| {
        p.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
}

pub async fn app(rule: Rule) -> String {
    let layer = RateLimitLayer::builder()
        .rule(rule)
        .instances(1)
        .build()
        .unwrap();
    format!("{}/", serve(ok_app(layer)).await)
}

/// (status, Retry-After, RateLimit) for one request of `cost` units.
pub async fn send(url: &str, key: &str, cost: u64) -> (u16, Option<String>, Option<String>) {
    let res = client()
        .get(url)
        .header("x-api-key", key)
        .header("x-cost", cost.to_string())
        .send()
        .await
        .unwrap();
    (
        res.status().as_u16(),
        header(&res, "retry-after"),
        header(&res, "ratelimit"),
    )
}

/// Costs past the capacity are refused without `Retry-After` and spend
/// nothing; 0 skips the rule; the burst itself fits once.
pub async fn edges(url: &str, path: &str) {
    let key = format!("key-{path}");
    for cost in [u64::from(BURST) + 1, 1 << 31, u64::from(u32::MAX)] {
        let (status, retry, _) = send(url, &key, cost).await;
        assert_eq!(status, 429, "{path}: cost {cost}");
        assert_eq!(retry, None, "{path}: waiting never helps a cost of {cost}");
    }
    let (status, _, limit) = send(url, &key, 0).await;
    assert_eq!(
        (status, limit),
        (200, None),
        "{path}: cost 0 skips the rule"
    );
    let (status, _, _) = send(url, &key, u64::from(BURST)).await;
    assert_eq!(status, 200, "{path}: the refused costs spent nothing");
    let (status, retry, _) = send(url, &key, 1).await;
    assert_eq!(status, 429, "{path}: the burst is spent");
    assert!(retry.is_some(), "{path}: one unit comes back");
}
