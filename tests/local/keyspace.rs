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

/// Reloads more often than the sweep interval do not postpone the sweep:
/// the schedule is the layer's, carried from chain to chain. Fresh keys
/// over HTTP while the rules are reloaded every 150 ms with a 300 ms
/// sweep: the keys held stay near those active within a window and a
/// sweep, and the keys gauge is set (bounded: 3 s of traffic).
#[tokio::test]
async fn reloads_do_not_postpone_the_key_sweep() {
    use std::time::{Duration, Instant};
    snapshotter();
    // 5 a second: a key asked once is whole again after 0.2 s.
    let rules = |other: u32| {
        [
            Rule::new("swept", KeyExtractor::header("x-key"), Quota::per_second(5)),
            Rule::new("edited", KeyExtractor::everyone(), Quota::per_second(other)),
        ]
    };
    let layer = RateLimitLayer::builder()
        .rules(rules(1_000))
        .cleanup_interval(Duration::from_millis(300))
        .build()
        .unwrap();
    let url = serve(ok_app(layer.clone())).await;
    let c = client();
    let (start, mut n, mut reloaded, mut most) = (Instant::now(), 0u32, Instant::now(), 0);
    while start.elapsed() < Duration::from_secs(3) {
        for _ in 0..10 {
            n += 1;
            assert_eq!(get(&c, &url, &format!("fresh-{n}")).await.status(), 200);
        }
        if reloaded.elapsed() >= Duration::from_millis(150) {
            layer.reload(rules(1_000 + n % 2)).unwrap();
            reloaded = Instant::now();
        }
        most = most.max(layer.local_keys());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Keys asked in the last 0.2 s + 0.3 s (and the sweep's own delay)
    // are all a sweep may leave: far fewer than the keys seen.
    let rate = f64::from(n) / start.elapsed().as_secs_f64();
    let bound = (rate * 1.0) as usize;
    assert!(
        most <= bound && (n as usize) > 2 * bound,
        "{most} keys held at most, {n} seen (bound {bound})"
    );
    let gauge = crate::support::metrics::gauge(keyed_rate_limit::observe::KEYS, "swept");
    assert!(gauge.is_some(), "rate_limit_keys is set by the sweeps");
}
