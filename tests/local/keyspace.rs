//! A bounded key space over HTTP: a flood of new keys can't grow memory,
//! and the policy for keys that find no place is visible to clients and
//! in the metrics.

use crate::support::metrics::{counter, snapshotter};
use crate::support::{client, header, ok_app, serve};
use keyed_rate_limit::rule::KeySpaceFull;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};

async fn get(c: &reqwest::Client, url: &str, key: &str) -> reqwest::Response {
    c.get(url).header("x-key", key).send().await.unwrap()
}

#[tokio::test]
async fn new_keys_overflow_or_are_refused_and_known_keys_keep_their_limits() {
    snapshotter();
    for (name, policy) in [
        ("ks-overflow", KeySpaceFull::Overflow),
        ("ks-refuse", KeySpaceFull::Refuse),
    ] {
        let layer = RateLimitLayer::builder()
            .rule(
                Rule::new(name, KeyExtractor::header("x-key"), Quota::per_minute(2))
                    .max_keys(3)
                    .on_key_space_full(policy),
            )
            .build()
            .unwrap();
        let url = serve(ok_app(layer.clone())).await;
        let c = client();
        for k in ["a", "b", "c"] {
            assert_eq!(get(&c, &url, k).await.status(), 200);
        }
        let mut codes = Vec::new();
        for i in 0..50 {
            let res = get(&c, &url, &format!("flood-{i}")).await;
            if res.status() == 429 {
                assert!(header(&res, "retry-after").is_some(), "{name}");
            }
            codes.push(res.status().as_u16());
        }
        match policy {
            // One shared bucket of 2 per minute for every newcomer.
            KeySpaceFull::Overflow => {
                assert_eq!(&codes[..3], [200, 200, 429]);
                assert_eq!(
                    counter("rate_limit_decisions_total", name, "key_space_overflow"),
                    50
                );
            }
            _ => {
                assert!(codes.iter().all(|&c| c == 429), "{codes:?}");
                assert_eq!(
                    header(&get(&c, &url, "late").await, "retry-after").as_deref(),
                    Some("60")
                );
                assert_eq!(
                    counter("rate_limit_decisions_total", name, "key_space_full"),
                    51
                );
            }
        }
        assert_eq!(layer.local_keys(), 3, "{name}: the flood took no place");
        // "a" still has its own second unit, then its own deny.
        assert_eq!(get(&c, &url, "a").await.status(), 200);
        assert_eq!(get(&c, &url, "a").await.status(), 429);
    }
}

#[test]
fn zero_max_keys_is_a_build_error() {
    let err = RateLimitLayer::builder()
        .rule(Rule::new("r", KeyExtractor::everyone(), Quota::per_second(1)).max_keys(0))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("max_keys"), "{err}");
}
